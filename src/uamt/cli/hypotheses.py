"""``uamt hypotheses generate``: extra MT hypotheses (MC dropout, beams, diverse beams, samples)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hypotheses", help="generate additional MT hypotheses from a seq2seq MT model"
    )
    sub = parser.add_subparsers(dest="hypotheses_command", metavar="SUBCOMMAND")
    gen = sub.add_parser(
        "generate",
        help="write hyp.1.txt .. hyp.N.txt, top.txt and manifest.json aligned with the source",
        description=(
            "Generate N hypotheses per source segment with a transformers AutoModelForSeq2SeqLM "
            "(Marian, NLLB, M2M100, ...). mc-dropout: N decodings with dropout on (one file per "
            "pass); beam: the N best beams (one file per rank); diverse-beam: group beam search "
            "with Hamming diversity; sample: nucleus sampling. Several --model give one set each "
            "(an ensemble), numbered consecutively. The files plug into `uamt multihyp --hyp`."
        ),
    )
    gen.add_argument(
        "--model",
        action="append",
        required=True,
        help="HF seq2seq model folder or hub id (repeat for an ensemble)",
    )
    gen.add_argument("-s", "--source", required=True, type=Path, help="source text, one segment per line")
    gen.add_argument("--method", default="mc-dropout", help="mc-dropout, beam, diverse-beam or sample")
    gen.add_argument("--n", type=int, default=30, help="hypotheses per segment and model (default 30)")
    gen.add_argument("--dropout", type=float, default=0.3, help="mc-dropout probability (default 0.3)")
    gen.add_argument("--seed", type=int, default=0, help="seed; mc-dropout pass i uses seed + i")
    gen.add_argument("--batch-size", type=int, default=16)
    gen.add_argument("--device", default="cpu", help="cpu or cuda")
    gen.add_argument(
        "--num-beams",
        type=int,
        default=1,
        help="beam width of top.txt and of each mc-dropout pass (1 = greedy)",
    )
    gen.add_argument(
        "--max-new-tokens", type=int, default=None, help="default: the model's generation config"
    )
    gen.add_argument("--top-p", type=float, default=0.9, help="sample: nucleus mass (default 0.9)")
    gen.add_argument("--temperature", type=float, default=1.0, help="sample: softmax temperature")
    gen.add_argument("--diversity-penalty", type=float, default=0.5, help="diverse-beam: Hamming penalty")
    gen.add_argument("--num-beam-groups", type=int, default=None, help="diverse-beam: groups (default n)")
    gen.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's; 1 is fastest on busy boxes)",
    )
    gen.add_argument("--overwrite", action="store_true", help="replace hypotheses already in --out")
    gen.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    gen.add_argument("--out", required=True, type=Path, help="output folder")
    gen.set_defaults(handler=run_generate)

    def _usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(handler=_usage)


def run_generate(args: argparse.Namespace) -> int:
    from uamt.hypotheses import GenerationConfig, generate

    cfg = GenerationConfig(
        method=args.method,
        n=args.n,
        dropout=args.dropout,
        seed=args.seed,
        batch_size=args.batch_size,
        device=args.device,
        num_beams=args.num_beams,
        max_new_tokens=args.max_new_tokens,
        top_p=args.top_p,
        temperature=args.temperature,
        diversity_penalty=args.diversity_penalty,
        num_beam_groups=args.num_beam_groups,
        threads=args.threads,
    )
    manifest = generate(
        args.model, args.source, args.out, cfg, overwrite=args.overwrite, progress=not args.no_progress
    )
    t = manifest["timings"]
    print(
        f"wrote {args.out}/top.txt and {len(manifest['hypotheses'])} hypothesis files "
        f"(hyp.1.txt .. hyp.{len(manifest['hypotheses'])}.txt) for {manifest['n_segments']} segments; "
        f"{t['ms_per_segment_per_hypothesis']:.2f} ms/segment/hypothesis, load {t['load_s']:.1f} s"
    )
    return 0
