"""The registry's promise: every candidate registered, champion moved only after the gates pass."""

from __future__ import annotations

import math

import pytest

from uamt import registry
from uamt.registry import Gates, promotion_decision


def test_first_version_passing_ece_becomes_champion():
    decision = promotion_decision({"ece": 0.01, "nll": 1.0, "pps": 0.3}, None, Gates(max_ece=0.05))
    assert decision.promote and "first version" in decision.reason


@pytest.mark.parametrize(
    ("candidate", "needle"),
    [
        ({"ece": 0.2, "nll": 1.0, "pps": 0.3}, "ECE 0.2000 > max_ece"),
        ({"ece": 0.01, "nll": 1.5, "pps": 0.3}, "NLL 1.5000 worse than champion"),
        ({"ece": 0.01, "nll": 1.0, "pps": 0.1}, "PPS 0.1000 worse than champion"),
        ({"ece": math.nan, "nll": 1.0, "pps": 0.3}, "not finite"),
    ],
)
def test_gate_rejects_with_reason(candidate, needle):
    champion = {"ece": 0.01, "nll": 1.0, "pps": 0.3}
    decision = promotion_decision(
        candidate, champion, Gates(max_ece=0.05, nll_tolerance=0.02, pps_tolerance=0.01)
    )
    assert not decision.promote
    assert needle in decision.reason


def test_within_tolerance_is_promoted():
    champion = {"ece": 0.01, "nll": 1.0, "pps": 0.3}
    decision = promotion_decision({"ece": 0.02, "nll": 1.01, "pps": 0.295}, champion, Gates())
    assert decision.promote


def test_champion_moves_only_after_gate(project_store, register_constant):
    client = registry._client(project_store)
    v1 = register_constant(project_store, {"ece": 0.01, "nll": 1.0, "pps": 0.30})
    assert client.get_model_version(name="uamt-test", version=v1).tags[registry.STATUS_TAG] == "pending"
    assert registry.gate_and_alias(
        client, "uamt-test", v1, {"ece": 0.01, "nll": 1.0, "pps": 0.30}, Gates()
    ).promote
    assert str(client.get_model_version_by_alias("uamt-test", "champion").version) == v1

    worse = {"ece": 0.01, "nll": 2.0, "pps": 0.10}
    v2 = register_constant(project_store, worse)
    decision = registry.gate_and_alias(client, "uamt-test", v2, worse, Gates())
    assert not decision.promote
    assert str(client.get_model_version_by_alias("uamt-test", "champion").version) == v1
    assert str(client.get_model_version_by_alias("uamt-test", "challenger").version) == v2
    tags = client.get_model_version(name="uamt-test", version=v2).tags
    assert tags[registry.STATUS_TAG] == "rejected" and "NLL" in tags[registry.REASON_TAG]


def test_interrupted_registration_leaves_champion_and_marks_orphan(project_store, register_constant):
    client = registry._client(project_store)
    v1 = register_constant(project_store, {"ece": 0.01, "nll": 1.0, "pps": 0.30})
    registry.gate_and_alias(client, "uamt-test", v1, {"ece": 0.01, "nll": 1.0, "pps": 0.30}, Gates())
    v2 = register_constant(
        project_store, {"ece": 0.01, "nll": 0.9, "pps": 0.35}
    )  # "crash": the gate never runs
    assert str(client.get_model_version_by_alias("uamt-test", "champion").version) == v1
    v3 = register_constant(project_store, {"ece": 0.01, "nll": 0.9, "pps": 0.35})
    assert registry.mark_orphans(client, "uamt-test", keep_version=v3) == [v2]
    assert client.get_model_version(name="uamt-test", version=v2).tags[registry.STATUS_TAG] == "orphaned"
    rows = registry.describe(project_store, "uamt-test")
    assert [r["version"] for r in rows] == [v3, v2, v1]
    assert rows[-1]["aliases"] == "champion"


@pytest.mark.slow
def test_registry_promise_holds_against_a_real_mlflow_server(tmp_path, monkeypatch, register_constant):
    """The same registration and gate through `mlflow server` on loopback (any MLFLOW_TRACKING_URI works)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError("mlflow server did not start") from None
                time.sleep(1)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.chdir(tmp_path)
        assert registry.tracking_uri() == uri
        client = registry._client(uri)
        v1 = register_constant(uri, {"ece": 0.01, "nll": 1.0, "pps": 0.30})
        assert registry.gate_and_alias(
            client, "uamt-test", v1, {"ece": 0.01, "nll": 1.0, "pps": 0.30}, Gates()
        ).promote
        v2 = register_constant(uri, {"ece": 0.30, "nll": 1.0, "pps": 0.30})
        assert not registry.gate_and_alias(
            client, "uamt-test", v2, {"ece": 0.30, "nll": 1.0, "pps": 0.30}, Gates()
        ).promote
        assert str(client.get_model_version_by_alias("uamt-test", "champion").version) == v1
        assert [row["status"] for row in registry.describe(uri, "uamt-test")] == ["rejected", "passed"]
    finally:
        server.terminate()
        server.wait(timeout=30)
