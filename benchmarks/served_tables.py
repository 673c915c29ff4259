"""Markdown tables of the served-distribution metrics, as the README shows them.

Reads ``metrics/test.json`` (per model and LP), ``metrics/conditional.json`` (worst cells, risk
reliability, baselines, held-out LPs, goals) and ``metrics/dev.json`` (cross-fitted dev, what the gate
reads), and prints:

1. per model and LP: PPS, CRPS, ECE with its document-clustered floor, coverage / width / lower and
   upper misses at 0.9, UPS and ENCE of the served sd next to the model's raw sigma;
2. per model: the served calibration, σ's weight λ the calibrate stage chose (``dev.json``
   ``sigma_weight``; none: the model has no σ, or a file from before the choice) and whether it is
   rearranged in μ (``calibration/<model>.json`` holds ``rearrangement_mu``) and where its risk is read
   (``risk_lattice``: at ⌊χ/step⌋·step + offset; none: at χ), what it adds over the
   point estimate + the same calibration (CRPS, width, worst cells, low-score coverage), the risk
   reliability and the held-out LPs, with the goals met and, in brackets, how many of the missed ones
   lie within their sampling band of the bound (``within_band``: one test sample does not decide them)
   and how many stay missed as the worst of their family (``beyond_chance``: decided by this sample).

    python benchmarks/served_tables.py [--metrics metrics] [--calibration-dir calibration]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def fmt(value, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def per_lp_table(test: dict) -> list[str]:
    """The first table's lines (header included) from ``metrics/test.json``: per model and LP."""
    lines = [
        "| model | LP | n | PPS | CRPS | ECE (floor) | cov@0.9 | width@0.9 | miss below / above | UPS served / raw | ENCE served / raw |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, by_lp in test.items():
        for lp, m in by_lp.items():
            lines.append(
                f"| {model} | {lp} | {m['n']:,} | {fmt(m.get('pps'))} | {fmt(m.get('crps'))} | "
                f"{fmt(m.get('ece'))} ({fmt(m.get('ece_floor'))}) | {fmt(m.get('coverage@0.9'))} | "
                f"{fmt(m.get('width@0.9'), '.2f')} | {fmt(m.get('miss_below@0.9'))} / {fmt(m.get('miss_above@0.9'))} | "
                f"{fmt(m.get('ups'))} / {fmt(m.get('ups_raw'))} | {fmt(m.get('ence'))} / {fmt(m.get('ence_raw'))} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=Path, default=Path("metrics"))
    parser.add_argument("--calibration-dir", type=Path, default=Path("calibration"))
    args = parser.parse_args(argv)
    for name in ("test.json", "conditional.json", "dev.json"):
        if not (args.metrics / name).is_file():
            parser.error(f"--metrics {args.metrics}: no {name} there (--metrics names the folder of the metrics files)")
    test = json.loads((args.metrics / "test.json").read_text())
    conditional = json.loads((args.metrics / "conditional.json").read_text())
    held_out = args.metrics / "held_out.json"  # evaluate_ood's, after register: the unseen-pair goal
    if held_out.is_file():
        from uamt.uncertainty.goals import with_held_out

        conditional = with_held_out(conditional, json.loads(held_out.read_text()))
    dev = json.loads((args.metrics / "dev.json").read_text())

    print("\n".join(per_lp_table(test)))
    print()
    print(
        "| model | served | CRPS (baseline) | width (baseline) | worst sd cell | worst μ cell | cov MQM≤−5 | "
        "risk max gap | held-out LPs cov | dev CRPS x-fit (baseline) | goals met (misses within band; beyond chance) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model, s in conditional.items():
        goals = {g["key"]: g for g in s["goals"]}
        base = s.get("baseline") or {}
        held = s.get("held_out") or {}
        cov = ", ".join(f"{lp} {fmt(c)}" for lp, c in (held.get("coverage_by_lp") or {}).items()) or "–"
        base_name = base.get("name")
        dev_base = dev.get(base_name, {}).get("avg", {}).get("crps") if base_name else None
        weight = (dev.get(model, {}).get("sigma_weight") or {}).get("chosen")
        served = s["served"] if weight is None else f"{s['served']}, λ = {weight:g}"
        path = args.calibration_dir / f"{model}.json"
        calibration = json.loads(path.read_text()) if path.is_file() else {}
        if calibration.get("rearrangement_mu"):
            served += ", rearranged in μ"
        lattice = calibration.get("risk_lattice") or {}
        if lattice:
            step, offset = float(lattice["step"]), float(lattice["offset"])
            floor = "⌊χ⌋" if step == 1 else f"⌊χ/{step:g}⌋·{step:g}"
            served += f", risk at {floor} + {offset:g}"
        met = sum(g["met"] is True for g in s["goals"])
        judged = sum(g["met"] is not None for g in s["goals"])
        near = sum(g["met"] is False and g.get("within_band") is True for g in s["goals"])
        decided = sum(g.get("beyond_chance") is True for g in s["goals"])
        print(
            f"| {model} | {served} | {fmt(s.get('crps'))} ({fmt(base.get('crps'))}) | "
            f"{fmt(s.get('width'), '.2f')} ({fmt(base.get('width'), '.2f')}) | "
            f"{fmt(goals['worst_sd_cell_gap']['value'])} | {fmt(goals['worst_mu_cell_gap']['value'])} | "
            f"{fmt(goals['low_score_coverage']['value'])} | {fmt(goals['risk_max_gap']['value'])} | {cov} | "
            f"{fmt(dev.get(model, {}).get('avg', {}).get('crps'))} ({fmt(dev_base)}) | {met}/{judged} ({near}; {decided}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
