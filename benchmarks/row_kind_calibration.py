"""Should blended paragraphs get a calibration of their own?  The served calibration (one per LP)
against one per LP x {scored whole, blended}, on the calibration rows (cross-fitted) and on test.

Since the paragraph blend (:mod:`uamt.paragraphs`) serves a blended μ for the multi-sentence rows
of some pairs (en-de), one LP's calibration serves two kinds of row: sentences (narrow) and
paragraphs (wide).  On test en-de their ECE went .007 -> .025 (HTS, v3 -> v4).  This script refits
the served calibration with every blended row keyed ``<lp>|blended`` (the same family, candidate and
point mass, :func:`uamt.serving.model_calibration.refit_served`, on the same calibration rows), and
a variant that keeps each key on its LP's μ line (:class:`uamt.campaigns.LPAnchor`: only the level
and spread are the key's own), and measures each with the evaluate stage's code
(:func:`uamt.model_evaluation.measure`):

* ``cross-fitted``: the calibration rows, each document fold answered by the calibration refitted
  on the other folds (:func:`uamt.model_evaluation.cross_fitted_rows`, what the dev rule reads; it
  refits without an anchor, so the anchored variant is measured on test only);
* ``test``: as served.

Per LP of the blend, and per kind of row within it: ECE, CRPS, coverage and misses at 0.9, the
mean 90 % width; then the CRPS over all LPs.  First, per split the calibration drew on and test,
per kind: rows, documents and the least-squares line of the human score on the raw μ (how far the
splits differ).  Whether a row is blended is :meth:`uamt.paragraphs.ParagraphBlend.blended_rows`
of the model's own blend.

    python benchmarks/row_kind_calibration.py [--models hts point+signed_mondrian_conformal]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

KIND = "blended"
COLUMNS = (
    ("ece", "ECE", "{:.4f}"), ("crps", "CRPS", "{:.3f}"), ("coverage@0.9", "cov@.9", "{:.3f}"),
    ("miss_below@0.9", "below", "{:.3f}"), ("miss_above@0.9", "above", "{:.3f}"), ("width@0.9", "width", "{:.2f}"),
)


def flags(pipe, predicted: str, split: str, table):
    """Which rows of ``predictions/<split>/<predicted>.parquet`` the model's blend scores by units."""
    from uamt.paragraphs import ParagraphBlend
    from uamt.pipeline_config import read_split

    frame = read_split(pipe.prepared_dir, split, pipe.datasets)
    same = len(frame) == len(table) and (frame["seg_id"].astype(str).to_numpy() == table["seg_id"].astype(str).to_numpy()).all()
    if not same:
        raise SystemExit(f"predictions/{split}/{predicted}.parquet: rows do not match data/prepared/{split}.parquet; re-run dvc repro")
    blend = ParagraphBlend.from_model_dir(pipe.model_dir(predicted))
    return np.zeros(len(frame), dtype=bool) if blend is None else blend.blended_rows(frame)


def keyed(table, blended):
    from uamt.campaigns import campaign_key

    lp = table["lp"].astype(str).to_numpy(dtype=object)
    return table.assign(lp=np.where(blended, [campaign_key(x, KIND) for x in lp], lp))


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    from uamt.campaigns import LPAnchor, campaign_key
    from uamt.core.config import DEFAULT_PARAMS, load_section
    from uamt.data.datasets import scale_bounds
    from uamt.model_evaluation import ask, cross_fitted_rows, measure, row_documents, served_settings
    from uamt.pipeline_config import CALIBRATION_DIR, load_pipeline
    from uamt.quality import read_model
    from uamt.serving.model_calibration import refit_served, with_model_sigma, with_unseen_factor
    from uamt.uncertainty import EvaluationSettings
    from uamt.uncertainty.served import served_metrics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS)
    parser.add_argument("--calibration-dir", default=CALIBRATION_DIR)
    parser.add_argument("--models", nargs="+", default=["hts", "point+signed_mondrian_conformal"])
    args = parser.parse_args(argv)
    pipe = load_pipeline(args.params)
    settings = load_section(EvaluationSettings, "evaluate", args.params)
    bounds = scale_bounds(pipe.datasets)
    for model in args.models:
        predicted = model.partition("+")[0]
        test, served = read_model(pipe.predictions_dir, args.calibration_dir, model)
        parts = {s: pd.read_parquet(f"{pipe.predictions_dir}/{s}/{predicted}.parquet") for s in served.calibrated_on}
        rows = with_model_sigma(pd.concat(parts.values(), ignore_index=True), predicted)
        rows_blended = np.concatenate([flags(pipe, predicted, s, t) for s, t in parts.items()])
        test_blended = flags(pipe, predicted, "test", test)
        lps = sorted(set(test.loc[test_blended, "lp"].astype(str)))
        started = time.perf_counter()
        variants = {"per LP (served)": (served, False, None)}
        for name, anchor in (("per LP x kind", None), ("per LP x kind, LP's line", LPAnchor(served))):
            fitted = refit_served(keyed(rows, rows_blended), predicted, served, settings, anchor=anchor)
            fitted.reference_factors = served.reference_factors
            variants[name] = (with_unseen_factor(fitted, served.unseen_lp_sigma_factor), True, anchor)
        print(
            f"\n## {model}: calibrated on {'+'.join(served.calibrated_on)} ({len(rows):,} rows, {rows_blended.sum():,} "
            f"blended); test {len(test):,} rows, {test_blended.sum():,} blended (LPs {lps}); refits {time.perf_counter() - started:.0f} s"
        )
        print("\n| split | LP, kind | rows | documents | slope of human on μ | intercept |")
        print("|---|---|---|---|---|---|")
        for split, table in [*parts.items(), ("test", test)]:
            blended = flags(pipe, predicted, split, table)
            for lp in lps:
                for kind, rows_of in (("whole", ~blended), (KIND, blended)):
                    mask = rows_of & (table["lp"].astype(str).to_numpy() == lp)
                    slope, intercept = np.polyfit(table["mu"].to_numpy(float)[mask], table["human"].to_numpy(float)[mask], 1)
                    documents = row_documents(table[mask])
                    print(f"| {split} | {lp} {kind} | {mask.sum():,} | {len(set(documents.tolist())):,} | {slope:.2f} | {intercept:.2f} |")
        print("\n| split | calibration | rows | " + " | ".join(label for _, label, _ in COLUMNS) + " |")
        print("|---|---|---|" + "---|" * len(COLUMNS))
        for split, table, blended in (("cross-fitted", rows, rows_blended), ("test", test, test_blended)):
            kinds = keyed(table, blended)["lp"].to_numpy()
            for name, (calibration, by_kind, anchor) in variants.items():
                if split == "cross-fitted" and anchor is not None:
                    continue
                asked = kinds if by_kind else table["lp"]
                if split == "test":
                    answers = ask(calibration, table.assign(lp=asked), settings, bounds)
                else:
                    answers = cross_fitted_rows(table.assign(lp=asked), predicted, calibration, settings, bounds)[0]
                full = measure(calibration, answers, table, settings)
                by = served_metrics(answers, table["human"].to_numpy(float), kinds, docs=row_documents(table), settings=served_settings(settings))
                out = [(lp, full[lp]) for lp in lps]
                out += [(f"{lp} {kind}", by[key]) for lp in lps for kind, key in (("whole", lp), (KIND, campaign_key(lp, KIND)))]
                for label, m in out:
                    print(f"| {split} | {name} | {label} | " + " | ".join(fmt.format(m[key]) for key, _, fmt in COLUMNS) + " |")
                print(f"| {split} | {name} | all LPs (mean) | – | {full['avg']['crps']:.4f} |" + " – |" * (len(COLUMNS) - 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
