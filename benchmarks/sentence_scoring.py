"""Paragraphs scored sentence by sentence: does the served model see an omitted sentence, a flipped
negation or a changed number better when each sentence is scored on its own?

The served model reads a paragraph (WMT23 en-de) as one pooled vector per text, so one sentence
dropped from five, or one word negated, barely moves it (challenge set: omission of a sentence and
negation below the 95 % goal).  Here every paragraph is cut into sentences
(:func:`uamt.surface_features.sentences`), the translation's sentences are aligned to the
reference's (:func:`uamt.paragraphs.align_sentences`: monotonic, by sentence chrF, 1-1, 2-1 and
1-2 links, a sentence left unaligned where no link reaches ``--min-chrf``), each aligned (source, translation,
reference) unit is scored by the registered model, and the paragraph gets

* ``sum``: the sum of its units' served mu (MQM penalties add up over a paragraph's errors);
* ``sum+gaps``: that sum plus a dev-fitted penalty per reference sentence left unaligned (an
  omission) and per translation sentence left unaligned (an addition), least squares on dev;
* ``blend``: the served paragraph mu and ``sum+gaps`` combined by least squares on dev;
* ``paragraph+gaps``: the served paragraph mu and the unaligned counts alone (what the alignment
  adds without scoring any sentence);

beside the served paragraph mu (``paragraph``, today's answer).  A paragraph whose source and
reference have different sentence counts (10 % of test: the source sentence of a reference sentence
is then unknown) keeps its paragraph mu in every variant.  Measured on test: Pearson with MQM per
dataset (a paired bootstrap over documents for the difference with ``paragraph``) and AUROC for
MQM <= -5, and on the
challenge set built from those test paragraphs (:func:`uamt.challenge.challenge_set`, good
originals only) the share of perturbed translations each variant scores below the original.

    MLFLOW_TRACKING_URI=sqlite:///mlflow/mlflow.db python benchmarks/sentence_scoring.py \
        [--model models:/uamt-comet@champion] [--json reports/quality/sentence_scoring_hts.json]

Nothing is registered or changed; the model is loaded through MLflow as users load it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from uamt.paragraphs import align_sentences

#: (dataset, lp) of the paragraph-level test data.
PARAGRAPH_DATA = (("wmt23_mqm", "en-de"), ("wmt23_sxs_mqm", "en-de"))
#: Challenge modes a sentence-level reading could change (the others replace the whole text).
MODES = ("omission_sentence", "omission_end", "negation", "number")
VARIANTS = ("paragraph", "paragraph+gaps", "sum", "sum+gaps", "blend")
#: Columns of each dev-fitted variant's least squares (``1``: the intercept).
DESIGNS = {
    "paragraph+gaps": ("1", "paragraph", "omitted", "added"),
    "sum+gaps": ("1", "sum", "omitted", "added"),
    "blend": ("1", "paragraph", "sum", "omitted", "added"),
}


def sentence_units(src: str, mt: str, ref: str, min_chrf: float):
    """``(units, n_omitted, n_added)`` of one paragraph, ``units`` a list of (src, mt, ref) texts; None
    where source and reference have different sentence counts (a reference sentence's source is
    then unknown)."""
    from uamt.surface_features import sentences

    src_s, mt_s, ref_s = sentences(src), sentences(mt), sentences(ref)
    if len(src_s) != len(ref_s) or not mt_s:
        return None
    links, unaligned_ref, unaligned_mt = align_sentences(mt_s, ref_s, min_chrf)
    units = [
        (" ".join(src_s[i] for i in r), " ".join(mt_s[j] for j in t), " ".join(ref_s[i] for i in r)) for r, t in links
    ]
    return units, len(unaligned_ref), len(unaligned_mt)


def paragraph_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of :data:`PARAGRAPH_DATA`, renumbered."""
    pairs = pd.MultiIndex.from_frame(table[["dataset", "lp"]])
    return table[pairs.isin(PARAGRAPH_DATA)].reset_index(drop=True)


def score_frame(model, frame: pd.DataFrame, batch: int = 512) -> np.ndarray:
    """Served mu of ``frame``'s (src, mt, ref, lp) rows."""
    out = []
    for start in range(0, len(frame), batch):
        part = frame.iloc[start : start + batch][["src", "mt", "ref", "lp"]].reset_index(drop=True)
        out.append(model.predict(part)["mu"].to_numpy(dtype=float))
    return np.concatenate(out) if out else np.empty(0)


def paragraph_features(model, rows: pd.DataFrame, min_chrf: float) -> pd.DataFrame:
    """Per paragraph of ``rows``: the served paragraph mu, the sum of its units' served mu (NaN
    where :func:`sentence_units` is None), the unaligned counts and the number of units."""
    unit_rows, owner, gaps = [], [], []
    for k, row in enumerate(rows.itertuples(index=False)):
        found = sentence_units(row.src, row.mt, row.ref, min_chrf)
        if found is None:
            gaps.append((np.nan, np.nan, 0))
            continue
        units, omitted, added = found
        gaps.append((omitted, added, len(units)))
        for src, mt, ref in units:
            unit_rows.append({"src": src, "mt": mt, "ref": ref, "lp": row.lp})
            owner.append(k)
    paragraph = score_frame(model, rows)
    unit_mu = score_frame(model, pd.DataFrame(unit_rows)) if unit_rows else np.empty(0)
    sums = np.bincount(np.asarray(owner, dtype=int), weights=unit_mu, minlength=len(rows))
    out = pd.DataFrame(gaps, columns=["omitted", "added", "units"], index=rows.index)
    out["paragraph"] = paragraph
    out["sum"] = np.where(out["omitted"].notna(), sums, np.nan)
    return out


def _design(features: pd.DataFrame, variant: str) -> np.ndarray:
    ones = pd.Series(1.0, index=features.index, name="1")
    return np.column_stack([ones if c == "1" else features[c] for c in DESIGNS[variant]]).astype(float)


def fit_variants(dev: pd.DataFrame, human: np.ndarray) -> dict[str, np.ndarray]:
    """Least-squares weights of each variant of :data:`DESIGNS` on the dev paragraphs that have units."""
    has = dev["sum"].notna().to_numpy()
    return {v: np.linalg.lstsq(_design(dev[has], v), human[has], rcond=None)[0] for v in DESIGNS}


def apply_variants(features: pd.DataFrame, weights: dict[str, np.ndarray]) -> pd.DataFrame:
    """Each variant's score per paragraph (a paragraph without units keeps its paragraph mu)."""
    has = features["sum"].notna().to_numpy()
    para = features["paragraph"].to_numpy(dtype=float)
    out = pd.DataFrame({"paragraph": para}, index=features.index)
    out["sum"] = np.where(has, features["sum"].fillna(0.0), para)
    for variant, w in weights.items():
        out[variant] = np.where(has, _design(features.fillna(0.0), variant) @ w, para)
    return out


def pearson(score, human) -> float:
    """Pearson of a variant's score with MQM (:func:`uamt.uncertainty.metrics.predictive_pearson_score`)."""
    from uamt.uncertainty.metrics import predictive_pearson_score

    return predictive_pearson_score(np.asarray(human, float), np.asarray(score, float))


def auroc_bad(score: np.ndarray, human: np.ndarray, chi: float = -5.0) -> float:
    """AUROC of ``-score`` for finding the bad translations (MQM <= ``chi``), as benchmarks/quality.py
    measures the served risk (:func:`uamt.quality.auroc_score`; here a lower score, a likelier bad one)."""
    from uamt.quality import auroc_score

    return auroc_score(-np.asarray(score, float), np.asarray(human, float) <= chi)


def bootstrap_difference(scores: pd.DataFrame, human: np.ndarray, docs: np.ndarray, variant: str, n: int = 1000, seed: int = 0):
    """Mean and 2.5/97.5 % of Pearson(variant) - Pearson(paragraph) over documents resampled."""
    rng = np.random.default_rng(seed)
    codes, uniques = pd.factorize(docs)
    members = [np.flatnonzero(codes == d) for d in range(len(uniques))]
    diffs = []
    for _ in range(n):
        idx = np.concatenate([members[d] for d in rng.integers(len(members), size=len(members))])
        diffs.append(pearson(scores[variant].to_numpy()[idx], human[idx]) - pearson(scores["paragraph"].to_numpy()[idx], human[idx]))
    return float(np.mean(diffs)), float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models:/uamt-comet@champion")
    parser.add_argument("--prepared", default="data/prepared")
    parser.add_argument("--min-chrf", type=float, default=0.2)
    parser.add_argument("--per-mode", type=int, default=300)
    parser.add_argument("--json", default=None)
    parser.add_argument("--rows-out", default=None, help="parquet of the test paragraphs' features and variant scores")
    args = parser.parse_args(argv)

    import mlflow.pyfunc

    from uamt.challenge import challenge_set

    model = mlflow.pyfunc.load_model(args.model)
    frames = {s: pd.read_parquet(Path(args.prepared) / f"{s}.parquet") for s in ("dev", "test")}
    dev, test = (paragraph_rows(frames[s]) for s in ("dev", "test"))
    started = time.perf_counter()
    dev_f = paragraph_features(model, dev, args.min_chrf)
    weights = fit_variants(dev_f, dev["score"].to_numpy(float))
    test_f = paragraph_features(model, test, args.min_chrf)
    test_s = apply_variants(test_f, weights)
    report: dict = {
        "model": args.model, "min_chrf": args.min_chrf,
        "weights": {v: [round(float(x), 4) for x in w] for v, w in weights.items()},
        "weights_columns": {v: list(c) for v, c in DESIGNS.items()},
        "pearson": {}, "challenge": {},
    }  # fmt: skip
    for (dataset, lp), part in test.groupby(["dataset", "lp"]):
        idx = part.index.to_numpy()
        human = part["score"].to_numpy(float)
        entry = {"rows": len(part), "with_units": int(test_f.loc[idx, "sum"].notna().sum()),
                 "multi_unit": int((test_f.loc[idx, "units"] >= 2).sum()),
                 "omitted_any": int((test_f.loc[idx, "omitted"] > 0).sum())}  # fmt: skip
        for v in VARIANTS:
            entry[v] = round(pearson(test_s.loc[idx, v], human), 4)
            entry[f"{v}_auroc_bad"] = round(auroc_bad(test_s.loc[idx, v].to_numpy(), human), 4)
        for v in VARIANTS[1:]:
            entry[f"{v}_minus_paragraph"] = [round(x, 4) for x in bootstrap_difference(
                test_s.loc[idx].reset_index(drop=True), human, part["doc"].astype(str).to_numpy(), v)]  # fmt: skip
        report["pearson"][f"{dataset} {lp}"] = entry
        print(f"{dataset} {lp}: {entry}")

    if args.rows_out:
        pd.concat([test[["dataset", "lp", "doc", "seg_id", "system", "score"]], test_f, test_s.add_prefix("score_")], axis=1).to_parquet(args.rows_out)
    good = test[test["dataset"] == "wmt23_mqm"].reset_index(drop=True)
    chall = challenge_set(good, modes=MODES, per_mode=args.per_mode, seed=0, min_score=-1.0).reset_index(drop=True)
    original = chall.assign(mt=chall["mt_original"])
    pert_s = apply_variants(paragraph_features(model, chall, args.min_chrf), weights)
    orig_s = apply_variants(paragraph_features(model, original, args.min_chrf), weights)
    for mode, part in chall.groupby("mode", sort=False):
        idx = part.index.to_numpy()
        entry = {"n": len(part)}
        for v in VARIANTS:
            below = float((pert_s.loc[idx, v] < orig_s.loc[idx, v]).mean())
            entry[v] = round(below, 3)
            entry[f"{v}_ties"] = round(float((pert_s.loc[idx, v] == orig_s.loc[idx, v]).mean()), 3)
        report["challenge"][mode] = entry
        print(f"challenge {mode}: share below the original {entry}")
    report["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
