"""Hypothesis generation (uamt.hypotheses, `uamt hypotheses generate`) with a tiny random Marian model.

The model is built here, offline: a sentencepiece model trained on a few dozen synthetic
sentences, a MarianTokenizer over it and a randomly initialised 1-layer MarianMTModel (d_model 16).
Its translations are gibberish; the tests check the mechanics, not quality.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

from uamt import hypotheses, lexical  # noqa: E402
from uamt.cli import main  # noqa: E402
from uamt.core.errors import DataError, UamtError  # noqa: E402

# The tiny model's ops are microseconds long; thread hand-off would cost more than the work.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = "the a cat dog sat ran on under mat house big small red blue quick slow fox jumps over lazy river tree bird sings".split()
SOURCES = [
    "the cat sat on the mat",
    "a quick brown fox",
    "the dog ran under the big tree",
    "blue bird sings",
    "a lazy river",
    "small red house on the hill",
    "the fox jumps over the lazy dog",
]


def build_tiny_marian(folder: Path, seed: int = 0) -> Path:
    """A random Marian model + tokenizer saved in ``folder`` (about a second after imports)."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(60)]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=proto,
        vocab_size=48,
        model_type="unigram",
        character_coverage=1.0,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        minloglevel=2,
        num_threads=1,
    )
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(proto.getvalue())
    processor = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(processor.get_piece_size()):
        vocab.setdefault(processor.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    MarianTokenizer(
        source_spm=str(folder / "source.spm"),
        target_spm=str(folder / "target.spm"),
        vocab=str(folder / "vocab.json"),
    ).save_pretrained(folder)
    config = MarianConfig(
        vocab_size=len(vocab),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=vocab["<pad>"],
        eos_token_id=0,
        decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=0,
        bad_words_ids=[[vocab["<pad>"]]],
        dropout=0.1,
        init_std=0.5,  # large random weights: outputs depend on the source and on the dropout mask
        max_length=24,
        num_beams=1,
    )
    torch.manual_seed(seed)
    MarianMTModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_marian(tmp_path_factory.mktemp("tiny-marian"))


@pytest.fixture()
def source(tmp_path) -> Path:
    path = tmp_path / "src.txt"
    path.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    return path


def cfg(**kwargs) -> hypotheses.GenerationConfig:
    base = {
        "n": 4,
        "batch_size": 3,
        "max_new_tokens": 8,
        "seed": 0,
    }  # batch 3 over 7 lines: a ragged last batch
    return hypotheses.GenerationConfig(**{**base, **kwargs})


def generate_argv(model: Path, source: Path, *options: str) -> list[str]:
    """``uamt hypotheses generate`` on ``model`` and ``source`` without a progress bar, plus ``options``."""
    return ["hypotheses", "generate", "--model", str(model), "-s", str(source), "--no-progress", *options]


def read(folder: Path, name: str) -> list[str]:
    return lexical.read_lines(folder / name) if (folder / name).stat().st_size else []


def hyp_files(folder: Path) -> list[list[str]]:
    manifest = json.loads((folder / "manifest.json").read_text())
    return [(folder / h["file"]).read_text(encoding="utf-8").split("\n")[:-1] for h in manifest["hypotheses"]]


# --------------------------------------------------------------------------- mechanics


def test_mc_dropout_passes_differ_and_stay_aligned(tiny_model, source, tmp_path):
    out = tmp_path / "hyps"
    manifest = hypotheses.generate(
        [str(tiny_model)], source, out, cfg(method="mc-dropout", dropout=0.3), progress=False
    )
    top = (out / "top.txt").read_text(encoding="utf-8").split("\n")[:-1]
    streams = hyp_files(out)
    assert len(top) == len(SOURCES) and [len(s) for s in streams] == [len(SOURCES)] * 4
    assert sorted(p.name for p in out.glob("hyp.*.txt")) == [f"hyp.{k}.txt" for k in range(1, 5)]
    # passes differ from each other and from the deterministic output
    assert len({tuple(s) for s in streams}) == 4
    assert all(s != top for s in streams)
    assert manifest["method"] == "mc-dropout" and manifest["n"] == 4 and manifest["dropout"] == 0.3
    assert [h["pass"] for h in manifest["hypotheses"]] == [1, 2, 3, 4]
    assert manifest["timings"]["ms_per_segment_per_hypothesis"] > 0
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_top_output_is_deterministic_and_dropout_is_restored(tiny_model):
    model, tokenizer = hypotheses.load_model(str(tiny_model))
    first = hypotheses.top_outputs(model, tokenizer, SOURCES, cfg())
    with hypotheses.mc_dropout(model, 0.3) as switched:
        assert switched > 0
        noisy = hypotheses.decode(model, tokenizer, SOURCES, batch_size=3, seed=1, max_new_tokens=8)
    assert not any(m.training for m in model.modules())
    assert hypotheses.top_outputs(model, tokenizer, SOURCES, cfg()) == first
    assert [o[0] for o in noisy] != first


def test_runs_are_reproducible_and_seed_dependent(tiny_model, source, tmp_path):
    for method in ("mc-dropout", "sample"):
        a = tmp_path / f"{method}-a"
        b = tmp_path / f"{method}-b"
        c = tmp_path / f"{method}-c"
        hypotheses.generate([str(tiny_model)], source, a, cfg(method=method, n=3), progress=False)
        hypotheses.generate([str(tiny_model)], source, b, cfg(method=method, n=3), progress=False)
        hypotheses.generate([str(tiny_model)], source, c, cfg(method=method, n=3, seed=7), progress=False)
        assert hyp_files(a) == hyp_files(b), method
        assert hyp_files(a) != hyp_files(c), method


def test_beam_returns_n_distinct_ranked_beams(tiny_model, source, tmp_path):
    out = tmp_path / "beam"
    hypotheses.generate([str(tiny_model)], source, out, cfg(method="beam", n=4), progress=False)
    streams = hyp_files(out)
    assert len(streams) == 4
    for i in range(len(SOURCES)):
        beams = [s[i] for s in streams]
        assert len(set(beams)) == 4, beams
    # rank 1 is the best beam of the same search
    model, tokenizer = hypotheses.load_model(str(tiny_model))
    best = hypotheses.decode(
        model, tokenizer, SOURCES, batch_size=3, num_beams=4, max_new_tokens=8, do_sample=False
    )
    assert streams[0] == [b[0] for b in best]
    # and the ranks are in decreasing beam score
    encoded = tokenizer(SOURCES[:1], return_tensors="pt", padding=True)
    scored = model.generate(
        **encoded,
        num_beams=4,
        num_return_sequences=4,
        max_new_tokens=8,
        output_scores=True,
        return_dict_in_generate=True,
    )
    assert np.all(np.diff(scored.sequences_scores.numpy()) <= 1e-6)
    assert tokenizer.batch_decode(scored.sequences, skip_special_tokens=True) == [s[0] for s in streams]


def test_diverse_beam_penalty_forces_distinct_groups(tiny_model):
    model, tokenizer = hypotheses.load_model(str(tiny_model))
    greedy = hypotheses.top_outputs(model, tokenizer, SOURCES, cfg())
    # penalty 0: every one-beam group is plain greedy search
    plain = hypotheses.hypotheses_for_model(
        model, tokenizer, SOURCES, cfg(method="diverse-beam", n=3, diversity_penalty=0.0)
    )
    assert all(stream == greedy for stream in plain)
    # a huge penalty: groups may never pick the same token at the same step, so the outputs of
    # the three groups differ for every segment
    diverse = hypotheses.hypotheses_for_model(
        model, tokenizer, SOURCES, cfg(method="diverse-beam", n=3, diversity_penalty=1e4)
    )
    assert diverse[0] == greedy  # group 1 has no earlier group to differ from
    for i in range(len(SOURCES)):
        outputs = [stream[i] for stream in diverse]
        assert len(set(outputs)) == 3, outputs
    # two beams per group: 2 groups x 2 beams = 4 hypotheses
    two = hypotheses.hypotheses_for_model(
        model, tokenizer, SOURCES, cfg(method="diverse-beam", n=4, num_beam_groups=2)
    )
    assert len(two) == 4 and all(len(s) == len(SOURCES) for s in two)


def test_sample_gives_n_varied_hypotheses(tiny_model, source, tmp_path):
    out = tmp_path / "sample"
    hypotheses.generate([str(tiny_model)], source, out, cfg(method="sample", n=5, top_p=0.95), progress=False)
    streams = hyp_files(out)
    assert len(streams) == 5
    assert len({tuple(s) for s in streams}) > 1


def test_ensemble_numbers_files_consecutively(tiny_model, tmp_path, source):
    second = build_tiny_marian(tmp_path / "second", seed=1)
    out = tmp_path / "ens"
    manifest = hypotheses.generate(
        [str(tiny_model), str(second)], source, out, cfg(method="beam", n=2), progress=False
    )
    assert [h["file"] for h in manifest["hypotheses"]] == ["hyp.1.txt", "hyp.2.txt", "hyp.3.txt", "hyp.4.txt"]
    assert [h["model"] for h in manifest["hypotheses"]] == [str(tiny_model)] * 2 + [str(second)] * 2
    streams = hyp_files(out)
    assert streams[0] != streams[2]  # different weights, different translations


# --------------------------------------------------------------------------- bad input


def test_bad_inputs_raise_clear_errors(tiny_model, tmp_path, source):
    with pytest.raises(DataError, match="n must be >= 1"):
        hypotheses.GenerationConfig(n=0)
    with pytest.raises(ValueError, match=r"method='greedy' not supported; choose from"):
        hypotheses.GenerationConfig(method="greedy")
    with pytest.raises(DataError, match="num_beam_groups=3 must be >= 1 and divide n=4"):
        hypotheses.GenerationConfig(method="diverse-beam", n=4, num_beam_groups=3)
    with pytest.raises(UamtError, match="no dropout layers"):
        with hypotheses.mc_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2)), 0.3):
            pass
    bert = tmp_path / "bert"
    transformers.BertConfig(
        vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
    ).save_pretrained(bert)
    with pytest.raises(UamtError, match="model_type='bert'.* is not a seq2seq"):
        hypotheses.load_model(str(bert))
    with pytest.raises(UamtError, match="cannot load its config"):
        hypotheses.load_model(str(tmp_path / "no-such-model"))
    gappy = tmp_path / "gappy.txt"
    gappy.write_text("one\n\nthree\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"gappy\.txt:2: empty source line"):
        hypotheses.generate([str(tiny_model)], gappy, tmp_path / "x", cfg(), progress=False)
    assert not (tmp_path / "x").exists()  # nothing written


def test_cli_errors_exit_2(tiny_model, tmp_path, source, capsys):
    base = generate_argv(tiny_model, source)
    assert main([*base, "--n", "0", "--out", str(tmp_path / "o")]) == 2
    assert "n must be >= 1" in capsys.readouterr().err
    assert main([*base, "--method", "topk", "--out", str(tmp_path / "o")]) == 2
    assert "method='topk' not supported" in capsys.readouterr().err
    out = tmp_path / "twice"
    args = [*base, "--method", "beam", "--n", "2", "--max-new-tokens", "6", "--out", str(out)]
    assert main(args) == 0
    assert main(args) == 2
    assert "already holds hypotheses" in capsys.readouterr().err
    assert (
        main(
            [*base, "--method", "beam", "--n", "1", "--max-new-tokens", "6", "--out", str(out), "--overwrite"]
        )
        == 0
    )
    assert sorted(p.name for p in out.glob("hyp.*.txt")) == ["hyp.1.txt"]  # stale hyp.2 removed
    assert main(["hypotheses"]) == 2


# --------------------------------------------------------------------------- end to end


def test_generate_then_multihyp_end_to_end(tiny_model, source, tmp_path, capsys):
    out = tmp_path / "hyps"
    code = main(
        generate_argv(
            tiny_model,
            source,
            *("--method", "mc-dropout", "--n", "3", "--dropout", "0.3", "--max-new-tokens", "8"),
            *("--batch-size", "4", "--out", str(out)),
        )
    )
    assert code == 0
    assert "ms/segment/hypothesis" in capsys.readouterr().out
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")  # stand-in references
    human = tmp_path / "human.txt"
    human.write_text(
        "".join(f"{x}\n" for x in np.random.default_rng(0).normal(size=len(SOURCES))), encoding="utf-8"
    )
    hyp_paths = sorted(str(p) for p in out.glob("hyp.*.txt"))
    result = tmp_path / "r.json"
    code = main(
        [
            "multihyp",
            "--mt",
            str(out / "top.txt"),
            "--ref",
            str(ref),
            "--hyp",
            *hyp_paths,
            "--human",
            str(human),
            "--metric",
            "chrf",
            "--out",
            str(result),
        ]
    )
    assert code == 0
    pearson = json.loads(result.read_text())["pearson"]
    mt = lexical.read_lines(out / "top.txt")
    variants = lexical.multihyp_variants(
        mt, [lexical.read_lines(ref)], [lexical.read_lines(p) for p in hyp_paths], "chrf"
    )
    expected = lexical.correlations(variants, lexical.read_scores(human))
    assert set(pearson) == set(expected) and "hyp-mt-avg-ref" in pearson
    for name, r in expected.items():
        assert (pearson[name] is None and np.isnan(r)) or pearson[name] == pytest.approx(r)


def test_mc_dropout_changes_nothing_but_dropout(tiny_model):
    # With a vanishing dropout probability the MC-dropout passes must equal the deterministic
    # output: nothing else (LayerDrop, other train-mode behaviour) may be switched on.
    model, tokenizer = hypotheses.load_model(str(tiny_model))
    top = hypotheses.top_outputs(model, tokenizer, SOURCES, cfg())
    passes = hypotheses.hypotheses_for_model(
        model, tokenizer, SOURCES, cfg(method="mc-dropout", n=2, dropout=1e-12)
    )
    assert passes == [top, top]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_without_gpu_is_a_clear_error(tiny_model):
    with pytest.raises(UamtError, match="device='cuda' requested but torch sees no CUDA device"):
        hypotheses.load_model(str(tiny_model), device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_generation_on_gpu(tiny_model, source, tmp_path):
    out = tmp_path / "gpu"
    hypotheses.generate(
        [str(tiny_model)], source, out, cfg(method="mc-dropout", n=3, device="cuda"), progress=False
    )
    streams = hyp_files(out)
    assert [len(s) for s in streams] == [len(SOURCES)] * 3 and len({tuple(s) for s in streams}) == 3


def test_generated_hypotheses_score_as_pseudo_references(tiny_model, source, tmp_path, monkeypatch, capsys):
    """`uamt score -r hyp.*.txt`: generated hypotheses are line-aligned pseudo-references (the
    reference-free setting of Uncertainty-Aware MT Evaluation §5.5) for a registered model."""
    from test_scoring_support import REF_MODEL, build_store

    out = tmp_path / "hyps"
    argv = generate_argv(tiny_model, source, "--method", "beam", "--n", "3", "--max-new-tokens", "8")
    assert main([*argv, "--out", str(out)]) == 0
    hyps = sorted(out.glob("hyp.*.txt"))
    for path in hyps:  # a random tiny model can emit an empty line; a pseudo-reference must not be empty
        lines = [line if line.strip() else "-" for line in lexical.read_lines(path)]
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", build_store(tmp_path))
    capsys.readouterr()
    scored = tmp_path / "scores.jsonl"
    argv = [
        "score",
        "-s",
        str(source),
        "-t",
        str(out / "top.txt"),
        "--model",
        f"models:/{REF_MODEL}@champion",
        "--no-progress",
        "--out",
        str(scored),
    ]
    for path in hyps:
        argv += ["-r", str(path)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in scored.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(SOURCES) + 1 and "summary" in rows[-1]
    assert all({"mu", "sigma", "lower", "upper", "risk"} <= set(r) for r in rows[:-1])
