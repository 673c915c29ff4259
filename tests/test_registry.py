"""The registry's promise: every candidate registered, champion moved only after the gates pass."""

from __future__ import annotations

import json
import math

import pytest

from uamt.registry import store as registry
from uamt.registry.store import Gates, promotion_decision

# Candidate metrics as the register stage builds them (uamt.registry.register.gate_metrics): test-split
# ECE, CRPS, PPS, bad-segment coverage, and the dev-split ECE.
BASE = {"ece": 0.01, "crps": 1.0, "pps": 0.3, "low_score_coverage": 0.8, "dev_ece": 0.01}


def test_first_version_passing_dev_ece_becomes_champion():
    decision = promotion_decision(BASE, None, Gates(max_dev_ece=0.05))
    assert decision.promote and "first version" in decision.reason


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"dev_ece": 0.2}, "dev ECE 0.2000 > max_dev_ece 0.0500"),
        ({"crps": 1.5}, "CRPS 1.5000 worse than champion v3 1.0000 + 0.02"),
        ({"pps": 0.1}, "PPS 0.1000 worse than champion v3 0.3000 - 0.01"),
        ({"ece": 0.05}, "ECE 0.0500 worse than champion v3 0.0100 + 0.01"),
        ({"low_score_coverage": 0.7}, "bad-segment coverage 0.7000 worse than champion v3 0.8000 - 0.02"),
        ({"ece": math.nan}, "candidate metric ece=nan is missing or not finite"),
        ({"dev_ece": None}, "candidate metric dev_ece=None is missing or not finite"),
    ],
)
def test_gate_rejects_with_reason(change, needle):
    champion = {k: v for k, v in BASE.items() if k != "dev_ece"}
    decision = promotion_decision({**BASE, **change}, champion, Gates(max_dev_ece=0.05), champion_version="3")
    assert not decision.promote
    assert needle in decision.reason


def test_test_ece_has_no_absolute_ceiling():
    """The test ECE is only compared with the baselines' test ECE: a ceiling on it would be a number
    chosen after seeing test results.  A candidate as well calibrated as the champion passes at any
    ECE level; the absolute ceiling applies to the dev ECE."""
    champion = {**BASE, "ece": 0.3}
    assert promotion_decision({**BASE, "ece": 0.305}, champion, Gates()).promote
    assert not promotion_decision({**BASE, "ece": 0.305, "dev_ece": 0.3}, champion, Gates()).promote


def test_within_tolerance_is_promoted():
    champion = {"ece": 0.01, "crps": 1.0, "pps": 0.3, "low_score_coverage": 0.8}
    decision = promotion_decision(
        {**BASE, "ece": 0.02, "crps": 1.01, "pps": 0.295, "low_score_coverage": 0.79}, champion, Gates()
    )
    assert decision.promote


def test_a_baseline_without_a_metric_is_named_not_compared():
    """A champion registered before a metric was gated cannot be compared on it: the decision says so
    (``not_compared``) and the other comparisons still apply."""
    champion = {"ece": 0.01, "crps": 1.0, "pps": 0.3}
    decision = promotion_decision(BASE, champion, Gates(), champion_version="1")
    assert decision.promote
    assert decision.checks["not_compared"] == ["low_score_coverage (champion v1 has none)"]


@pytest.mark.parametrize(
    ("field", "value"), [("crps_tolerance", math.nan), ("reference_pps_tolerance", -0.01), ("max_dev_ece", math.inf)]
)
def test_gate_settings_must_be_finite_and_not_negative(field, value):
    with pytest.raises(ValueError, match=rf"register\.gates\.{field}={value!r} must be a finite number >= 0"):
        Gates(**{field: value})


def test_champion_moves_only_after_gate(project_store, register_constant):
    client = registry._client(project_store)
    v1 = register_constant(project_store, BASE)
    assert client.get_model_version(name="uamt-test", version=v1).tags[registry.STATUS_TAG] == "pending"
    assert registry.gate_and_alias(
        client, "uamt-test", v1, BASE, Gates()
    ).promote
    assert str(client.get_model_version_by_alias("uamt-test", "champion").version) == v1

    worse = {**BASE, "crps": 2.0, "pps": 0.10}
    v2 = register_constant(project_store, worse)
    decision = registry.gate_and_alias(client, "uamt-test", v2, worse, Gates())
    assert not decision.promote
    assert str(client.get_model_version_by_alias("uamt-test", "champion").version) == v1
    assert str(client.get_model_version_by_alias("uamt-test", "challenger").version) == v2
    tags = client.get_model_version(name="uamt-test", version=v2).tags
    assert tags[registry.STATUS_TAG] == "rejected" and "CRPS" in tags[registry.REASON_TAG]


def test_interrupted_registration_leaves_champion_and_marks_orphan(project_store, register_constant):
    client = registry._client(project_store)
    v1 = register_constant(project_store, BASE)
    registry.gate_and_alias(client, "uamt-test", v1, BASE, Gates())
    v2 = register_constant(
        project_store, {**BASE, "crps": 0.9, "pps": 0.35}
    )  # "crash": the gate never runs
    assert str(client.get_model_version_by_alias("uamt-test", "champion").version) == v1
    v3 = register_constant(project_store, {**BASE, "crps": 0.9, "pps": 0.35})
    assert registry.mark_orphans(client, "uamt-test", keep_version=v3) == [v2]
    assert client.get_model_version(name="uamt-test", version=v2).tags[registry.STATUS_TAG] == "orphaned"
    rows = registry.describe(project_store, "uamt-test")
    assert [r["version"] for r in rows] == [v3, v2, v1]
    assert rows[-1]["aliases"] == "champion,reference"


# The reference-based champion of the pipeline (hts on the news MQM test set), and the QE one.
HTS_V1 = {"ece": 0.0652, "crps": 1.4694, "pps": 0.3656, "low_score_coverage": 0.7293, "dev_ece": 0.0568}
QE_V1 = {"ece": 0.0541, "crps": 1.4803, "pps": 0.3356, "low_score_coverage": 0.7382, "dev_ece": 0.0567}


def _champion(client, name="uamt-test"):
    return str(client.get_model_version_by_alias(name, registry.CHAMPION).version)


def test_a_series_of_slightly_worse_candidates_cannot_drift_the_champion(project_store, register_constant):
    """Six candidates, each 0.0095 PPS and 0.019 CRPS worse than the last (inside the champion
    tolerances of 0.01 / 0.02), used to be promoted one after the other: PPS 0.366 -> 0.309.  The
    first champion is the reference: the second candidate is already 0.019 PPS below it, and the
    reason says that the reference, not the champion, stopped it."""
    client = registry._client(project_store)
    v1 = register_constant(project_store, HTS_V1)
    assert registry.gate_and_alias(client, "uamt-test", v1, HTS_V1, Gates()).promote
    assert str(client.get_model_version_by_alias("uamt-test", registry.REFERENCE).version) == v1
    decisions = []
    for step in range(1, 7):
        worse = {**HTS_V1, "pps": HTS_V1["pps"] - 0.0095 * step, "crps": HTS_V1["crps"] + 0.019 * step}
        version = register_constant(project_store, worse)
        decisions.append((version, registry.gate_and_alias(client, "uamt-test", version, worse, Gates())))
    assert [d.promote for _, d in decisions] == [True, False, False, False, False, False]
    v2 = decisions[0][0]
    assert _champion(client) == v2  # within 0.0095 / 0.019 of the reference: the most drift allowed
    second = decisions[1][1].reason
    assert "worse than champion" not in second  # 0.0095 below the champion: inside its tolerance
    assert f"PPS 0.3466 worse than reference v{v1} 0.3656 - 0.01" in second
    assert f"CRPS 1.5074 worse than reference v{v1} 1.4694 + 0.02" in second
    checks = json.loads(client.get_model_version(name="uamt-test", version=decisions[1][0]).tags["gate_checks"])
    assert checks["reference_version"] == v1 and checks["champion_version"] == v2
    champion_pps = float(client.get_model_version(name="uamt-test", version=_champion(client)).tags["test.pps"])
    assert champion_pps >= HTS_V1["pps"] - Gates().reference_pps_tolerance


def test_a_poisoned_retrain_that_improves_nll_is_not_promoted(project_store, register_constant):
    """A QE model retrained with thousands of training items rescored 0 (perfect) was promoted: its
    test CRPS improved (1.480 -> 1.457: most test segments are near 0, where it now puts its mass)
    and its PPS stayed inside the tolerance.  What such poison breaks is the segments rated bad:
    their coverage is gated too, against the champion and the reference."""
    client = registry._client(project_store)
    v1 = register_constant(project_store, QE_V1, name="uamt-test-qe")
    assert registry.gate_and_alias(client, "uamt-test-qe", v1, QE_V1, Gates()).promote
    poisoned = {**QE_V1, "crps": 1.457, "pps": 0.3270, "ece": 0.0500, "low_score_coverage": 0.6700}
    version = register_constant(project_store, poisoned, name="uamt-test-qe")
    decision = registry.gate_and_alias(client, "uamt-test-qe", version, poisoned, Gates())
    assert not decision.promote and _champion(client, "uamt-test-qe") == v1
    assert f"bad-segment coverage 0.6700 worse than champion v{v1} 0.7382 - 0.02" in decision.reason
    assert f"bad-segment coverage 0.6700 worse than reference v{v1} 0.7382 - 0.02" in decision.reason
    assert "CRPS" not in decision.reason and "PPS" not in decision.reason


def test_a_registry_without_the_reference_alias_adopts_its_first_champion(project_store, register_constant):
    """Registries from before the floor (or whose alias was removed): the earliest promoted version
    becomes @reference, so the floor is never missing and never moves up by itself."""
    client = registry._client(project_store)
    v1 = register_constant(project_store, HTS_V1)
    registry.gate_and_alias(client, "uamt-test", v1, HTS_V1, Gates())
    slightly_worse = {**HTS_V1, "pps": HTS_V1["pps"] - 0.0095}
    v2 = register_constant(project_store, slightly_worse)
    assert registry.gate_and_alias(client, "uamt-test", v2, slightly_worse, Gates()).promote
    client.delete_registered_model_alias("uamt-test", registry.REFERENCE)
    worse_again = {**HTS_V1, "pps": HTS_V1["pps"] - 0.019}
    v3 = register_constant(project_store, worse_again)
    decision = registry.gate_and_alias(client, "uamt-test", v3, worse_again, Gates())
    assert not decision.promote and f"worse than reference v{v1}" in decision.reason
    assert str(client.get_model_version_by_alias("uamt-test", registry.REFERENCE).version) == v1


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
        v1 = register_constant(uri, BASE)
        assert registry.gate_and_alias(
            client, "uamt-test", v1, BASE, Gates()
        ).promote
        v2 = register_constant(uri, {**BASE, "dev_ece": 0.30})
        assert not registry.gate_and_alias(
            client, "uamt-test", v2, {**BASE, "dev_ece": 0.30}, Gates()
        ).promote
        assert str(client.get_model_version_by_alias("uamt-test", "champion").version) == v1
        assert [row["status"] for row in registry.describe(uri, "uamt-test")] == ["rejected", "passed"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_gate_metrics_read_test_for_comparisons_and_dev_for_the_ceiling(tmp_path):
    """The register stage's candidate: test numbers (compared with other models' test numbers only)
    and the dev ECE (the one number under an absolute ceiling); a missing file leaves None, which
    the gate refuses."""
    from uamt.registry.register import gate_metrics

    (tmp_path / "test.json").write_text(
        json.dumps({"hts": {"avg": {"ece": 0.065, "crps": 1.47, "pps": 0.366, "n": 100}}}), encoding="utf-8"
    )
    (tmp_path / "dev.json").write_text(json.dumps({"hts": {"avg": {"ece": 0.057}}}), encoding="utf-8")
    conditional = {"hts": {"low_score_coverage": 0.73}}
    (tmp_path / "conditional.json").write_text(json.dumps(conditional), encoding="utf-8")
    candidate = gate_metrics(tmp_path, "hts")
    assert candidate == {"ece": 0.065, "crps": 1.47, "pps": 0.366, "low_score_coverage": 0.73, "dev_ece": 0.057}
    assert promotion_decision(candidate, None, Gates()).promote
    (tmp_path / "dev.json").unlink()
    candidate = gate_metrics(tmp_path, "hts")
    assert candidate["dev_ece"] is None
    assert "candidate metric dev_ece=None is missing" in promotion_decision(candidate, None, Gates()).reason
