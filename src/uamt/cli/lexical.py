"""``uamt multihyp``: correlation with human scores of lexical metrics with multiple references/hypotheses."""

from __future__ import annotations

import argparse
import math
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "multihyp",
        help="score MT with sentence BLEU/chrF/TER using references and extra hypotheses; "
        "print each variant's Pearson r with human scores",
        description=(
            "Multi-reference and multi-hypothesis lexical scoring (Fomicheva et al. 2020, §4). "
            "All files hold one segment per line and must be aligned. Correlations are Pearson r "
            "with the human scores as computed: TER is an error rate (lower is better), so a TER "
            "variant that works correlates negatively with quality scores."
        ),
    )
    parser.add_argument("--mt", required=True, type=Path, help="MT output under evaluation")
    parser.add_argument(
        "--ref", action="append", default=[], type=Path, help="reference file (repeat for several)"
    )
    parser.add_argument(
        "--hyp",
        nargs="+",
        action="extend",
        default=[],
        type=Path,
        help="additional hypothesis files from the MT model (e.g. hyps/hyp.*.txt)",
    )
    parser.add_argument(
        "--pseudo",
        nargs="+",
        action="extend",
        default=[],
        type=Path,
        help="outputs of other MT systems used as pseudo-references (pseudo-* variants)",
    )
    parser.add_argument("--human", required=True, type=Path, help="human scores, one number per line")
    parser.add_argument("--metric", required=True, help="bleu, chrf or ter")
    parser.add_argument(
        "--hyp-refs",
        default="all",
        help="references used inside hypothesis variants: all (multi-reference) or first "
        "(the paper's Table 2 setting); default all",
    )
    parser.add_argument("--out", type=Path, help="also write the correlations to this JSON file")
    parser.set_defaults(handler=run_multihyp)


def _write_json_atomic(path: Path, payload: dict) -> None:
    from uamt.core.fileio import atomic_write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, payload, indent=2, allow_nan=True)


def run_multihyp(args: argparse.Namespace) -> int:
    from uamt import lexical
    from uamt.core.errors import DataError

    lexical._check_metric(args.metric)
    if args.hyp_refs not in lexical.HYP_REFS:
        raise DataError(f"hyp-refs={args.hyp_refs!r} not supported; choose from {list(lexical.HYP_REFS)}")
    if not args.ref and not args.hyp and not args.pseudo:
        raise DataError("give at least one --ref, --hyp or --pseudo file")

    texts = {str(args.mt): lexical.read_lines(args.mt)}
    for path in [*args.ref, *args.hyp, *args.pseudo]:
        texts[str(path)] = lexical.read_lines(path)
    human = lexical.read_scores(args.human)
    n = lexical.check_aligned({**texts, str(args.human): human})

    mt = texts[str(args.mt)]
    refs = [texts[str(p)] for p in args.ref]
    variants = lexical.reference_variants(mt, refs, args.metric) if refs else {}
    for prefix, paths in (("hyp", args.hyp), ("pseudo", args.pseudo)):
        if paths:
            hyps = [texts[str(p)] for p in paths]
            variants.update(
                lexical.multihyp_variants(mt, refs, hyps, args.metric, prefix=prefix, hyp_refs=args.hyp_refs)
            )
    pearson = lexical.correlations(variants, human)

    direction = "higher is better" if lexical.HIGHER_IS_BETTER[args.metric] else "lower is better"
    print(
        f"metric={args.metric} ({direction}); {n} segments; {len(args.ref)} reference(s), "
        f"{len(args.hyp)} hypothesis file(s), {len(args.pseudo)} pseudo-reference file(s)"
    )
    if not lexical.HIGHER_IS_BETTER[args.metric]:
        print("TER is an error rate: correlations are reported as computed, so negative r = agreement")
    width = max(len(name) for name in pearson)
    print(f"{'variant':<{width}}  pearson_r")
    for name, r in pearson.items():
        print(f"{name:<{width}}  {'nan' if math.isnan(r) else f'{r:+.4f}'}")

    if args.out:
        _write_json_atomic(
            args.out,
            {
                "metric": args.metric,
                "higher_is_better": lexical.HIGHER_IS_BETTER[args.metric],
                "n_segments": n,
                "mt": str(args.mt),
                "refs": [str(p) for p in args.ref],
                "hyps": [str(p) for p in args.hyp],
                "pseudo": [str(p) for p in args.pseudo],
                "hyp_refs": args.hyp_refs,
                "pearson": {k: (None if math.isnan(v) else v) for k, v in pearson.items()},
            },
        )
        print(f"wrote {args.out}")
    return 0
