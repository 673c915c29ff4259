"""uamt.experiments.references: naming the references, the S-N / Mul combination (hand-computed),
aligned MC-dropout samples across references, the whole analysis on a synthetic MQM-like table with
tiny models, and the real WMT21 en-de reference order against the raw reference files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.fakes import FEATURES, WEIGHTS, embed
from uamt.core.errors import DataError
from uamt.experiments import references as R
from uamt.experiments.common import share_verdict
from uamt.models import TrainConfig, load, train

NAMES = ("A", "C", "D")


def make_frame(n_segments: int, seed: int, n_systems: int = 4, split: str = "test") -> pd.DataFrame:
    """An MQM-like table: per segment 3 references (rated rows ``ref-X`` whose ``refs`` are the other
    two) and ``n_systems`` system rows whose ``refs`` are [A, C, D]; scores depend on the embeddings."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(1, n_segments + 1):
        src = f"src {seed}-{s}"
        refs = {x: f"ref {x} {seed}-{s}" for x in NAMES}
        base = dict(dataset="wmt21_mqm", split=split, lp="en-de", src=src, seg_id=s, doc=f"d{s // 5}")
        for x in NAMES:
            others = [refs[y] for y in NAMES if y != x]
            score = -float(rng.integers(0, 15))
            rows.append(
                {
                    **base,
                    "system": f"ref-{x}",
                    "mt": refs[x],
                    "ref": others[0],
                    "refs": others,
                    "score": score,
                }
            )
        for k in range(n_systems):
            mt = f"mt{k} {seed}-{s}"
            fm, fr = embed([mt])[0].mean(0), embed([refs["A"]])[0].mean(0)
            score = float(fm @ WEIGHTS - 0.5 * fr @ WEIGHTS + rng.normal() * (0.2 + abs(fm[0])))
            rows.append(
                {
                    **base,
                    "system": f"sys{k}",
                    "mt": mt,
                    "ref": refs["A"],
                    "refs": [refs[x] for x in NAMES],
                    "score": score,
                }
            )
    return pd.DataFrame(rows)


def system_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.loc[~R.reference_rows(frame)].reset_index(drop=True)


CFG = TrainConfig(hidden_sizes=(16,), max_epochs=2, batch_size=32, mc_samples=12, ensemble_size=2, patience=1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    train_df, dev_df = system_rows(make_frame(60, 1)), system_rows(make_frame(15, 2))
    paths = {
        m: train(m, CFG, train_df, dev_df, FEATURES, root / m)
        for m in ("point", "mcd_head", "hts", "hts_mcd")
    }
    paths["ensemble"] = train("ensemble", CFG, train_df, dev_df, FEATURES, root / "ensemble")
    paths["dup"] = train("dup", CFG, train_df, dev_df, FEATURES, root / "dup", base_model_dir=paths["point"])
    return {m: load(p) for m, p in paths.items()}


# --------------------------------------------------------------------------- naming references
def test_reference_table_names_texts_and_checks_order():
    frame = make_frame(3, 5)
    table = R.reference_table(frame, NAMES)
    systems = frame.loc[~R.reference_rows(frame)]
    assert list(table.columns) == list(NAMES) and table.index.equals(systems.index)
    first = systems.iloc[0]
    assert table.iloc[0].tolist() == [f"ref {x} 5-{first['seg_id']}" for x in NAMES]
    with pytest.raises(
        DataError, match=r"row 0 .*text of reference A differs from position 1 .*not in the order"
    ):
        R.reference_table(frame, ("C", "A", "D"))


def test_unknown_or_repeated_reference_is_refused():
    frame = make_frame(2, 5)
    with pytest.raises(ValueError, match=r"reference='B' not supported; choose from \['A', 'C', 'D'\]"):
        R.reference_table(frame, ("A", "B", "D"))
    with pytest.raises(ValueError, match=r"reference set \['A', 'A'\] names 'A' twice"):
        R.check_reference_names(("A", "A"), NAMES)
    with pytest.raises(ValueError, match="set is empty"):
        R.check_reference_names((), NAMES)


def test_refs_of_wrong_length_names_the_row():
    frame = make_frame(2, 5)
    row = int(np.flatnonzero(~R.reference_rows(frame))[1])
    frame.at[row, "refs"] = ["only one"]
    with pytest.raises(DataError, match=rf"test split: row {row} .*'refs' has 1 references, expected 3"):
        R.reference_table(frame, NAMES, where="test split")


# --------------------------------------------------------------------------- combination by hand
def test_combination_of_aligned_samples_hand_computed():
    # 1 row, 2 references, 3 aligned samples.
    samples = np.array([[[1.0, 2.0, 3.0], [3.0, 4.0, 8.0]]])
    scores = R.ReferenceScores("mcd_head", ("A", "C"), np.array([[2.0, 5.0]]), np.zeros((1, 2)), samples)
    mu, sigma = R.combine_references(scores, np.array([[0, 1]]))
    # pointwise average [2, 3, 5.5]: mean 3.5, population variance (2.25 + 0.25 + 4) / 3
    np.testing.assert_allclose(mu, [3.5])
    np.testing.assert_allclose(sigma, [np.sqrt(6.5 / 3)])
    mu, sigma = R.combine_references(scores, np.array([[0]]))
    np.testing.assert_allclose([mu[0], sigma[0]], [2.0, np.sqrt(2 / 3)])
    # Averaging references before the Gaussian fit narrows it only when the references disagree
    # across passes: here Var of the average (2.17) < mean per-reference variance (0.67 + 4.22) / 2.
    assert sigma[0] < np.sqrt(6.5 / 3)


def test_combination_of_heteroscedastic_samples_and_moments_hand_computed():
    mu_s = np.array([[[1.0, 2.0, 3.0], [3.0, 4.0, 8.0]]])
    var_s = np.array([[[1.0, 1.0, 1.0], [3.0, 5.0, 3.0]]])
    scores = R.ReferenceScores("hts_mcd", ("A", "C"), np.zeros((1, 2)), np.zeros((1, 2)), mu_s, var_s)
    assert scores.combination == R.HETEROSCEDASTIC_SAMPLES
    mu, sigma = R.combine_references(scores, np.array([[1, 0]]))
    # epistemic 6.5 / 3 + aleatoric mean([2, 3, 2]) = 7 / 3
    np.testing.assert_allclose([mu[0], sigma[0] ** 2], [3.5, 6.5 / 3 + 7 / 3])
    moments = R.ReferenceScores("hts", NAMES, np.array([[1.0, 3.0, 8.0]]), np.array([[0.5, 1.5, 4.0]]))
    assert moments.combination == R.MOMENTS
    mu, sigma = R.combine_references(moments, np.array([[0, 1]]))
    np.testing.assert_allclose([mu[0], sigma[0]], [2.0, 1.0])
    point = R.ReferenceScores("point", NAMES, np.array([[1.0, 3.0, 8.0]]), np.full((1, 3), np.nan))
    mu, sigma = R.combine_references(point, np.array([[0, 1, 2]]))
    assert mu[0] == pytest.approx(4.0) and np.isnan(sigma[0])


def test_select_references_s_n_and_mul():
    rng = np.random.default_rng(3)
    s1 = R.select_references(400, 3, [0, 2], 1, rng)
    assert s1.shape == (400, 1) and set(np.unique(s1)) == {0, 2}
    s2 = R.select_references(400, 3, [0, 1, 2], 2, np.random.default_rng(3))
    assert s2.shape == (400, 2) and (s2[:, 0] != s2[:, 1]).all()
    assert {tuple(sorted(r)) for r in s2.tolist()} == {(0, 1), (0, 2), (1, 2)}
    np.testing.assert_array_equal(s2, R.select_references(400, 3, [0, 1, 2], 2, np.random.default_rng(3)))
    np.testing.assert_array_equal(R.select_references(2, 3, [1, 2], None), [[1, 2], [1, 2]])
    with pytest.raises(ValueError, match="cannot sample 3 of 2"):
        R.select_references(5, 3, [0, 1], 3, rng)
    with pytest.raises(ValueError, match="distinct reference columns"):
        R.select_references(5, 3, [0, 0], None)
    with pytest.raises(ValueError, match="needs a seeded rng"):
        R.select_references(5, 3, [0, 1], 1)


def test_configurations_follow_tables_5_and_6():
    got = [("".join(s), c, n) for s, c, _, n in R.configurations(NAMES)]
    assert got == [
        ("A", "single", 1), ("C", "single", 1), ("D", "single", 1),
        ("AC", "S-1", 1), ("AC", "Mul", 2), ("AD", "S-1", 1), ("AD", "Mul", 2),
        ("CD", "S-1", 1), ("CD", "Mul", 2),
        ("ACD", "S-1", 1), ("ACD", "S-2", 2), ("ACD", "Mul", 3),
    ]  # fmt: skip


# --------------------------------------------------------------------------- with tiny models
@pytest.mark.parametrize("method", ["point", "mcd_head", "ensemble", "hts", "hts_mcd", "dup"])
def test_single_reference_is_the_models_own_prediction(models, method):
    frame = make_frame(6, 7)
    table = R.reference_table(frame, NAMES)
    rows = frame.loc[table.index]
    scores = R.score_references(models[method], rows, table, FEATURES)
    expected_kind = {"mcd_head": R.SAMPLES, "ensemble": R.SAMPLES, "hts_mcd": R.HETEROSCEDASTIC_SAMPLES}
    assert scores.combination == expected_kind.get(method, R.MOMENTS)
    for j, name in enumerate(NAMES):
        pred = models[method].predict(rows.assign(ref=table[name].to_numpy()), FEATURES)
        mu, sigma = R.combine_references(scores, np.full((len(rows), 1), j))
        np.testing.assert_allclose(mu, pred["mu"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(sigma, pred["sigma"], rtol=1e-5, atol=1e-7)


class ShiftingBlend:
    """A stand-in paragraph blend (:class:`uamt.paragraphs.ParagraphBlend`'s interface) that moves the
    μ of every row by +0.5, as a fitted blend moves a paragraph's."""

    def blended_rows(self, frame: pd.DataFrame) -> np.ndarray:
        return np.ones(len(frame), dtype=bool)

    def apply(self, predict, frame: pd.DataFrame) -> pd.DataFrame:
        out = predict(frame)
        return out.assign(mu=out["mu"] + 0.5)


@pytest.mark.parametrize("method", ["mcd_head", "ensemble"])
def test_aligned_samples_follow_the_paragraph_blend(models, method, monkeypatch):
    # The network's samples read a row whole; the served μ is the blend's. Combined, one reference
    # gives what the model serves: the blended μ, the network's spread.
    model = models[method]
    monkeypatch.setattr(model, "paragraphs", ShiftingBlend())
    frame = make_frame(4, 11)
    table = R.reference_table(frame, NAMES)
    rows = frame.loc[table.index]
    scores = R.score_references(model, rows, table, FEATURES)
    for j, name in enumerate(NAMES):
        scored = rows.assign(ref=table[name].to_numpy())
        pred, whole = model.predict(scored, FEATURES), model.predict_whole(scored, FEATURES)
        np.testing.assert_allclose(pred["mu"] - whole["mu"], 0.5, rtol=1e-6)
        mu, sigma = R.combine_references(scores, np.full((len(rows), 1), j))
        np.testing.assert_allclose(mu, pred["mu"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(sigma, pred["sigma"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", ["mcd_head", "hts_mcd"])
def test_mc_dropout_passes_are_aligned_across_references(models, method):
    # Two copies of the same reference must give identical samples pass by pass (same masks), so their
    # Mul equals either single reference; with unaligned masks the averaged samples would be narrower.
    frame = make_frame(5, 8)
    table = R.reference_table(frame, NAMES)
    rows = frame.loc[table.index]
    twins = pd.DataFrame({"A": table["A"], "A2": table["A"], "C": table["C"]}, index=table.index)
    scores = R.score_references(models[method], rows, twins, FEATURES)
    np.testing.assert_array_equal(scores.mu_samples[:, 0], scores.mu_samples[:, 1])
    assert not np.allclose(scores.mu_samples[:, 0], scores.mu_samples[:, 2])
    mul = R.combine_references(scores, np.tile([0, 1], (len(rows), 1)))
    single = R.combine_references(scores, np.zeros((len(rows), 1), dtype=int))
    np.testing.assert_allclose(mul, single, rtol=1e-12)


def test_whole_analysis_on_synthetic_table(models, tmp_path):
    from uamt.experiments.common import save_figure

    models = {m: models[m] for m in ("point", "mcd_head", "hts_mcd")}  # the other kinds: tests above
    result = R.run_references(
        models, make_frame(12, 9), make_frame(14, 10, split="dev"), FEATURES, names=NAMES, seed=1, draws=2
    )
    assert result["data"]["n_test"] == 12 * 4 and result["data"]["n_dev"] == 14 * 4
    assert result["data"]["systems"] == ["sys0", "sys1", "sys2", "sys3"]
    assert (
        result["methods"]["point"]["fixed_variance"]
        and result["methods"]["point"]["combination"] == R.MOMENTS
    )
    assert result["methods"]["mcd_head"]["samples"] == CFG.mc_samples
    for block in result["methods"].values():
        assert [(c["set"], c["config"]) for c in block["configs"]] == [
            (list(s), c) for s, c, _, _ in R.configurations(NAMES)
        ]
        for c in block["configs"]:
            assert c["draws"] == (2 if c["config"].startswith("S-") else 1)
            assert -1 <= c["indicators"]["pps"] <= 1 and c["indicators"]["sharpness"] > 0
    found = result["findings"]
    assert found["mul_sharper"]["of"] == len(models) * 4 and len(found["cells"]) == len(models) * 4
    assert found["mul_narrower_raw"]["of"] == (len(models) - 1) * 4  # point has no raw variance
    text = R.render(result)
    assert text.startswith("## 4. Number of references") and "figures/references_sharpness.png" in text
    assert f"in {found['mul_sharper']['count']}/{found['mul_sharper']['of']}" in text
    path = save_figure(R.figure(result), tmp_path / "fig.png")
    assert path.stat().st_size > 1000


def test_same_seed_same_result_different_seed_different_draws(models):
    test, dev = make_frame(8, 11), make_frame(8, 12, split="dev")
    picked = {"hts": models["hts"]}
    a = R.run_references(picked, test, dev, FEATURES, seed=4, draws=1)
    b = R.run_references(picked, test, dev, FEATURES, seed=4, draws=1)
    assert a == b
    c = R.run_references(picked, test, dev, FEATURES, seed=5, draws=1)
    s1 = [
        (x["indicators"], y["indicators"])
        for x, y in zip(a["methods"]["hts"]["configs"], c["methods"]["hts"]["configs"], strict=True)
        if x["config"] == "S-1"
    ]
    assert any(x != y for x, y in s1)


def test_reference_free_model_is_refused(tmp_path):
    from uamt.core.errors import UamtError

    train_df, dev_df = system_rows(make_frame(30, 1)), system_rows(make_frame(8, 2))
    qe = load(train("hts", CFG.replace(reference_free=True), train_df, dev_df, FEATURES, tmp_path / "qe"))
    frame = make_frame(2, 3)
    table = R.reference_table(frame, NAMES)
    with pytest.raises(UamtError, match="reference-free"):
        R.score_references(qe, frame.loc[table.index], table, FEATURES)


# --------------------------------------------------------------------------- real data
def test_real_wmt21_en_de_reference_order_matches_raw_files(mirror_root):
    from uamt.data import loaders
    from uamt.data.schema import read_lines

    frame = loaders.load_wmt21_mqm(mirror_root, lps=("en-de",))
    frame = frame[frame["seg_id"] <= 40].reset_index(drop=True)
    # ref-B is rated too (its text comes from the QE-2023 files) but is no reference of other rows
    assert R.rated_references(frame) == ["A", "B", "C", "D"] and set(NAMES) == {"A", "C", "D"}
    table = R.reference_table(frame, NAMES, where="wmt21_mqm en-de")
    raw = mirror_root / "wmt-conference" / "wmt21-news-systems" / "txt" / "references"
    for name in NAMES:
        lines = read_lines(raw / f"newstest2021.en-de.ref.{name}.de")
        seg = frame.loc[table.index, "seg_id"].to_numpy()
        assert table[name].tolist() == [lines[s - 1] for s in seg]


def _config(subset: str, config: str, n_refs: int, **indicators) -> dict:
    return {"set": list(subset), "config": config, "n_refs": n_refs, "indicators": indicators, "std": {}}


def test_report_findings_count_mul_vs_sampled_cells():
    from uamt.experiments.report import verdict_of

    def block(fixed: bool, configs: list[dict]) -> dict:
        return {"combination": "moments", "samples": None, "fixed_variance": fixed, "configs": configs}

    # hts: Mul sharper than S-1 in {A,C} and than S-1 and S-2 in {A,C,D}: 3/3 cells;
    # PPS higher 2/3, NLL lower 1/3.  The fixed-variance point model enters PPS/NLL only
    # (its "sharper" Mul must not count): PPS higher 0/1, NLL lower 1/1.
    hts = block(
        False,
        [
            _config("A", "single", 1, pps=0.5, nll=1.0, sharpness=0.5),
            _config("AC", "S-1", 1, pps=0.20, nll=1.50, sharpness=0.50),
            _config("AC", "Mul", 2, pps=0.25, nll=1.40, sharpness=0.40),
            _config("ACD", "S-1", 1, pps=0.20, nll=1.50, sharpness=0.50),
            _config("ACD", "S-2", 2, pps=0.30, nll=1.45, sharpness=0.45),
            _config("ACD", "Mul", 3, pps=0.26, nll=1.60, sharpness=0.42),
        ],
    )
    point = block(
        True,
        [
            _config("AC", "S-1", 1, pps=0.3, nll=1.5, sharpness=1.0),
            _config("AC", "Mul", 2, pps=0.3, nll=1.4, sharpness=0.1),
        ],
    )
    result = {"methods": {"point": point, "hts": hts}, "findings": {"median_s1_pps_draw_std": 0.004}}
    (sharp, pps_nll) = R.report_findings(result)
    assert verdict_of(sharp[2]) == "held"
    assert sharp[2].startswith("held: Mul sharper in 3/3 cells (2/2 vs S-1, 1/1 vs S-2; 1 method(s)")
    # mean Mul - S-N sharpness: (-0.10 - 0.08 - 0.03) / 3 = -0.070
    assert "mean Mul - S-N -0.070" in sharp[2]
    # the paper's Table 5 counted by the same rule: Mul sharper in all 5 cells
    assert "Mul sharper in 5/5 cells" in sharp[1]
    # PPS: 2 of 4 cells (not held), NLL: 2 of 4 (not held) -> not held
    assert pps_nll[2].startswith("not held: PPS higher in 2/4 cells (2/3 vs S-1, 0/1 vs S-2")
    assert "NLL lower in 2/4" in pps_nll[2] and "0.004" in pps_nll[2]
    # a better NLL everywhere turns it into partly (PPS not held, NLL held)
    for c in hts["configs"]:
        if c["config"] == "Mul":
            c["indicators"]["nll"] = 1.0
    point["configs"][1]["indicators"]["nll"] = 1.0
    assert verdict_of(R.report_findings(result)[1][2]) == "partly"
    assert share_verdict(3, 4) == "held" and share_verdict(3, 5) == "partly"
    assert share_verdict(1, 2) == "not held" and share_verdict(0, 0) == "n/a"
    # only fixed-variance methods: no sharpness cells
    assert R.report_findings({**result, "methods": {"point": point}})[0][2].startswith("n/a")
