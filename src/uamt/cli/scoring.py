"""``uamt score``, ``uamt compare`` and ``uamt serve``: what an MT team runs on its translations.

Every input is checked (options by argparse: finite numbers, non-negative seeds; files readable,
within the size limits, UTF-8, no empty or invisible-only line, no CR inside a line, same line
counts, output folder present and not an input) before the model is loaded; results are written
only when all segments are scored (temp file + ``os.replace``), so a failed run leaves no partial
file.  Lines longer than the encoder reads are named in a warning on stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

DEFAULT_CONFIDENCE = 0.9


# ----------------------------------------------------------------------------- option types
# Checked by argparse, so a bad value is refused (exit 2, the option named) before any file is
# read or any model loaded.
def finite_float(text: str) -> float:
    """A float that is not NaN or infinite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def probability(text: str) -> float:
    """A finite float in [0, 1]."""
    value = finite_float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1], got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def nonnegative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def language_pair(text: str) -> str:
    """``xx-yy``: two ISO 639 codes of 2-3 lowercase letters (checked before any model is loaded)."""
    from uamt.serving.language_pair import parse_language_pair

    try:
        return parse_language_pair(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_model_options(p: argparse.ArgumentParser) -> None:
    from uamt.core.config import DEFAULT_PARAMS

    p.add_argument(
        "--model",
        help="MLflow model URI (models:/NAME@ALIAS, runs:/ID/model) or local pyfunc folder; default "
        "models:/NAME@champion with NAME = params register.model_name (else uamt-comet), "
        "NAME-qe for reference-free scoring",
    )
    p.add_argument(
        "--params", type=Path, default=DEFAULT_PARAMS, help="params file for register.model_name (optional)"
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        help="level of the central intervals, in (0, 1) (default 0.9)",
    )
    p.add_argument(
        "--risk-threshold",
        type=finite_float,
        help="chi of risk = P(Q <= chi), on the model's score scale (default: the scale's own)",
    )
    p.add_argument(
        "--batch-size", type=positive_int, default=64, help="segments per model batch (default 64)"
    )


def _add_input_options(p: argparse.ArgumentParser, *, several_mt: bool, required: bool = True) -> None:
    # required=False: `uamt score --input FILE` reads the texts from a table instead (checked in run_score).
    p.add_argument("-s", "--src", required=required, type=Path, help="source sentences, one per line (UTF-8)")
    if several_mt:
        p.add_argument(
            "-t",
            "--mt",
            required=True,
            action="append",
            type=Path,
            help="translations of one system, line-aligned with --src (repeat: one per system)",
        )
    else:
        p.add_argument("-t", "--mt", required=required, type=Path, help="translations, line-aligned with --src")
    p.add_argument(
        "-r",
        "--ref",
        action="append",
        default=[],
        type=Path,
        help="reference translations (repeat for several; none: a reference-free model is needed)",
    )
    p.add_argument(
        "--ref-combination",
        choices=("average", "sample"),
        default="average",
        help="several references: average the per-reference predictions (default), or sample one "
        "reference per segment at random (S-N variant, seeded by --seed)",
    )
    p.add_argument(
        "--lp",
        type=language_pair,
        help="language pair xx-yy of the segments, ISO 639 codes (selects per-LP calibration where the "
        "model has it; rows whose text contradicts it are scored as an unseen pair, with a warning)",
    )
    p.add_argument(
        "--seed", type=nonnegative_int, default=0, help="seed of reference sampling and the bootstrap (>= 0)"
    )
    p.add_argument(
        "--bootstrap",
        type=nonnegative_int,
        default=0,
        metavar="N",
        help="also give bootstrap intervals/probabilities from N resamples of the segments (default 0: off)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--max-segment-chars",
        type=positive_int,
        default=None,
        metavar="N",
        help="refuse a line longer than N characters (default 100000: almost always lost line breaks)",
    )
    p.add_argument(
        "--max-file-bytes",
        type=positive_int,
        default=None,
        metavar="N",
        help="refuse an input file larger than N bytes (default 104857600 = 100 MiB)",
    )


def register(subparsers) -> None:
    score = subparsers.add_parser(
        "score",
        help="score translations: per segment mu, sigma, interval and risk; system score with interval",
        description=(
            "Score each translation with the calibrated model: mean quality mu, standard deviation "
            "sigma, central interval [lower, upper] and risk = P(Q <= chi), on the human-score scale "
            "the model was calibrated on. Output: JSON lines (one per segment, then a summary line "
            "with the scale and the system score), or CSV/TSV by --out suffix."
        ),
    )
    _add_input_options(score, several_mt=False, required=False)
    _add_model_options(score)
    score.add_argument(
        "--out",
        type=Path,
        help="output file: .jsonl, .csv or .tsv (default: JSON lines on stdout); with --input: the "
        "output folder of Parquet parts",
    )
    score.add_argument(
        "--campaign",
        metavar="NAME",
        help="predict the judgements of this annotation campaign (e.g. wmt23_mqm): the model's calibration "
        "fitted on that campaign's rows of the segments' language pair (`uamt models` lists them under "
        "calibration.campaigns); default: the language pair's calibration over all its campaigns",
    )
    score.add_argument(
        "--input",
        type=Path,
        metavar="FILE",
        help="batch scoring: a .parquet or .csv table with columns src, mt (optional ref, lp) instead of "
        "-s/-t/-r; writes --out DIR as Parquet parts (row, mu, sigma, lower, upper, risk), streamed "
        "partition by partition; a restarted run skips the parts already written",
    )
    score.add_argument(
        "--dask",
        metavar="local:N|tcp://HOST:PORT",
        help="with --input: score the partitions on Dask, a LocalCluster of N worker processes on this "
        "machine or a running scheduler (default: in this process)",
    )
    score.add_argument(
        "--partition-rows",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --input: rows per partition and output part (default 10000); memory grows with it",
    )
    score.add_argument(
        "--flag-below",
        type=finite_float,
        metavar="CHI",
        help="flag segments whose P(Q <= CHI) exceeds --max-risk (critical-error detection); with --input: "
        "columns flagged (and flag_risk) in every part",
    )
    score.add_argument(
        "--max-risk",
        type=probability,
        metavar="P",
        help="with --flag-below: flag when the risk exceeds P (default 0.5)",
    )
    score.set_defaults(handler=run_score)

    compare = subparsers.add_parser(
        "compare",
        help="compare systems on the same segments: scores with intervals and P(A better than B)",
        description=(
            "Score every system's translations of the same sources and give each system's score with "
            "its interval and, for every pair, P(A better than B) under a normal approximation "
            "(independent segments) and, with --bootstrap N, a paired bootstrap."
        ),
    )
    _add_input_options(compare, several_mt=True)
    _add_model_options(compare)
    compare.add_argument("--out", type=Path, help="also write the full comparison as JSON (.json)")
    compare.set_defaults(handler=run_compare)

    serve = subparsers.add_parser(
        "serve",
        help="REST server: POST /invocations (MLflow JSON) -> mu, sigma, interval, risk",
        description=(
            "Serve the calibrated model over HTTP. POST /invocations takes MLflow's dataframe_records, "
            "dataframe_split or inputs JSON of {src, mt, ref?|refs?, lp?}; GET /health, /ping, /version, "
            "/metadata (what the model was trained and calibrated on). "
            "The model is loaded once at startup; clients can never choose a model or a file."
        ),
    )
    _add_model_options(serve)
    serve.add_argument(
        "--reference-free",
        action="store_true",
        help="default model: the reference-free one (models:/NAME-qe@champion)",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)"
    )
    serve.add_argument("--port", type=int, default=5000, help="port (default 5000, as `mlflow models serve`)")
    serve.add_argument("--max-batch", type=int, default=256, help="most segments per request (default 256)")
    serve.add_argument(
        "--max-chars", type=int, default=2000, help="most characters per text field (default 2000)"
    )
    serve.add_argument("--max-refs", type=int, default=8, help="most references per record (default 8)")
    serve.add_argument(
        "--max-pairs",
        type=int,
        default=1024,
        help="most (segment, reference) scoring passes per request (default 1024)",
    )
    serve.add_argument(
        "--max-body-bytes", type=int, default=16 * 1024 * 1024, help="largest request body (default 16 MiB)"
    )
    serve.add_argument(
        "--max-work-chars",
        type=int,
        default=None,
        help="work budget of one request: characters the model reads, src + mt + reference of every "
        "scoring pass (default 60,000: about 5 s on 2 CPU cores); more: 413",
    )
    serve.add_argument(
        "--max-waiting",
        type=int,
        default=64,
        help="requests that may wait for the model while one is scored (default 64); more: 503 + Retry-After",
    )
    serve.add_argument(
        "--request-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="limit per request from admission to answer, waiting included (default 30): not at the model "
        "by then: 503 + Retry-After; still scoring: stopped, 504",
    )
    serve.set_defaults(handler=run_serve)


def _check_common(args) -> None:
    from uamt.serving.scores import validate_settings

    validate_settings(
        confidence=args.confidence, batch_size=args.batch_size, bootstrap=getattr(args, "bootstrap", 0)
    )


def _read_limits(args) -> dict:
    from uamt.serving.text_io import MAX_FILE_BYTES, MAX_SEGMENT_CHARS

    return {
        "max_file_bytes": args.max_file_bytes or MAX_FILE_BYTES,
        "max_segment_chars": args.max_segment_chars or MAX_SEGMENT_CHARS,
    }


def _input_paths(args) -> list[Path]:
    mts = args.mt if isinstance(args.mt, list) else [args.mt]
    return [args.src, *mts, *args.ref]


def _warn_truncated(command: str, predictor, texts: dict[str, list[list[str]]], args) -> dict:
    """Print which input lines the encoder cuts (stderr); return {file: [lines]} for the summary."""
    from uamt.serving.scores import truncated_lines, truncation_warning

    by_file: dict[str, list[str]] = {}
    for role, paths in (("src", [args.src]), ("mt", args.mt if isinstance(args.mt, list) else [args.mt])):
        for path, lines in zip(paths, texts[role], strict=True):
            by_file.setdefault(str(path), lines)
    for path, lines in zip(args.ref, texts["ref"], strict=True):
        by_file.setdefault(str(path), lines)
    truncated = truncated_lines(predictor, by_file)
    warning = truncation_warning(command, truncated, getattr(predictor, "max_tokens", None))
    if warning:
        print(warning, file=sys.stderr)
    return truncated


def _language_pair(command: str, predictor, frame, texts: dict, lp: str | None):
    """The LP whose calibration scores each row of ``frame`` (given, else detected row by row from
    the first source and translation files; rows that contradict a given LP or whose pair is
    undetermined are scored as unseen) with ``frame``'s ``lp`` column set; messages go to stderr.
    ``frame`` may hold the rows once per system (``uamt compare``)."""
    from uamt.serving.language_pair import predictor_language_pair

    choice = predictor_language_pair(predictor, texts["src"][0], texts["mt"][0], lp)
    frame = choice.assign(frame, repeat=len(frame) // max(len(texts["src"][0]), 1))
    for message in choice.messages():
        print(f"uamt {command}: {message}", file=sys.stderr)
    return frame, choice


def run_score(args: argparse.Namespace) -> int:
    from uamt.core.errors import UamtError
    from uamt.serving import scorer
    from uamt.serving.scores import (
        build_frame,
        load_scoring_predictor,
        score_summary,
        segment_records,
        validate_settings,
    )
    from uamt.serving.text_io import check_output_path, read_aligned, render_segments

    _check_common(args)
    if args.max_risk is not None and args.flag_below is None:
        raise UamtError("--max-risk needs --flag-below CHI (the quality threshold the risk is about)")
    if args.input is not None:
        return run_score_batch(args)
    batch_only = [o for o, v in (("--dask", args.dask), ("--partition-rows", args.partition_rows)) if v is not None]
    if batch_only:
        raise UamtError(f"{', '.join(batch_only)} only apply to batch scoring with --input FILE")
    if args.src is None or args.mt is None:
        raise UamtError("the following arguments are required: -s/--src, -t/--mt (or --input FILE)")
    max_risk = args.max_risk
    if args.flag_below is not None and max_risk is None:
        max_risk = 0.5
    if max_risk is not None and args.flag_below is None:
        raise UamtError("--max-risk needs --flag-below CHI (the quality threshold the risk is about)")
    validate_settings(confidence=args.confidence, max_risk=max_risk)
    fmt = check_output_path(args.out, inputs=_input_paths(args)) if args.out else "jsonl"
    texts = read_aligned({"src": [args.src], "mt": [args.mt], "ref": args.ref}, **_read_limits(args))
    frame = build_frame(
        texts["src"][0],
        texts["mt"][0],
        texts["ref"],
        ref_combination=args.ref_combination,
        seed=args.seed,
        lp=args.lp,
    )
    if args.campaign is not None:
        frame["campaign"] = args.campaign
    predictor, uri = load_scoring_predictor(
        args.model, has_references=bool(args.ref), params_path=args.params
    )
    truncated = _warn_truncated("score", predictor, texts, args)
    chi = args.risk_threshold
    if chi is None:
        chi = args.flag_below if args.flag_below is not None else predictor.scale.default_risk_threshold
    scored = scorer.score_texts(
        predictor,
        frame,
        scorer.ScoringSettings(args.confidence, chi, args.batch_size),
        lp=args.lp,
        progress=not args.no_progress and len(frame) > args.batch_size,
    )
    out, lp_choice = scored.out, scored.lp_choice
    for message in lp_choice.messages():
        print(f"uamt score: {message}", file=sys.stderr)
    flag_risk = None
    if args.flag_below is not None:
        # The flag reads the served risk at its own threshold: a second pass of the same scoring path.
        flag_risk = scorer.served_flag_risk(
            predictor, frame, scored, scorer.FlagSettings(args.flag_below, max_risk), lp=args.lp
        )
    records = segment_records(
        out, flag_below=args.flag_below, max_risk=max_risk, risk_threshold=chi, flag_risk=flag_risk
    )
    summary = score_summary(
        predictor,
        out,
        model=uri,
        confidence=args.confidence,
        risk_threshold=chi,
        n_bootstrap=args.bootstrap,
        seed=args.seed,
        n_references=len(args.ref),
        ref_combination=args.ref_combination,
        flag_below=args.flag_below,
        max_risk=max_risk,
        records=records,
        truncated=truncated,
        max_tokens=getattr(predictor, "max_tokens", None),
    )
    summary.update(lp_choice.to_summary())
    if lp_choice.messages():
        summary["warnings"] = lp_choice.messages()
    if fmt in ("csv", "tsv"):
        records = [{**r, "scale": summary["scale"]} for r in records]
    text = render_segments(fmt, records, summary)
    if args.out:
        from uamt.serving.text_io import atomic_write_text

        atomic_write_text(args.out, text)
        print(_summary_line(summary, args.out) + lp_choice.note(), file=sys.stderr)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


def run_score_batch(args: argparse.Namespace) -> int:
    """``uamt score --input FILE --out DIR [--dask ...]``: see :mod:`uamt.serving.batch`."""
    from uamt.core.errors import UamtError
    from uamt.registry.store import tracking_uri
    from uamt.serving.batch import (
        DEFAULT_PARTITION_ROWS,
        BatchSettings,
        input_columns,
        print_progress,
        score_file,
        summary_line,
    )
    from uamt.serving.scores import default_model_uri, validate_settings

    line_options = {
        "-s/--src": args.src is not None,
        "-t/--mt": args.mt is not None,
        "-r/--ref": bool(args.ref),
        "--bootstrap": bool(args.bootstrap),
        "--campaign (give a campaign column)": args.campaign is not None,
    }
    clashing = [option for option, given in line_options.items() if given]
    if clashing:
        raise UamtError(f"--input reads src, mt and ref from the table: drop {', '.join(clashing)}")
    if args.out is None:
        raise UamtError("--input needs --out DIR (the folder of Parquet parts)")
    columns = input_columns(args.input)
    model = args.model or default_model_uri(reference_free="ref" not in columns, params_path=args.params)
    validate_settings(confidence=args.confidence, max_risk=args.max_risk)
    # As for one file: without --risk-threshold, the risk column is the flag's own probability.
    risk_threshold = args.risk_threshold if args.risk_threshold is not None else args.flag_below
    settings = BatchSettings(
        model=model,
        confidence=args.confidence,
        risk_threshold=risk_threshold,
        flag_below=args.flag_below,
        max_risk=args.max_risk,
        batch_size=args.batch_size,
        partition_rows=args.partition_rows or DEFAULT_PARTITION_ROWS,
        lp=args.lp,
        tracking_uri=tracking_uri(),
    )
    result = score_file(
        args.input,
        args.out,
        settings,
        dask=args.dask,
        log=None if args.no_progress else print_progress,
        warn=lambda message: print(f"uamt score: warning: {message}", file=sys.stderr, flush=True),
    )
    # Which calibration the rows got (per row: --lp, the lp column, or detected from the texts).
    for message in result.lps.messages():
        print(f"uamt score: {message}", file=sys.stderr)
    print(summary_line(result) + result.lps.note(), file=sys.stderr)
    return 0


def _summary_line(summary: dict, out) -> str:
    level = f"{round(100 * summary['confidence'], 2):g}%"
    line = (
        f"scored {summary['n_segments']} segments -> {out}; system score {summary['system_score']:.4f} "
        f"({level} interval [{summary['system_lower']:.4f}, {summary['system_upper']:.4f}]) "
        f"on scale {summary['scale']} ({summary['method']}, {summary['model']})"
    )
    if "n_flagged" in summary:
        line += (
            f"; {summary['n_flagged']} flagged (P(Q <= {summary['flag_below']:g}) > {summary['max_risk']:g})"
        )
    if summary.get("n_clipped"):
        low, high = summary["scale_range"]
        line += f"; {summary['n_clipped']} clipped to the scale's range [{low:g}, {high:g}]"
    if summary.get("truncated_lines"):
        line += f"; {sum(map(len, summary['truncated_lines'].values()))} lines truncated by the encoder"
    return line


def _system_names(paths: list[Path]) -> list[str]:
    names = [str(p) for p in paths]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if names.count(name) == 1 else f"{name}#{seen[name]}")
    return unique


def run_compare(args: argparse.Namespace) -> int:
    import pandas as pd

    from uamt.serving import scorer
    from uamt.serving.compare import compare_outputs, comparison_table
    from uamt.serving.scores import build_frame, load_scoring_predictor
    from uamt.serving.text_io import atomic_write_text, check_output_path, json_safe, read_aligned

    _check_common(args)
    if args.out:
        check_output_path(args.out, {".json": "json"}, inputs=_input_paths(args))
    texts = read_aligned({"src": [args.src], "mt": args.mt, "ref": args.ref}, **_read_limits(args))
    names = _system_names(args.mt)
    # The same reference draw for every system (sample mode), so the comparison stays paired.
    frames = [
        build_frame(
            texts["src"][0],
            mt,
            texts["ref"],
            ref_combination=args.ref_combination,
            seed=args.seed,
            lp=args.lp,
        )
        for mt in texts["mt"]
    ]
    predictor, uri = load_scoring_predictor(
        args.model, has_references=bool(args.ref), params_path=args.params
    )
    _warn_truncated("compare", predictor, texts, args)
    chi = args.risk_threshold if args.risk_threshold is not None else predictor.scale.default_risk_threshold
    n = len(frames[0])
    # One LP for every system (detected on the first one's translations): the comparison stays paired.
    joined, lp_choice = _language_pair("compare", predictor, pd.concat(frames, ignore_index=True), texts, args.lp)
    # The rows' pairs are chosen above, on the first system: scored as given (no detection per system).
    out = scorer.score_texts(
        predictor,
        joined,
        scorer.ScoringSettings(args.confidence, chi, args.batch_size),
        detect_lp=False,
        progress=not args.no_progress and len(joined) > args.batch_size,
    ).out
    outputs = {name: out.iloc[k * n : (k + 1) * n].reset_index(drop=True) for k, name in enumerate(names)}
    bounds = getattr(predictor.scale, "bounds", None)
    result = compare_outputs(
        outputs, confidence=args.confidence, n_bootstrap=args.bootstrap, seed=args.seed, bounds=bounds
    )
    result = {
        "scale": predictor.scale.name,
        "scale_description": predictor.scale.description,
        **({"scale_range": list(bounds)} if bounds is not None else {}),
        "method": predictor.method,
        "model": uri,
        "n_segments": n,
        "n_references": len(args.ref),
        **({"ref_combination": args.ref_combination} if len(args.ref) > 1 else {}),
        "risk_threshold": chi,
        **lp_choice.to_summary(),
        **({"warnings": lp_choice.messages()} if lp_choice.messages() else {}),
        **result,
    }
    for system, name in zip(result["systems"], names, strict=True):
        frame = outputs[name]
        system["mean_risk"] = float(frame["risk"].mean())
    if args.out:
        import json

        atomic_write_text(args.out, json.dumps(json_safe(result), indent=2, allow_nan=False) + "\n")
    sys.stdout.write(comparison_table(result))
    sys.stdout.flush()
    return 0


def run_serve(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from uamt.core.errors import UamtError
    from uamt.serving.predictor import load_predictor
    from uamt.serving.rest import MAX_WORK_CHARS, ScoringService, ServeSettings, registered_version
    from uamt.serving.scores import default_model_uri

    try:
        from uamt.serving.server import make_server
    except ImportError as exc:  # fastapi / uvicorn: the serve extra
        raise UamtError(
            f"uamt serve needs the REST server's libraries ({exc.name} is not installed): pip install 'uamt[serve]'"
        ) from None

    _check_common(args)
    for option, value in (
        ("--max-batch", args.max_batch),
        ("--max-chars", args.max_chars),
        ("--max-body-bytes", args.max_body_bytes),
        ("--max-refs", args.max_refs),
        ("--max-pairs", args.max_pairs),
        ("--max-work-chars", args.max_work_chars if args.max_work_chars is not None else 1),
    ):
        if value < 1:
            raise UamtError(f"{option} must be >= 1, got {value}")
    if args.max_waiting < 0:
        raise UamtError(f"--max-waiting must be >= 0, got {args.max_waiting}")
    if not (math.isfinite(args.request_timeout) and args.request_timeout > 0):
        raise UamtError(f"--request-timeout must be a number of seconds > 0, got {args.request_timeout}")
    if not 0 <= args.port <= 65535:
        raise UamtError(f"--port must be in 0..65535, got {args.port}")
    model = args.model or default_model_uri(reference_free=args.reference_free, params_path=args.params)
    settings = ServeSettings(
        confidence=args.confidence,
        risk_threshold=args.risk_threshold,
        batch_size=args.batch_size,
        max_batch=args.max_batch,
        max_chars=args.max_chars,
        max_body_bytes=args.max_body_bytes,
        max_refs=args.max_refs,
        max_pairs=args.max_pairs,
        max_work_chars=args.max_work_chars if args.max_work_chars is not None else MAX_WORK_CHARS,
        max_waiting=args.max_waiting,
        request_timeout_s=args.request_timeout,
    )
    service = ScoringService(load_predictor(model), model, settings, registered_version(model))
    server, sock = make_server(service, args.host, args.port)
    host, port = sock.getsockname()[:2]
    predictor = service.predictor
    print(
        f"uamt serve: {model} ({predictor.method}, scale {predictor.scale.name}) on http://{host}:{port} "
        f"[{json.dumps(asdict(settings))}]",
        file=sys.stderr,
        flush=True,
    )
    server.run(sockets=[sock])  # until Ctrl-C / SIGTERM (uvicorn's graceful shutdown)
    return 0
