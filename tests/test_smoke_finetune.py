"""The fine-tuning settings of docs/models.md through the whole pipeline: ``make run`` on a fresh clone
of the smoke profile with ``train_base.finetune: true`` (every model fine-tunes its encoder: the
deep ensemble's members each their own copy, DUP's M_E too), ``encode.encoder`` on runtime torch
and ``register.serving_runtime: torch``, and ``finetune_top_layers: 1``: the CPU route, where each
training process computes the lower layers' states once and trains the top block on them, while
``calibrate``, ``evaluate`` and ``uamt score`` run the whole fine-tuned encoder.  (Which parameters
the GPU route, ``finetune_top_layers: 0``, trains is checked in tests/test_models_encoder_path.py; past
the training step both routes give the same kind of model.)

The encoder is a tiny random BERT (tests.test_encoders) on the CPU: what is checked is that every
stage chains with fine-tuning on and that ``uamt score`` answers with the fine-tuned champions, not
the devices (tests/test_models_gpu.py) nor any quality.  This run found that a DUP whose M_E was
fine-tuned could not be loaded by ``calibrate``.  Measured (2026-11-27, 2 cores): ``make run`` 245 s.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
import yaml

from tests.smoke import harness
from tests.test_encoders import make_tiny_bert
from uamt.encoders import EncoderConfig, get_encoder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finetuned_smoke(tmp_path_factory, mirror_root):
    root = tmp_path_factory.mktemp("smoke-finetune")
    tiny = make_tiny_bert(root / "tiny-bert")
    extra = {
        "encode": {"encoder": {"name": "hf", "path": str(tiny), "runtime": "torch", "device": "cpu"}},
        "train_base": {"finetune": True, "finetune_top_layers": 1},
        "register": {"serving_runtime": "torch"},
    }
    clone = root / "clone"
    env = harness.prepare_clone(clone, mirror_root, extra=extra)
    code, seconds, log = harness.make_run(clone, env, root / "make-run.log")
    print(f"smoke make run with finetune: {seconds:.0f} s")
    assert code == 0, f"make run failed (exit {code}) after {seconds:.0f} s; its output ends:\n{log[-6000:]}"
    yield clone, env, log, tiny
    shutil.rmtree(root, ignore_errors=True)


def test_every_stage_runs_with_finetuned_models(finetuned_smoke):
    clone, _, log, tiny = finetuned_smoke
    base = {
        f"comet_encoder.{key}": value
        for key, value in get_encoder(EncoderConfig(name="hf", path=str(tiny))).comet_encoder.state_dict().items()
    }
    stages = yaml.safe_load((clone / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    assert sorted(re.findall(r"Running stage '([a-z_]+)'", log)) == sorted(stages)
    for name in ("hts", "hts_qe", "dup", "ensemble/members/0", "ensemble/members/1"):
        meta = json.loads((clone / "models" / name / "model.json").read_text(encoding="utf-8"))
        assert meta["config"]["finetune"] is True and meta["config"]["finetune_top_layers"] == 1, name
        state = torch.load(clone / "models" / name / "weights.pt", map_location="cpu", weights_only=True)
        moved = [key for key in base if not torch.equal(state[key], base[key])]
        top = "comet_encoder.model.encoder.layer.1."
        assert moved and all(key.startswith(top) for key in moved), f"{name}: moved outside the top block: {moved}"
    checked = log.strip().splitlines()[-2:]
    for name, line in zip(("uamt-comet", "uamt-comet-qe"), checked, strict=True):
        assert line.startswith(f"{name}: @champion is version 1 (passed: first version"), checked


@pytest.mark.parametrize(("with_refs", "model"), [(True, "uamt-comet"), (False, "uamt-comet-qe")])
def test_uamt_score_answers_with_the_finetuned_champion(finetuned_smoke, with_refs, model):
    clone, env, _, _ = finetuned_smoke
    scored = harness.score_segments(clone, env, with_refs)
    assert scored.returncode == 0, scored.stderr
    records = [json.loads(line) for line in scored.stdout.splitlines()]
    assert records[-1]["summary"]["model"] == f"models:/{model}@champion"
    for row in records[:-1]:
        assert all(math.isfinite(row[key]) for key in ("mu", "sigma", "lower", "upper", "risk")), row
