"""A critical-error detector mixed into the served distribution: what it adds on real rows and on
the challenge set.

The route measured (issue 25, "a head that can fit rare rows"): the HTS head leaves even its own
synthetic failure rows at mu -4 to -7 MQM (target -25; docs/quality.md), so the served risk of a
critical error stays below 0.5 for four of six modes.  Here a separate detector -- a logistic
regression on the encoder's pooled embeddings of mt, src (and ref) and cheap surface features --
is trained on the pipeline's d_q rows against the synthetic failure rows the pipeline adds
(``uamt.challenge.with_synthetic_failures(d_q, train_base.synthetic_failures, seed=train_base.seed)``,
the critical modes labelled 1, everything else 0).  Its probability ``p`` of a critical error is
mixed into the served distribution of the pipeline's model as a point mass at the non-translation
score (-25 MQM)::

    F_mix(x) = p * 1[x >= -25] + (1 - p) * F_served(x)

so the risk becomes ``p + (1 - p) * risk`` (for chi >= -25), the served score the mixture's mean
``p * -25 + (1 - p) * mu`` and the intervals and CRPS the mixture's quantiles.  Everything below is
measured on that one mixed distribution, against the same model served without it (``p = 0``, the
same quantile grid): per news dataset x LP of the test split PPS, AUROC of the risk for MQM <= -5,
recall of the worst 2 %, CRPS, coverage and width at 0.9; and the challenge set (300 perturbations
of good test rows per mode, seed 0, as benchmarks/challenge_set.py).  The detector never sees a
test row; the challenge set's perturbations come from the same generators as the training rows, so
its numbers are an upper bound on what the detector finds in the wild (as for the head itself).

    python benchmarks/critical_mixture.py --cache /tmp/embeddings [--qe] [--detector mlp --C 1 --seed 42] \
        [--variants="-2,-10"] [--leave-one-mode-out] [--json out.json]

``--leave-one-mode-out`` also trains the detector without each critical mode's synthetic rows in
turn and scores that mode's challenge rows with it: how far the detector reaches beyond the
failures it was shown.

Embeddings: the ``encode:`` section's encoder and cache (``--cache`` overrides the folder; the
perturbed texts are encoded into it, so give it a copy of ``cache/embeddings``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy.special import expit
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from uamt.challenge import MODES, NON_TRANSLATION_MQM, challenge_set, with_synthetic_failures
from uamt.core.config import load_section
from uamt.core.naming import SYNTHETIC_SYSTEM_PREFIX, is_synthetic
from uamt.data.datasets import scale_bounds
from uamt.encoders import EmbeddingCache, EncodeConfig, get_encoder
from uamt.models import load, load_train_config
from uamt.models.data import features_from_cache
from uamt.models.row_features import row_feature_matrix
from uamt.pipeline_config import load_pipeline, read_split
from uamt.quality import auroc_score, group_metrics, sentence_chrf
from uamt.serving.model_calibration import Calibration
from uamt.uncertainty import EvaluationSettings
from uamt.uncertainty.served import ServedRows, ServedSettings, quantile_crps, served_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from challenge_set import RISK_GOAL_MODES, summarise  # noqa: E402

#: Surface features the detector reads beside the embeddings (uamt.models.row_features).
DETECTOR_ROW_FEATURES = ("len_ratio_src", "copy_rate", "target_language_prob")
DETECTOR_REF_FEATURES = ("len_ratio_ref", "sentence_ratio_ref")
#: Quantile levels of the served distribution the mixture is computed from (mid-points).
GRID = 400


def embeddings(cache: EmbeddingCache, texts, layers: list[int]) -> np.ndarray:
    """Unit-norm mean over ``layers`` of the pooled per-layer embeddings, float32 [n, dim]."""
    texts = list(texts)
    out = []
    for start in range(0, len(texts), 8192):
        vectors = cache.get(texts[start : start + 8192])[:, layers, :].mean(axis=1)
        out.append(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    return np.concatenate(out).astype(np.float32)


def detector_inputs(cache: EmbeddingCache, rows: pd.DataFrame, layers: list[int], reference_free: bool) -> np.ndarray:
    """COMET-style pair features of mt with src (and ref) plus the surface features, [n, d]."""
    mt, src = embeddings(cache, rows["mt"], layers), embeddings(cache, rows["src"], layers)
    parts = [mt, src, mt * src, np.abs(mt - src), (mt * src).sum(axis=1, keepdims=True)]
    names = list(DETECTOR_ROW_FEATURES)
    if not reference_free:
        ref = embeddings(cache, rows["ref"], layers)
        parts += [ref, mt * ref, np.abs(mt - ref), (mt * ref).sum(axis=1, keepdims=True)]
        names += DETECTOR_REF_FEATURES
    parts.append(row_feature_matrix(rows.reset_index(drop=True), names, where="detector"))
    return np.hstack(parts).astype(np.float32)


def make_detector(kind: str, C: float, seed: int):
    """The classifier: ``logistic`` (L2, inverse strength ``C``) or ``mlp`` (one hidden layer of
    256, L2 strength ``alpha = 1 / (1000 C)``, early-stopped on a 10 % split of the training rows)."""
    if kind == "logistic":
        return LogisticRegression(C=C, max_iter=3000)
    if kind == "mlp":
        return MLPClassifier(hidden_layer_sizes=(256,), alpha=1.0 / C / 1000, early_stopping=True, random_state=seed, max_iter=200)
    raise ValueError(f"detector={kind!r} not supported; choose from ['logistic', 'mlp']")


def detector_logit(detector, x: np.ndarray) -> np.ndarray:
    """The detector's log-odds of a critical error, shape [n]."""
    if hasattr(detector, "decision_function"):
        return detector.decision_function(x)
    p = np.clip(detector.predict_proba(x)[:, 1], 1e-12, 1 - 1e-12)
    return np.log(p) - np.log1p(-p)


def critical_labels(rows: pd.DataFrame) -> np.ndarray:
    """1 for the synthetic critical errors, 0 for natural rows and the copied references."""
    return (is_synthetic(rows) & (rows["system"] != SYNTHETIC_SYSTEM_PREFIX + "reference")).to_numpy()


@dataclasses.dataclass
class Mixed:
    """The served answers of every row, shape [n] (quantiles [n, K])."""

    center: np.ndarray
    risk: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    quantiles: np.ndarray
    probs: np.ndarray


def _interp_rows(grid_probs: np.ndarray, grid_q: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Each row's quantile function (``grid_q`` [n, G] at ``grid_probs`` [G]) at its own ``levels`` [n, L]."""
    position = np.clip(np.interp(levels, grid_probs, np.arange(grid_probs.size)), 0, grid_probs.size - 1)
    low = np.floor(position).astype(int)
    high = np.minimum(low + 1, grid_probs.size - 1)
    weight = position - low
    take = np.take_along_axis
    return (1 - weight) * take(grid_q, low, axis=1) + weight * take(grid_q, high, axis=1)


def served_base(calibration, table: pd.DataFrame, bounds, thresholds) -> ServedRows:
    """The served distribution of ``table``'s raw ``mu``, ``sigma``, ``lp`` on a :data:`GRID`-level
    quantile grid, with its CDF at each of ``thresholds`` (chi and the point masses' locations)."""
    mu, sigma = table["mu"].to_numpy(float), table["sigma"].to_numpy(float)
    lp = table["lp"].astype(str).to_numpy(dtype=object)
    return served_rows(calibration, mu, sigma, lp, bounds=bounds, settings=ServedSettings(n_quantiles=GRID, risk_thresholds=tuple(thresholds)))


def mixed_answers(rows: ServedRows, p: np.ndarray, chi: float, gamma: float, k: int = 100, atom: float = NON_TRANSLATION_MQM) -> Mixed:
    """The served distribution ``rows`` (:func:`served_base`) with a point mass ``p`` (shape [n]) at
    ``atom`` (at most ``chi``): mean, risk at ``chi``, central ``gamma`` interval and ``k`` mid-point
    quantiles, all read from the mixture's CDF :math:`p\\,1[x \\ge a] + (1 - p) F(x)`."""
    if atom > chi:
        raise ValueError(f"atom={atom!r} must be at most chi={chi!r}: the risk adds the whole point mass")
    p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0 - 1e-9)
    at_atom = (1 - p) * rows.risk[atom]  # mixture CDF just below the atom

    def quantile(levels: np.ndarray) -> np.ndarray:
        levels = np.broadcast_to(levels, (p.size, levels.shape[-1]))
        below = levels < at_atom[:, None]
        above = levels > (at_atom + p)[:, None]
        base_level = np.where(below, levels / (1 - p)[:, None], (levels - p[:, None]) / (1 - p)[:, None])
        base = _interp_rows(rows.probs, rows.quantiles, np.clip(base_level, rows.probs[0], rows.probs[-1]))
        return np.where(below | above, base, atom)

    probs = (np.arange(k) + 0.5) / k
    ends = quantile(np.array([(1 - gamma) / 2, (1 + gamma) / 2]))
    return Mixed(
        center=p * atom + (1 - p) * rows.center,
        risk=p + (1 - p) * rows.risk[chi],
        lower=ends[:, 0],
        upper=ends[:, 1],
        quantiles=quantile(probs),
        probs=probs,
    )


def quality_rows(test: pd.DataFrame, table: pd.DataFrame, answers: Mixed, chi: float, label: str) -> list[dict]:
    """benchmarks/quality.py's numbers (:func:`uamt.quality.group_metrics`) of the mixed answers per
    dataset x LP and pooled, plus the mean CRPS."""
    human = table["human"].to_numpy(float)
    crps = quantile_crps(human, answers.probs, answers.quantiles)
    chrf = sentence_chrf(test["mt"], test["ref"])
    served = {"center": answers.center, "risk": answers.risk, "lower": answers.lower, "upper": answers.upper}
    out = []
    groups = list(test.groupby(["dataset", "lp"], sort=True).indices.items()) + [(("all", "all"), np.arange(len(test)))]
    for (dataset, lp), index in groups:
        metrics = group_metrics(human[index], {k: v[index] for k, v in served.items()}, chrf[index], chi=chi)
        out.append({"detector": label, "dataset": dataset, "lp": lp, **metrics, "crps": float(crps[index].mean())})
    return out


def leave_one_mode_out(args, seed, x_train, train_rows, labels, x_perturbed, perturbed, served_perturbed, extra) -> list[dict]:
    """For each critical mode: the detector (last ``--C``) trained without that mode's synthetic rows,
    scored on the challenge set's rows of that mode -- does it find a failure it never saw?"""
    out = []
    systems = train_rows["system"].astype(str).to_numpy()
    C = args.C[-1]
    for mode in RISK_GOAL_MODES:
        keep = systems != SYNTHETIC_SYSTEM_PREFIX + mode
        detector = make_detector(args.detector, C, seed).fit(x_train[keep], labels[keep])
        rows = (perturbed["mode"] == mode).to_numpy()
        logit = detector_logit(detector, x_perturbed[rows])
        row = {"mode": mode, "training_rows_dropped": int((~keep).sum()), "n": int(rows.sum())}
        for shift, atom in [(0.0, NON_TRANSLATION_MQM), *extra]:
            sub = SimpleNamespace(
                center=served_perturbed.center[rows], probs=served_perturbed.probs, quantiles=served_perturbed.quantiles[rows],
                risk={k: v[rows] for k, v in served_perturbed.risk.items()},
            )
            mixed = mixed_answers(sub, expit(logit + shift), args.chi, 0.9, atom=atom)
            row[f"p shift={shift:g}"] = float(expit(logit + shift).mean())
            row[f"risk shift={shift:g} atom={atom:g}"] = float(mixed.risk.mean())
        out.append(row)
    table = pd.DataFrame(out)
    print(f"\n## leave one mode out (detector {args.detector}, C={C:g}): each mode scored by a detector trained without it\n" + table.round(3).to_string(index=False))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--prepared", type=Path, default=Path("data/prepared"))
    parser.add_argument("--cache", type=Path, default=None, help="embedding cache (default: encode.cache_dir)")
    parser.add_argument("--qe", action="store_true", help="the reference-free model (models/hts_qe) and detector")
    parser.add_argument("--layers", default="-1", help="encoder layers averaged for the detector, e.g. -1 or 6,12")
    parser.add_argument("--detector", default="logistic", help="logistic or mlp")
    parser.add_argument(
        "--detector-fraction", type=float, default=None,
        help="share of synthetic failure rows the detector trains on (default: train_base.synthetic_failures, as the head)",
    )
    parser.add_argument("--seed", type=int, default=None, help="the MLP detector's seed (default: train_base.seed)")
    parser.add_argument("--C", type=float, nargs="+", default=[0.1], help="inverse L2 strength of the detector")
    parser.add_argument("--shifts", type=float, nargs="+", default=[0.0, -1.0, -2.0, -3.0, -4.0, -6.0], help="logit shifts tried on the calibration rows")
    parser.add_argument("--atoms", type=float, nargs="+", default=[-25.0, -15.0, -10.0, -7.5, -5.0], help="point-mass locations tried (<= --chi)")
    parser.add_argument(
        "--variants", default="", help='more "shift,atom" pairs reported on test and the challenge set, space-separated: --variants="-2,-10 -4,-5"'
    )
    parser.add_argument("--per-mode", type=int, default=300)
    parser.add_argument("--chi", type=float, default=-5.0)
    parser.add_argument("--leave-one-mode-out", action="store_true", help="also train the detector without each critical mode in turn")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    pipe = load_pipeline(args.params)
    method = "hts_qe" if args.qe else "hts"
    train_cfg = load_train_config("hts", args.params)
    encode = load_section(EncodeConfig, "encode", args.params)
    if args.cache is not None:
        encode = dataclasses.replace(encode, cache_dir=str(args.cache))
    cache = EmbeddingCache(encode.cache_dir, get_encoder(encode.encoder), dtype=encode.dtype)
    features = features_from_cache(cache)
    layers = [int(x) for x in args.layers.split(",")]
    bounds = scale_bounds(pipe.datasets)
    model = load(pipe.model_dir(method))
    calibration = Calibration.load(Path("calibration") / f"{method}.json")

    d_q = read_split(args.prepared, "d_q", pipe.datasets)
    # The detector's own rows: the pipeline's synthetic share (what the head saw) unless --detector-fraction
    fraction = train_cfg.synthetic_failures if args.detector_fraction is None else args.detector_fraction
    train_rows = with_synthetic_failures(d_q, fraction, seed=train_cfg.seed)
    labels = critical_labels(train_rows)
    start = time.perf_counter()
    x_train = detector_inputs(cache, train_rows, layers, args.qe)
    scaler = StandardScaler().fit(x_train)
    x_train = scaler.transform(x_train)
    test = read_split(args.prepared, "test", pipe.datasets)
    test = test[test["dataset"].isin(["wmt21_mqm", "wmt23_mqm"])].reset_index(drop=True)
    perturbed = challenge_set(test, MODES, per_mode=args.per_mode, seed=0, min_score=-1.0)
    originals = perturbed.assign(mt=perturbed["mt_original"])
    frames = {"test": test, "perturbed": perturbed, "original": originals}
    inputs = {name: scaler.transform(detector_inputs(cache, frame, layers, args.qe)) for name, frame in frames.items()}
    columns = ["src", "mt", "lp"] if args.qe else ["src", "mt", "ref", "lp"]
    raw = {name: model.predict(frame[columns].reset_index(drop=True), features).assign(lp=frame["lp"].to_numpy()) for name, frame in frames.items()}
    raw["test"] = raw["test"].assign(human=test["score"].to_numpy(float))
    print(f"{method}: {len(d_q):,} d_q rows + {int(labels.sum())} synthetic critical errors; features in {time.perf_counter() - start:.0f} s")

    report: dict = {"method": method, "detector": args.detector, "seed": args.seed, "detector_fraction": fraction, "layers": layers, "train_rows": len(train_rows), "critical_rows": int(labels.sum()), "runs": {}}
    extra = [tuple(map(float, v.split(","))) for v in args.variants.split()]
    thresholds = sorted({args.chi, NON_TRANSLATION_MQM, *args.atoms, *(atom for _, atom in extra)})
    served = {name: served_base(calibration, raw[name], bounds, thresholds) for name in frames}
    base = {name: mixed_answers(served[name], np.zeros(len(raw[name])), args.chi, 0.9) for name in frames}
    settings = load_section(EvaluationSettings, "evaluate", args.params)
    calibration_rows = pd.concat([read_split(args.prepared, s, pipe.datasets) for s in settings.calibration_splits], ignore_index=True)
    x_calibration = scaler.transform(detector_inputs(cache, calibration_rows, layers, args.qe))
    raw_calibration = model.predict(calibration_rows[columns].reset_index(drop=True), features).assign(lp=calibration_rows["lp"].to_numpy())
    y_calibration = calibration_rows["score"].to_numpy(float)
    served_calibration = served_base(calibration, raw_calibration, bounds, thresholds)
    for C in args.C:
        detector = make_detector(args.detector, C, args.seed if args.seed is not None else train_cfg.seed).fit(x_train, labels)
        logit = detector_logit(detector, x_calibration)
        fits = []
        for shift in args.shifts:
            for atom in args.atoms:
                answers = mixed_answers(served_calibration, expit(logit + shift), args.chi, 0.9, atom=atom)
                fits.append({"shift": shift, "atom": atom, "crps": float(quantile_crps(y_calibration, answers.probs, answers.quantiles).mean())})
        fits = pd.DataFrame(fits)
        none = mixed_answers(served_calibration, np.zeros(len(logit)), args.chi, 0.9)
        crps_none = float(quantile_crps(y_calibration, none.probs, none.quantiles).mean())
        best = fits.loc[fits["crps"].idxmin()]
        print(f"\n## detector C={C:g}: calibration rows ({', '.join(settings.calibration_splits)}, {len(logit):,}) CRPS without the mixture "
              f"{crps_none:.4f}; with it, per logit shift x atom:")
        print(fits.pivot(index="shift", columns="atom", values="crps").round(4).to_string())
        variants = [(0.0, NON_TRANSLATION_MQM), *extra]
        if best["crps"] < crps_none:
            variants.append((float(best["shift"]), float(best["atom"])))
        print("the calibration rows pick " + (f"shift {best['shift']:g}, atom {best['atom']:g}" if best["crps"] < crps_none else "no mixture"))
        answers = {"none": base}
        p = {"none": {name: np.zeros(len(frame)) for name, frame in frames.items()}}
        for shift, atom in variants:
            label = f"C={C:g} shift={shift:g} atom={atom:g}"
            p[label] = {name: expit(detector_logit(detector, inputs[name]) + shift) for name in frames}
            answers[label] = {name: mixed_answers(served[name], p[label][name], args.chi, 0.9, atom=atom) for name in frames}
        quality, challenge = [], []
        for label, answer in answers.items():
            quality += quality_rows(test, raw["test"], answer["test"], args.chi, label)
            scored = perturbed.assign(
                mu=answer["perturbed"].center, risk=answer["perturbed"].risk,
                mu_original=answer["original"].center, risk_original=answer["original"].risk,
            )
            modes = summarise(scored)
            modes = modes[modes["mode"] != "all"].assign(detector=label)
            modes["p"] = modes["mode"].map(pd.Series(p[label]["perturbed"]).groupby(perturbed["mode"].to_numpy()).mean())
            challenge += modes.to_dict("records")
            real = p[label]["test"]
            if label != "none":
                print(f"{label}: real test rows p mean {real.mean():.4f}, p > .5 on {(real > .5).sum()} rows; "
                      f"AUROC of p for MQM <= {args.chi:g} {auroc_score(real, test['score'].to_numpy(float) <= args.chi):.3f}; "
                      f"challenge originals p mean {p[label]['original'].mean():.4f}")
        quality, challenge = pd.DataFrame(quality), pd.DataFrame(challenge)
        for value in ("pps", "auroc_risk", "recall_worst", "crps", "coverage", "width"):
            print(f"\n{value}:\n" + quality.pivot_table(index=["dataset", "lp"], columns="detector", values=value, sort=False).round(3).to_string())
        for value in ("below_original", "risk", "p"):
            print(f"\n{value}:\n" + challenge.pivot_table(index="mode", columns="detector", values=value, sort=False).round(3).to_string())
        for label, goals in challenge.groupby("detector", sort=False):
            met = goals[goals["mode"].isin(RISK_GOAL_MODES)]
            print(f"{label}: risk >= .5 on {int((met['risk'] >= .5).sum())} of {len(met)} critical modes; below original >= .95 on "
                  f"{int((goals['below_original'] >= .95).sum())} of {len(goals)} modes")
        report["runs"][f"C={C:g}"] = {
            "calibration_crps": {"none": crps_none, "fits": fits.to_dict("records")},
            "quality": quality.to_dict("records"),
            "challenge": challenge.to_dict("records"),
        }
    if args.leave_one_mode_out:
        report["leave_one_mode_out"] = leave_one_mode_out(
            args, args.seed if args.seed is not None else train_cfg.seed, x_train, train_rows, labels, inputs["perturbed"], perturbed, served["perturbed"], extra)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
