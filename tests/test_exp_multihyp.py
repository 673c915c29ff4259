"""Multi-hypothesis scoring with pseudo-references (uamt.experiments.multihyp): the variants agree
with uamt.lexical.multihyp_variants, sampling and exclusion rules, and the Estonian-English 1K
reference rows of the paper's Table 4 on the real set."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from uamt import lexical
from uamt.core.errors import DataError
from uamt.experiments import multihyp
from uamt.experiments.common import pseudo_reference_rows


def _da_frame(n_sources=6, systems=("Sys-A", "Sys-B", "Sys-C", "HUMAN-refB"), lps=("de-en", "ja-en")):
    rng = np.random.default_rng(0)
    words = "the a cat dog sat ran on under mat rug quickly slowly".split()
    rows = []
    for lp in lps:
        for seg in range(1, n_sources + 1):
            ref = " ".join(rng.choice(words, 6))
            for system in systems:
                mt = " ".join(rng.choice(words, int(rng.integers(4, 8))))
                rows.append(
                    {
                        "dataset": "wmt21_da",
                        "lp": lp,
                        "seg_id": seg,
                        "system": system,
                        "src": f"{lp} src {seg}",
                        "mt": mt,
                        "ref": ref,
                        "score": float(rng.normal()),
                    }
                )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("metric", ["bleu", "chrf", "ter"])
def test_variants_equal_lexical_multihyp_variants(metric):
    rows = multihyp.da_rows(_da_frame(n_sources=3))
    pseudo = pseudo_reference_rows(rows)
    ours = multihyp.pseudo_variants(rows["mt"].tolist(), rows["ref"].tolist(), pseudo, metric)
    assert list(ours) == list(multihyp.VARIANTS)
    mt = rows["mt"].tolist()
    for i, positions in enumerate(pseudo):
        reference = lexical.multihyp_variants(
            [mt[i]], [[rows["ref"][i]]], [[mt[j]] for j in positions], metric, prefix="pseudo"
        )
        for name in multihyp.VARIANTS:
            assert ours[name][i] == pytest.approx(reference[name][0]), (name, i)


def test_hand_computed_identical_pseudo_reference():
    # o equals its only pseudo-reference: pseudo-mt-* is the metric's best score (100 for chrF).
    mt = ["the cat sat on the mat", "the cat sat on the mat"]
    out = multihyp.pseudo_variants(mt, ["a dog ran", "a dog ran"], [np.array([1]), np.array([0])], "chrf")
    np.testing.assert_allclose(out["pseudo-mt-avg"], [100.0, 100.0])
    np.testing.assert_allclose(out["pseudo-mt-avg-ref"], (100.0 + out["mt-ref"]) / 2)


def test_rows_without_pseudo_references_are_refused():
    with pytest.raises(DataError, match="row 1 has no pseudo-reference"):
        multihyp.pseudo_variants(
            ["a b", "c d"], ["a b", "c d"], [np.array([1]), np.array([], dtype=int)], "bleu"
        )


def test_human_rows_are_dropped_and_sources_sampled_whole():
    rows = multihyp.da_rows(_da_frame(n_sources=10))
    assert not rows["system"].str.startswith("HUMAN").any()
    sample = multihyp.sample_sources(rows, 4, seed=1)
    assert sample.groupby("lp")["seg_id"].nunique().tolist() == [4, 4]
    assert (sample.groupby(["lp", "seg_id"]).size() == 3).all()  # every MT system of a sampled source
    again = multihyp.sample_sources(rows, 4, seed=1)
    pd.testing.assert_frame_equal(sample, again)
    assert len(multihyp.sample_sources(rows, None, seed=1)) == len(rows)
    with pytest.raises(DataError, match="max_sources_per_lp=0"):
        multihyp.sample_sources(rows, 0, seed=1)


def _eten_frame(n=12):
    rng = np.random.default_rng(1)
    words = "a b c d e f g".split()
    return pd.DataFrame(
        {
            "mt": [" ".join(rng.choice(words, 5)) for _ in range(n)],
            "refs": [[" ".join(rng.choice(words, 5)), " ".join(rng.choice(words, 5))] for _ in range(n)],
            "score": rng.normal(size=n),
        }
    )


def test_analysis_result_report_and_figure(tmp_path):
    result = multihyp.analyse(
        _da_frame(), _eten_frame(), metrics=("bleu", "ter"), max_sources_per_lp=5, max_pseudo_refs=1, seed=0
    )
    assert result["sizes"]["lps"]["de-en"] == {
        "sources": 5,
        "rows": 15,
        "systems": 3,
        "pseudo_refs_mean": 1.0,
        "pseudo_refs_min": 1,
        "pseudo_refs_max": 1,
        "pairs": 15,
    }
    assert set(result["pearson"]["bleu"]) == {"de-en", "ja-en", "avg"}
    assert set(result["pearson"]["ter"]["avg"]) == set(multihyp.VARIANTS)
    avg = result["pearson"]["bleu"]["avg"]["mt-ref"]
    per_lp = [result["pearson"]["bleu"][lp]["mt-ref"] for lp in ("de-en", "ja-en")]
    assert avg == pytest.approx(np.mean(per_lp))
    assert set(result["eten"]["bleu"]) == set(multihyp.ETEN_VARIANTS)
    text = multihyp.render(result)
    assert text.startswith("## 6. Multi-hypothesis scoring")
    assert "figures/multihyp.png" in text and "pseudo-mt-avg-ref agrees better" in text
    from uamt.experiments.common import save_figure

    assert save_figure(multihyp.figure(result), tmp_path / "m.png").stat().st_size > 0


def test_eten_needs_two_references():
    frame = _eten_frame()
    frame.at[3, "refs"] = ["only one"]
    with pytest.raises(DataError, match="row 3: expected 2 references"):
        multihyp.eten_correlations(frame, ("bleu",))
    with pytest.raises(DataError, match="no multihyp_eten rows"):
        multihyp.eten_correlations(frame.iloc[:0], ("bleu",))


def test_estonian_english_reference_rows_on_the_real_set(mirror_root):
    """The published sanity numbers (sacrebleu defaults) on the real 1K set."""
    from uamt.data.loaders import load_multihyp_eten

    frame = load_multihyp_eten(mirror_root)
    assert len(frame) == 1000
    r = multihyp.eten_correlations(frame, ("bleu", "chrf"))
    assert [round(r["bleu"][v], 3) for v in multihyp.ETEN_VARIANTS] == [0.417, 0.426, 0.494]
    assert [round(r["chrf"][v], 3) for v in multihyp.ETEN_VARIANTS] == [0.508, 0.521, 0.554]


def test_report_findings_count_lp_cells_and_eten_rows():
    from uamt.experiments.report import verdict_of

    def lp_block(ref: float, avg: float, lo: float, hi: float) -> dict:
        return {
            "mt-ref": ref,
            "pseudo-mt-avg-ref": avg,
            "pseudo-mt-min-ref": lo,
            "pseudo-mt-max-ref": hi,
        }

    result = {
        "sizes": {"lps": {"de-en": {"rows": 100}, "ja-en": {"rows": 400}}, "eten_rows": 50},
        "pearson": {
            # BLEU: 5 of 6 cells above mt-ref -> held (>= 3/4)
            "bleu": {
                "de-en": lp_block(0.10, 0.20, 0.05, 0.30),
                "ja-en": lp_block(0.10, 0.20, 0.25, 0.30),
                "avg": lp_block(0.10, 0.20, 0.10, 0.30),
            },
            # TER (error rate, sign-flipped): -0.2 beats -0.1; 4 of 6 -> partly
            "ter": {
                "de-en": lp_block(-0.10, -0.20, -0.05, -0.30),
                "ja-en": lp_block(-0.10, -0.20, 0.00, -0.30),
                "avg": lp_block(-0.10, -0.20, -0.02, -0.30),
            },
        },
        "eten": {
            "bleu": {"mt-ref-1": 0.40, "mt-ref-2": 0.45, "mt-ref-multi": 0.50},
            "ter": {"mt-ref-1": -0.40, "mt-ref-2": -0.45, "mt-ref-multi": -0.42},  # between the two
        },
    }
    rows = multihyp.report_findings(result)
    assert [r[0].split(":")[0] for r in rows] == ["sentBLEU", "TER", "Et-En 1K"]
    assert [verdict_of(r[2]) for r in rows] == ["held", "partly", "partly"]
    assert "beats mt-ref in 5/6 LP cells: avg-ref 2/2 (mean +0.100), min-ref 1/2 (mean +0.050)" in rows[0][2]
    # TER's LP average is reported sign-flipped; se(r) = 1/sqrt(rows)
    assert (
        "LP-average r mt-ref 0.100, avg-ref 0.200 (se(r) per LP ~ 0.050-0.100; r sign-flipped" in rows[1][2]
    )
    # the paper's Tables 4-5 counted by the same rule: BLEU 6/6
    assert rows[0][1].startswith("pseudo-mt-*-ref beats mt-ref in 6/6 cells")
    assert "multi beats both single references for 1/2 metrics (50 segments)" in rows[2][2]
    assert "sentBLEU 0.494 vs 0.417 / 0.432" in rows[2][1]
    result["eten"]["ter"]["mt-ref-multi"] = -0.50
    assert verdict_of(multihyp.report_findings(result)[2][2]) == "held"
    result["pearson"]["bleu"]["ja-en"] = lp_block(0.3, 0.2, 0.2, 0.2)
    assert verdict_of(multihyp.report_findings(result)[0][2]) == "not held"  # 3 of 6
