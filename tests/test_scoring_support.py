"""A deterministic fake calibrated predictor, wrapped as a real MLflow pyfunc in a tmp SQLite registry.

Used by test_scoring*.py and test_serve*.py so that ``load_predictor`` and the whole CLI / REST
path run for real; the lead's ``uamt.serving.calibrated_predictor`` model plugs into the same path unchanged.
The fake: mu = mean over references of sentence chrF(mt, ref) / 100 (reference-based) or the
character-length ratio of mt and src (reference-free); sigma = 0.05 + 1 / (10 + len(mt)).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
from sacrebleu.metrics import CHRF

import mlflow
from uamt.registry import store as registry
from uamt.serving.predictor import ScoreScale
from uamt.uncertainty.metrics import gaussian_interval, translation_risk

REF_MODEL = "uamt-test"
QE_MODEL = "uamt-test-qe"
NO_ALIAS_MODEL = "uamt-noalias"

_CHRF = CHRF()


def fake_mu_ref(mt: str, refs: list[str]) -> float:
    """Per-reference chrF / 100 averaged over references (paper §3.4's averaging)."""
    return float(np.mean([_CHRF.sentence_score(mt, [r]).score / 100.0 for r in refs]))


def fake_mu_qe(src: str, mt: str) -> float:
    return min(len(src), len(mt)) / max(len(src), len(mt))


def fake_sigma(mt: str) -> float:
    return 0.05 + 1.0 / (10.0 + len(mt))


class FakePredictor:
    """Implements :class:`uamt.serving.predictor.Predictor` cheaply and deterministically."""

    def __init__(self, uses_references: bool = True):
        self.uses_references = uses_references
        self.method = "fake-chrf" if uses_references else "fake-length-qe"
        self.scale = ScoreScale("fake-chrF", "chrF/100 of mt vs reference (test double)", 0.3)

    def predict_frame(self, frame, *, confidence=0.9, risk_threshold=None, batch_size=64, progress=False):
        has_refs = "ref" in frame.columns or "refs" in frame.columns
        if has_refs != self.uses_references:
            raise AssertionError(f"{self.method} called with columns {list(frame.columns)}")
        if "ref" in frame.columns and "refs" in frame.columns:
            raise AssertionError("both ref and refs")
        if self.uses_references:
            refs = frame["refs"] if "refs" in frame.columns else frame["ref"].map(lambda r: [r])
            mu = np.array([fake_mu_ref(mt, list(r)) for mt, r in zip(frame["mt"], refs, strict=True)])
        else:
            mu = np.array([fake_mu_qe(s, m) for s, m in zip(frame["src"], frame["mt"], strict=True)])
        sigma = np.array([fake_sigma(m) for m in frame["mt"]])
        lower, upper = gaussian_interval(mu, sigma, confidence)
        chi = self.scale.default_risk_threshold if risk_threshold is None else risk_threshold
        return pd.DataFrame(
            {
                "mu": mu,
                "sigma": sigma,
                "lower": lower,
                "upper": upper,
                "risk": translation_risk(mu, sigma, chi),
                "epistemic_var": 0.25 * sigma**2,
                "aleatoric_var": 0.75 * sigma**2,
            }
        )


class FakePyfunc(mlflow.pyfunc.PythonModel):
    def __init__(self, predictor: FakePredictor):
        self.predictor = predictor

    def predict(self, context, model_input, params=None):
        return self.predictor.predict_frame(model_input)


def build_store(root: Path) -> str:
    """Register REF_MODEL and QE_MODEL (alias champion) and NO_ALIAS_MODEL (no alias) under ``root``."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{root / 'mlflow.db'}"
    registry.use_store(uri)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = mlflow.create_experiment("scoring-tests", artifact_location=(root / "artifacts").as_uri())
    for name, uses_refs, alias in (
        (REF_MODEL, True, "champion"),
        (QE_MODEL, False, "champion"),
        (NO_ALIAS_MODEL, True, None),
    ):
        with mlflow.start_run(experiment_id=experiment) as run:
            info = mlflow.pyfunc.log_model(
                name="model", python_model=FakePyfunc(FakePredictor(uses_refs)), pip_requirements=["mlflow"]
            )
        client.create_registered_model(name)
        version = client.create_model_version(
            name, source=info.model_uri, run_id=run.info.run_id, model_id=getattr(info, "model_id", None)
        )
        if alias:
            client.set_registered_model_alias(name, alias, str(version.version))
    return uri


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


@contextmanager
def running_server(service):
    """``uamt.serving.server`` of ``service`` on a free port of 127.0.0.1 in a thread, shut down on exit.

    Yields the uvicorn server with ``server_address`` (host, port) and ``service`` set."""
    from uamt.serving.server import make_server

    server, sock = make_server(service, "127.0.0.1", 0)
    server.server_address, server.service = sock.getsockname()[:2], service
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the test server did not start"
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
