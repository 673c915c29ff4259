"""``uamt rerank`` and ``uamt select-for-annotation``: decisions from the served distribution.

Both read a table (``.csv``, ``.tsv``, ``.jsonl`` or ``.parquet``), score it with a registered (or
local) model through the same predictor as ``uamt score`` and write their answer atomically;
options are checked before the model is loaded.  See docs/decisions.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from uamt.cli.scoring import finite_float, language_pair, nonnegative_int, positive_int, probability

RERANK_EXAMPLES = """\
input: one row per candidate, columns group, src, mt (optional ref, lp, and any others, carried to
the output); every candidate of a group translates the same source.

examples:
  uamt rerank --input candidates.csv --out picks.jsonl                  # lcb rule, abstain at risk > 0.5
  uamt rerank --input candidates.csv --out picks.csv --rule mbr_lcb --mbr-max-refs 8
  uamt rerank --input hyps.parquet --out picks.jsonl --rule risk --risk-threshold -5 --max-risk 0.3
  uamt rerank -s src.txt --hyp hyps/hyp.1.txt --hyp hyps/hyp.2.txt --hyp hyps/hyp.3.txt --out picks.jsonl --rule mbr
"""

SELECT_EXAMPLES = """\
input: one unlabelled row per translation, columns src, mt, lp (optional ref, doc, system, seg_id,
dataset); output: the chosen rows in the incoming-annotations format with an empty score column.
Fill in the scores and drop the file into data/incoming/: the next retrain tick ingests it.

examples:
  uamt select-for-annotation --pool pool.parquet --budget 250 --out to_annotate.csv --dataset wmt23_mqm
  uamt select-for-annotation --pool pool.csv --budget 100 --out batch.tsv --strategy uncertainty \\
      --model models:/uamt-ensemble@champion
"""


def register(subparsers) -> None:
    rerank = subparsers.add_parser(
        "rerank",
        help="choose one translation per group of candidates (mu, lcb, risk, mbr, mbr_lcb), or abstain",
        description=(
            "Score every candidate with the calibrated model and pick one per group by a rule: mu "
            "(highest served mu), lcb (highest lower end of the served interval at --confidence), risk "
            "(lowest P(Q <= chi)), mbr / mbr_lcb (each candidate scored with the group's other candidates "
            "as references, highest served mu / lower bound of that). A pick whose risk exceeds "
            "--max-risk is marked abstain (route to a human). Output: one row per group."
        ),
        epilog=RERANK_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rerank.add_argument("--input", type=Path, metavar="FILE", help="candidates table (or --src with --hyp)")
    rerank.add_argument(
        "-s", "--src", type=Path, metavar="FILE",
        help="instead of --input: source sentences, one per line; line i is group i",
    )
    rerank.add_argument(
        "--hyp", action="append", default=[], type=Path, metavar="FILE",
        help="with --src: one file of candidates per rank, line-aligned (repeat; e.g. the hyps/hyp.*.txt "
        "of `uamt hypotheses generate`)",
    )
    rerank.add_argument("-r", "--ref", type=Path, metavar="FILE", help="with --src: references, line-aligned")
    rerank.add_argument("--out", required=True, type=Path, help="picks: .jsonl, .csv or .tsv")
    rerank.add_argument("--group-column", default="group", help="column naming each candidate's group (default group)")
    rerank.add_argument("--rule", default="lcb", help="mu, lcb, risk, mbr or mbr_lcb (default lcb)")
    rerank.add_argument("--confidence", type=probability, default=0.9, help="level of the served interval (default 0.9)")
    rerank.add_argument(
        "--risk-threshold", type=finite_float, metavar="CHI", help="risk = P(Q <= CHI) (default: the scale's own)"
    )
    rerank.add_argument("--max-risk", type=probability, default=0.5, metavar="P", help="abstain when the pick's risk > P (default 0.5)")
    rerank.add_argument(
        "--mbr-max-refs", type=positive_int, default=8, metavar="K",
        help="MBR rules: at most K other candidates per candidate as references (seeded; default 8)",
    )
    rerank.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the MBR reference sample")
    rerank.add_argument("--lp", type=language_pair, help="language pair of every row (else the lp column, if any)")
    _model_options(rerank)
    rerank.set_defaults(handler=run_rerank)

    select = subparsers.add_parser(
        "select-for-annotation",
        help="choose the unlabelled rows whose human score would teach the model most",
        description=(
            "Score a pool of unlabelled translations and choose --budget of them by epistemic sigma "
            "(the model's disagreement with itself), with diversity over documents and language pairs "
            "(--strategy diversity, default), by sigma alone (uncertainty) or at random; written in the "
            "incoming-annotations format with an empty score column."
        ),
        epilog=SELECT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    select.add_argument("--pool", required=True, type=Path, metavar="FILE", help="unlabelled rows")
    select.add_argument("--budget", required=True, type=positive_int, metavar="N", help="rows to choose")
    select.add_argument("--out", required=True, type=Path, help="the rows to annotate: .csv or .tsv")
    select.add_argument("--strategy", default="diversity", help="diversity (default), uncertainty or random")
    select.add_argument("--dataset", help="dataset (score scale) of the annotations when the pool has no dataset column")
    select.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random strategy")
    _model_options(select)
    select.set_defaults(handler=run_select)


def _model_options(p: argparse.ArgumentParser) -> None:
    from uamt.core.config import DEFAULT_PARAMS

    p.add_argument("--model", help="MLflow model URI or local pyfunc folder (default: the registered champion)")
    p.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="params file for register.model_name")
    p.add_argument("--batch-size", type=positive_int, default=64, help="segments per model batch (default 64)")


def _write_table(frame, path: Path) -> None:
    from uamt.core.fileio import atomic_write_text
    from uamt.serving.text_io import json_safe

    if path.suffix == ".jsonl":
        import json

        text = "".join(json.dumps(json_safe(r), ensure_ascii=False) + "\n" for r in frame.to_dict(orient="records"))
    else:
        text = frame.to_csv(index=False, sep="\t" if path.suffix == ".tsv" else ",")
    atomic_write_text(path, text)


def _check_out(path: Path, suffixes: tuple[str, ...], source: Path) -> None:
    from uamt.core.errors import UamtError

    if path.suffix not in suffixes:
        raise UamtError(f"--out {path}: suffix must be one of {list(suffixes)}")
    if not path.parent.is_dir():
        raise UamtError(f"--out {path}: folder {path.parent} does not exist")
    if path.resolve() == source.resolve():
        raise UamtError(f"--out {path} is the input file")


def _frame_for_model(table, lp: str | None, with_ref: bool):
    import pandas as pd

    from uamt.core.errors import DataError

    for column in ("src", "mt") + (("ref",) if with_ref else ()):
        if column not in table.columns:
            raise DataError(f"column {column!r} missing (have {sorted(map(str, table.columns))})")
        empty = table[column].isna() | (table[column].astype(str).str.strip() == "")
        if empty.any():
            raise DataError(f"row {int(empty.to_numpy().nonzero()[0][0]) + 1}: column {column!r} is empty")
    frame = pd.DataFrame({"src": table["src"].astype(str), "mt": table["mt"].astype(str)})
    if with_ref:
        frame["ref"] = table["ref"].astype(str)
    if lp is not None:
        frame["lp"] = lp
    elif "lp" in table.columns:
        frame["lp"] = table["lp"].astype(str)
    return frame.reset_index(drop=True)


def _candidates(args: argparse.Namespace):
    """The candidates table of ``--input``, or built from ``--src`` and the ``--hyp`` files (group =
    line number, ``hyp_rank`` = which file), the output path checked first."""
    import pandas as pd

    from uamt.core.errors import UamtError
    from uamt.decisions.annotation import read_table
    from uamt.serving.text_io import read_aligned

    if (args.input is None) == (args.src is None):
        raise UamtError("give the candidates either as --input FILE or as --src FILE with --hyp FILE ...")
    if args.input is not None:
        if args.hyp or args.ref:
            raise UamtError("--hyp and --ref go with --src; --input reads them from the table")
        _check_out(args.out, (".jsonl", ".csv", ".tsv"), args.input)
        return read_table(args.input).reset_index(drop=True)
    if len(args.hyp) < 2:
        raise UamtError("--src needs at least two --hyp files (the candidates of each line)")
    for path in (args.src, *args.hyp, *([args.ref] if args.ref else [])):
        _check_out(args.out, (".jsonl", ".csv", ".tsv"), path)
    texts = read_aligned({"src": [args.src], "mt": args.hyp, "ref": [args.ref] if args.ref else []})
    src = texts["src"][0]
    rows = [
        {"group": line, "src": src[line - 1], "mt": hyps[line - 1], "hyp_rank": rank, "hyp_file": str(path),
         **({"ref": texts["ref"][0][line - 1]} if args.ref else {})}
        for line in range(1, len(src) + 1)
        for rank, (path, hyps) in enumerate(zip(args.hyp, texts["mt"], strict=True), start=1)
    ]
    if args.group_column != "group":
        raise UamtError("--group-column applies to --input tables; with --src the group is the line number")
    return pd.DataFrame(rows)


def run_rerank(args: argparse.Namespace) -> int:
    import pandas as pd

    from uamt.core.errors import UamtError
    from uamt.decisions.rerank import MBR_RULES, RerankSettings, check_rule, pseudo_reference_lists, rerank
    from uamt.serving.scores import load_scoring_predictor, predict

    try:
        check_rule(args.rule)
    except ValueError as exc:
        raise UamtError(str(exc)) from None
    if not 0 < args.confidence < 1:
        raise UamtError(f"--confidence must be in (0, 1), got {args.confidence}")
    table = _candidates(args)
    if args.group_column not in table.columns:
        raise UamtError(f"{args.input or args.src}: no group column {args.group_column!r} (columns: {list(table.columns)})")
    mbr = args.rule in MBR_RULES
    has_ref = "ref" in table.columns and not mbr
    frame = _frame_for_model(table, args.lp, has_ref)
    references = None
    if mbr:  # before loading the model: a group of one candidate is refused here
        references = pseudo_reference_lists(
            table[args.group_column], frame["mt"], max_refs=args.mbr_max_refs, seed=args.seed
        )
    predictor, uri = load_scoring_predictor(args.model, has_references=has_ref or mbr, params_path=args.params)
    chi = args.risk_threshold if args.risk_threshold is not None else predictor.scale.default_risk_threshold
    settings = dict(confidence=args.confidence, risk_threshold=chi, batch_size=args.batch_size, progress=False)
    if mbr:
        # Every candidate against the others as references: served mu / lower of that are the MBR
        # utility; the candidate's own served distribution (no reference) is not needed.
        out = predict(predictor, frame.assign(refs=references), **settings)
        scored = table.assign(
            mu=out["mu"].to_numpy(), lower=out["lower"].to_numpy(), upper=out["upper"].to_numpy(),
            risk=out["risk"].to_numpy(), mbr_mu=out["mu"].to_numpy(), mbr_lower=out["lower"].to_numpy(),
        )
    else:
        out = predict(predictor, frame, **settings)
        scored = table.assign(**{c: out[c].to_numpy() for c in ("mu", "lower", "upper", "risk")})
    picks = rerank(scored, RerankSettings(rule=args.rule, max_risk=args.max_risk), group_column=args.group_column)
    picks = picks.drop(columns=[c for c in ("mbr_mu", "mbr_lower") if c in picks.columns])
    picks.insert(4, "risk_threshold", chi)
    _write_table(pd.DataFrame(picks), args.out)
    print(
        f"reranked {len(table)} candidates in {len(picks)} groups -> {args.out} (rule {args.rule}, "
        f"{int(picks['abstain'].sum())} abstained at P(Q <= {chi:g}) > {args.max_risk:g}; {uri})",
        file=sys.stderr,
    )
    return 0


def run_select(args: argparse.Namespace) -> int:
    import numpy as np

    from uamt.core.errors import UamtError
    from uamt.data.datasets import DATASETS
    from uamt.decisions.annotation import annotation_frame, check_strategy, read_table, select_rows
    from uamt.serving.scores import load_scoring_predictor, predict

    try:
        check_strategy(args.strategy)
    except ValueError as exc:
        raise UamtError(str(exc)) from None
    _check_out(args.out, (".csv", ".tsv"), args.pool)
    pool = read_table(args.pool).reset_index(drop=True)
    if "dataset" not in pool.columns:
        if args.dataset is None:
            raise UamtError(f"{args.pool}: no dataset column; pass --dataset (one of {sorted(DATASETS)})")
    if args.dataset is not None and args.dataset not in DATASETS:
        raise UamtError(f"dataset={args.dataset!r} not supported; choose from {sorted(DATASETS)}")
    if "lp" not in pool.columns:
        raise UamtError(f"{args.pool}: column 'lp' missing (the incoming format needs the language pair)")
    has_ref = "ref" in pool.columns
    frame = _frame_for_model(pool, None, has_ref)
    if args.strategy == "random":
        uncertainty, source = np.zeros(len(pool)), "none (random)"
    else:
        predictor, uri = load_scoring_predictor(args.model, has_references=has_ref, params_path=args.params)
        out = predict(predictor, frame, confidence=0.9, risk_threshold=predictor.scale.default_risk_threshold,
                      batch_size=args.batch_size, progress=False)
        if "epistemic_var" in out.columns:
            uncertainty, source = np.sqrt(out["epistemic_var"].to_numpy(dtype=float)), f"epistemic sigma of {uri}"
        else:
            uncertainty, source = out["sigma"].to_numpy(dtype=float), f"served sigma of {uri}"
            print(
                f"uamt select-for-annotation: warning: {predictor.method} gives no epistemic part; ranking by "
                "its served sigma (aleatoric included). An ensemble or MC-dropout model (--model) separates them.",
                file=sys.stderr,
            )
    rows = select_rows(
        uncertainty, args.budget, strategy=args.strategy,
        docs=pool["doc"] if "doc" in pool.columns else None, lps=pool["lp"], seed=args.seed,
    )
    chosen = annotation_frame(pool, rows, dataset=args.dataset or "", source=args.pool.name)
    _write_table(chosen, args.out)
    print(
        f"chose {len(chosen)} of {len(pool)} rows by {args.strategy} ({source}) -> {args.out}: fill in the "
        "score column and drop the file into data/incoming/",
        file=sys.stderr,
    )
    return 0
