#!/usr/bin/env bash
# The tests CI skips without CUDA (tests/test_models_gpu.py, tests/test_hypotheses.py::test_generation_on_gpu),
# run on a lent GPU machine whose python3 holds a CUDA torch but not this project's pinned packages.
#
#   tests/gpu_checks.sh prepare   # here: wheels into .whl/, the mirror files the tests read into .gpu/
#   tests/gpu_checks.sh run       # there, from the repository root, with .whl and .gpu carried along
#
# Checked on an H200 (2026-11-26): torch 2.11.0+cu130, numpy 2.5.2 and pandas 3.0.6 of the machine's
# image with these wheels: 6 passed in 19 s.  Both folders are git-ignored (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
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
              torchmetrics lightning-utilities py3langid orjson; do pin "$p"; done)
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
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.gpu/\n' >>.git/info/exclude
    du -sh .whl .gpu
    ;;
run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:src:. UAMT_DATA_MIRROR=$PWD/.gpu/mirror HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    python3 -c "import torch, numpy, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__, 'transformers', transformers.__version__)"
    python3 -m pytest -q -p no:cacheprovider -rs tests/test_models_gpu.py "tests/test_hypotheses.py::test_generation_on_gpu"
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
