"""Reliability under faults: killed training, interrupted registration, bad retrains, REST under load.

(1) ``uamt.models.api.train`` killed with SIGKILL mid-epoch leaves no folder that loads as a model
    (the previous model, if any, stays byte-identical), and the next run cleans up and succeeds.
(3) A registration interrupted between logging the version and the alias switch leaves the old
    champion in place; the next registration marks the leftover version ``orphaned``.
(5) A model retrained on corrupted annotations (shuffled scores) is worse on the fixed test set
    and is not promoted; the version is tagged with the failed check.
(6) The REST server under 50 concurrent clients for 30 s (some sending bad requests): no 5xx,
    bad requests get 4xx, flat memory.  Marked slow.

Faults (2) and (4) (Prefect retries, concurrent retrains) live in the flow tests.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mlflow
from tests import fakes
from uamt.core.errors import UamtError
from uamt.models import FeatureSource, TrainConfig, load, train
from uamt.models.api import MANIFEST
from uamt.registry import store as registry
from uamt.registry.store import Gates

TESTS = Path(__file__).resolve().parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


# =============================================================================== (1) killed training
_embed = fakes.make_embed(2)
SYNTH_FEATURES = FeatureSource(_embed, encoder_id="fake-encoder-faults")


def synthetic_table(n: int, seed: int) -> pd.DataFrame:
    return fakes.synthetic_table(n, seed, embed=_embed)


QUICK = TrainConfig(hidden_sizes=(16,), max_epochs=2, batch_size=16, patience=2)
#: Enough epochs that a child process is still training when it is killed.
ENDLESS = QUICK.replace(max_epochs=10_000, patience=10_000)


def child_train(out_dir: str) -> None:
    """Run in a subprocess: train (practically) forever into ``out_dir`` until killed."""
    import torch

    torch.set_num_threads(1)
    train("hts", ENDLESS, synthetic_table(400, 1), synthetic_table(64, 2), SYNTH_FEATURES, out_dir)


def _start_and_kill_mid_epoch(out_dir: Path) -> Path:
    """Start ``child_train``; SIGKILL it once an epoch checkpoint exists (so training is under way)."""
    code = f"from test_reliability_faults import child_train; child_train({str(out_dir)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    temp = None
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"training child exited early with {proc.returncode}"
            temps = list(out_dir.parent.glob(f".{out_dir.name}.tmp-{proc.pid}-*"))
            if temps and list(temps[0].rglob("*.ckpt")):
                temp = temps[0]
                break
            time.sleep(0.1)
        else:
            raise AssertionError("training never reached its first checkpoint")
        time.sleep(0.3)  # into the next epoch
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return temp


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_training_killed_mid_epoch_leaves_no_valid_model_and_restarts_cleanly(tmp_path):
    out = tmp_path / "models" / "hts"
    temp = _start_and_kill_mid_epoch(out)
    # Nothing at the model path; the killed run's temp folder is not a model either.
    assert not out.exists()
    with pytest.raises(UamtError, match=r"hts: not a trained model \(no model\.json"):
        load(out)
    assert temp.is_dir() and not (temp / MANIFEST).exists()
    with pytest.raises(UamtError, match="not a trained model"):
        load(temp)

    # Re-running restarts cleanly: the killed run's leftovers are removed, the model is valid.
    train("hts", QUICK, synthetic_table(400, 1), synthetic_table(64, 2), SYNTH_FEATURES, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["hts"]
    pred = load(out).predict(synthetic_table(20, 3), SYNTH_FEATURES)
    assert len(pred) == 20 and np.isfinite(pred[["mu", "sigma"]].to_numpy()).all()

    # A retrain killed mid-epoch leaves the previous model byte-identical and loadable.
    before = _digest(out)
    _start_and_kill_mid_epoch(out)
    assert _digest(out) == before
    assert load(out).method == "hts"


# =============================================================================== (3) interrupted registration
GOOD = {"ece": 0.01, "crps": 1.0, "pps": 0.30, "low_score_coverage": 0.8, "dev_ece": 0.01}
BETTER = {"ece": 0.01, "crps": 0.9, "pps": 0.35, "low_score_coverage": 0.8, "dev_ece": 0.01}


@pytest.fixture
def _register(register_constant):
    return functools.partial(register_constant, name="uamt-faults")


CHILD_REGISTER = """
import os, signal, functools
import pandas as pd
import mlflow
from uamt.registry import store as registry

class ConstantModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return pd.DataFrame({{"mu": [0.0] * len(model_input)}})

mlflow.pyfunc.log_model = functools.partial(mlflow.pyfunc.log_model, pip_requirements=["mlflow"])
version = registry.register_candidate(
    {uri!r}, "uamt-faults", run_name="register", python_model=ConstantModel(), artifacts={{}},
    signature=None, test_metrics={metrics!r}, tags={{"method": "hts"}},
)
print(version, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # dies between logging the version and the gate / alias switch
"""


@pytest.fixture
def store(project_store, monkeypatch):
    """The project's default store in tmp_path, models logged without resolving pip requirements."""
    monkeypatch.setattr(
        mlflow.pyfunc, "log_model", functools.partial(mlflow.pyfunc.log_model, pip_requirements=["mlflow"])
    )
    return project_store


def _status(client, version: str, name: str = "uamt-faults") -> str:
    return client.get_model_version(name=name, version=version).tags[registry.STATUS_TAG]


def _champion(client, name: str = "uamt-faults") -> str:
    return str(client.get_model_version_by_alias(name, registry.CHAMPION).version)


def test_registration_killed_before_gate_keeps_champion_and_marks_orphan(store, tmp_path, _register):
    client = registry._client(store)
    v1 = _register(store, GOOD)
    assert registry.gate_and_alias(client, "uamt-faults", v1, GOOD, Gates()).promote

    # The child imports only mlflow and uamt.registry.store (not torch): it logs, registers, then dies.
    code = CHILD_REGISTER.format(uri=store, metrics=BETTER)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    v2 = proc.stdout.split()[-1]
    assert _champion(client) == v1 and _status(client, v2) == "pending"

    v3 = _register(store, BETTER)  # the next registration (the register stage's order)
    assert registry.mark_orphans(client, "uamt-faults", keep_version=v3) == [v2]
    tags = client.get_model_version(name="uamt-faults", version=v2).tags
    assert tags[registry.STATUS_TAG] == "orphaned" and "interrupted" in tags[registry.REASON_TAG]
    assert registry.gate_and_alias(client, "uamt-faults", v3, BETTER, Gates()).promote
    assert _champion(client) == v3


class _FailingClient:
    """An MlflowClient whose ``fail`` call raises, as a process dying at that write would stop."""

    def __init__(self, client, fail):
        self._client, self._fail = client, fail

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self._fail(name, args):
                raise KeyboardInterrupt(f"interrupted at {name}{args}")
            return attr(*args, **kwargs)

        return call


def test_registration_interrupted_at_the_alias_switch_keeps_champion(store, _register):
    client = registry._client(store)
    v1 = _register(store, GOOD)
    registry.gate_and_alias(client, "uamt-faults", v1, GOOD, Gates())
    v2 = _register(store, BETTER)
    broken = _FailingClient(client, lambda name, args: name == "set_registered_model_alias")
    with pytest.raises(KeyboardInterrupt):
        registry.gate_and_alias(broken, "uamt-faults", v2, BETTER, Gates())
    # Not "passed" without being champion: still pending, so the next run marks it.
    assert _champion(client) == v1 and _status(client, v2) == "pending"
    assert "replaced_by" not in client.get_model_version(name="uamt-faults", version=v1).tags
    v3 = _register(store, BETTER)
    assert registry.mark_orphans(client, "uamt-faults", keep_version=v3) == [v2]
    assert _status(client, v2) == "orphaned"


def test_registration_interrupted_right_after_the_switch_is_repaired_not_orphaned(store, _register):
    client = registry._client(store)
    v1 = _register(store, GOOD)
    registry.gate_and_alias(client, "uamt-faults", v1, GOOD, Gates())
    v2 = _register(store, BETTER)
    broken = _FailingClient(client, lambda name, args: name == "set_model_version_tag" and "passed" in args)
    with pytest.raises(KeyboardInterrupt):
        registry.gate_and_alias(broken, "uamt-faults", v2, BETTER, Gates())
    assert _champion(client) == v2  # the commit point was reached
    v3 = _register(store, BETTER)
    assert registry.mark_orphans(client, "uamt-faults", keep_version=v3) == []
    assert _status(client, v2) == "passed"


# =============================================================================== (5) corrupted retrain
def _char_ngram_features(texts):
    """Fixed, content-based features: hashed character 3-grams and words, L2-normalised, [n, 2, 64].

    Not a neural encoder, but texts that share n-grams get close vectors, so ``|mt - ref|`` and
    ``mt * ref`` carry the lexical overlap that predicts HTER.
    """
    out = np.zeros((len(texts), 2, 64), np.float32)
    for i, text in enumerate(texts):
        padded = f"  {text.lower()}  "
        for k in range(len(padded) - 2):
            out[i, 0, zlib.crc32(padded[k : k + 3].encode()) % 64] += 1.0
        for word in text.lower().split():
            out[i, 1, zlib.crc32(word.encode()) % 64] += 1.0
    norms = np.linalg.norm(out, axis=2, keepdims=True)
    return out / np.maximum(norms, 1e-6)


NGRAM_FEATURES = FeatureSource(_char_ngram_features, encoder_id="char-ngram-hash-64")


def _test_metrics(model_dir: Path, dev: pd.DataFrame, test: pd.DataFrame) -> dict[str, float]:
    """Calibrate on dev, evaluate on the fixed test rows (as the evaluate stage does)."""
    from uamt.uncertainty import evaluate_predictions

    model = load(model_dir)

    def table(df):
        pred = model.predict(df, NGRAM_FEATURES)
        return pd.DataFrame(
            {"lp": df["lp"].to_numpy(), "human": df["score"].to_numpy(), **pred[["mu", "sigma"]]}
        )

    result = evaluate_predictions(table(test), table(dev))
    avg = result["methods"]["model"]["macro_avg"]
    dev_result = evaluate_predictions(table(dev), table(dev))
    return {
        **{k: avg[k] for k in ("ece", "crps", "pps")},
        "dev_ece": dev_result["methods"]["model"]["macro_avg"]["ece"],
    }


def test_retrain_on_shuffled_annotations_is_not_promoted(store, mirror_root, tmp_path, _register):
    from uamt.data.loaders import load_qt21_hter

    rows = load_qt21_hter(mirror_root, files=[("smt", "en-de")]).reset_index(drop=True)
    order = np.random.default_rng(7).permutation(len(rows))
    rows = rows.iloc[order].reset_index(drop=True)
    train_df, dev_df, test_df = rows.iloc[:600], rows.iloc[600:800], rows.iloc[800:]
    shuffled = train_df.assign(score=np.random.default_rng(11).permutation(train_df["score"].to_numpy()))

    cfg = TrainConfig(hidden_sizes=(32,), max_epochs=10, patience=3, batch_size=32, learning_rate=1e-3)
    real_dir = train("hts", cfg, train_df, dev_df, NGRAM_FEATURES, tmp_path / "real")
    bad_dir = train("hts", cfg, shuffled, dev_df, NGRAM_FEATURES, tmp_path / "shuffled")
    real, bad = _test_metrics(real_dir, dev_df, test_df), _test_metrics(bad_dir, dev_df, test_df)
    print(f"fixed test set (HTER en-de smt, {len(test_df)} rows): real {real}; shuffled {bad}")
    assert real["pps"] > 0.3 > bad["pps"], (real, bad)  # the features carry signal; shuffling kills it

    # params.yaml register.gates defaults; HTER has no "bad segment" threshold (MQM <= -5)
    gates = Gates(low_score_coverage_tolerance=None, reference_low_score_coverage_tolerance=None)
    client = registry._client(store)
    v_real = _register(store, real)
    assert registry.gate_and_alias(client, "uamt-faults", v_real, real, gates).promote, real
    v_bad = _register(store, bad)
    decision = registry.gate_and_alias(client, "uamt-faults", v_bad, bad, gates)
    assert not decision.promote
    assert _champion(client) == v_real
    tags = client.get_model_version(name="uamt-faults", version=v_bad).tags
    assert tags[registry.STATUS_TAG] == "rejected"
    assert re.search(r"PPS -?\d\.\d{4} worse than champion", tags[registry.REASON_TAG]), tags
    assert json.loads(tags["gate_checks"])["champion_pps"] == pytest.approx(real["pps"])


# =============================================================================== (6) REST soak
SOAK_S = 30.0
CLIENTS = 50
GOOD_RECORDS = [
    {"src": "Der Hund schläft.", "mt": "The dog sleeps.", "ref": "The dog is sleeping."},
    {"src": "Das Wetter ist schön.", "mt": "The weather is nice.", "ref": "The weather is beautiful."},
    {"src": "Ich habe Zeit.", "mt": "I have time.", "ref": "I have got time."},
]
BAD_REQUESTS = [
    (b'{"dataframe_records": [', "application/json"),  # malformed JSON
    (json.dumps({"dataframe_records": [{"src": "a", "ref": "b"}]}).encode(), "application/json"),
    (json.dumps({"dataframe_records": []}).encode(), "application/json"),
    (json.dumps({"dataframe_records": [{"src": "a", "mt": 1, "ref": "b"}]}).encode(), "application/json"),
    (json.dumps({"inputs": [{"src": "a", "mt": "b" * 5000, "ref": "c"}]}).encode(), "application/json"),
    (b"src=a&mt=b", "application/x-www-form-urlencoded"),
]


def _start_server(store: str, log_path: Path) -> tuple[subprocess.Popen, int]:
    code = "import sys; from uamt.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["serve", "--model", "models:/uamt-test@champion", "--port", "0", "--max-chars", "2000"]
    env = {**_env(), "MLFLOW_TRACKING_URI": store}
    with open(log_path, "wb") as log:  # a file, not a pipe: the access log must never block the server
        proc = subprocess.Popen([sys.executable, "-c", code, *argv], env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        match = re.search(r"on http://127\.0\.0\.1:(\d+)", log_path.read_text(errors="replace"))
        if match:
            return proc, int(match.group(1))
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {log_path.read_text()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server did not start")


@pytest.mark.slow
def test_rest_server_soak_50_clients_30s(tmp_path):
    import psutil
    from test_scoring_support import build_store

    store = build_store(tmp_path)
    proc, port = _start_server(store, tmp_path / "server.log")
    server = psutil.Process(proc.pid)
    results: dict[str, list] = {"good": [], "bad": [], "errors": []}
    lock = threading.Lock()
    rss: list[tuple[float, int]] = []
    start = time.monotonic()
    deadline = start + SOAK_S

    def client(k: int) -> None:
        rng = np.random.default_rng(k)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        n = 0
        while time.monotonic() < deadline:
            n += 1
            bad = (k + n) % 5 == 0
            if bad:
                data, ctype = BAD_REQUESTS[int(rng.integers(len(BAD_REQUESTS)))]
            else:
                batch = [GOOD_RECORDS[int(i)] for i in rng.integers(0, 3, size=int(rng.integers(1, 5)))]
                data, ctype = json.dumps({"dataframe_records": batch}).encode(), "application/json"
            try:
                conn.request("POST", "/invocations", body=data, headers={"Content-Type": ctype})
                response = conn.getresponse()
                payload = response.read()
                status = response.status
                if not bad and status == 200:
                    assert len(json.loads(payload)["predictions"]) == len(batch)
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    results["errors"].append(f"{'bad' if bad else 'good'}: {exc!r}")
                conn.close()
                continue
            with lock:
                results["bad" if bad else "good"].append(status)
        conn.close()

    def sample() -> None:
        while time.monotonic() < deadline:
            rss.append((time.monotonic() - start, server.memory_info().rss))
            time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    threads.append(threading.Thread(target=sample))
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=SOAK_S + 60)
        assert proc.poll() is None, "the server died under load"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    good, bad = np.array(results["good"]), np.array(results["bad"])
    assert not results["errors"], results["errors"][:5]
    assert len(good) > 5 * CLIENTS and len(bad) > CLIENTS, (len(good), len(bad))
    assert (good == 200).all(), np.unique(good, return_counts=True)
    assert ((bad >= 400) & (bad < 500)).all(), np.unique(bad, return_counts=True)
    first = [r for t, r in rss if t < 10.0]
    last = [r for t, r in rss if t >= SOAK_S - 10.0]
    growth_mb = (np.median(last) - np.median(first)) / 2**20
    print(
        f"soak: {len(good)} good + {len(bad)} bad requests in {SOAK_S:.0f} s from {CLIENTS} clients; "
        f"server RSS {np.median(first) / 2**20:.1f} -> {np.median(last) / 2**20:.1f} MiB "
        f"(growth {growth_mb:+.1f} MiB)"
    )
    assert growth_mb < 50, growth_mb
