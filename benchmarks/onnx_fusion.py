"""ONNX Runtime's BERT fusions on the MiniLM export: outputs versus the current export, and texts/s.

Fuses the exported graph with ``onnxruntime.transformers.optimizer.optimize_model`` (model_type
``bert``: EmbedLayerNormalization, Attention, BiasGelu, SkipLayerNormalization) and runs both graphs
under the session options :class:`uamt.encoders.onnx_runtime.OnnxPooledEncoder` uses
(``ORT_ENABLE_ALL``, the same intra-op threads) on real newstest2021 sentences.  Measured (
2 shared CPU cores, 1 thread, 300 is-en sources, batch 64): the fused graph differs by up to 1.4e-6
and is ~10% slower (90-92 vs 102-104 texts/s), so the export stays unfused.

Usage::

    UAMT_ONNX_CACHE=/tmp/onnx PYTHONPATH=src python benchmarks/onnx_fusion.py --texts 300
"""

from __future__ import annotations

import argparse
import copy
import re
import statistics
import time
from pathlib import Path

import numpy as np

NEWSTEST = "/work/shared/data/github/wmt-conference/wmt21-news-systems/xml/newstest2021.is-en.all.xml"


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort
    import torch
    from onnxruntime.transformers.optimizer import optimize_model

    from uamt.encoders import EncoderConfig, get_encoder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xml", default=NEWSTEST, help="WMT xml whose <seg> texts are encoded")
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="/tmp/encoder-fused.onnx")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    texts = re.findall(r'<seg id="\d+">(.*?)</seg>', Path(args.xml).read_text())[: args.texts]
    current = get_encoder(EncoderConfig(runtime="onnx", threads=args.threads))
    fused_model = optimize_model(
        str(current.folder / "encoder.onnx"), model_type="bert", num_heads=12, hidden_size=current.dim, opt_level=0
    )
    print("fused operators:", {k: v for k, v in fused_model.get_fused_operator_statistics().items() if v})
    fused_model.save_model_to_file(args.out)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    fused = copy.copy(current)  # same tokenizer and pooling, only the graph differs
    fused.session = ort.InferenceSession(args.out, sess_options=options, providers=["CPUExecutionProvider"])

    a = current.pooled_layers(texts, batch_size=args.batch_size).numpy()
    b = fused.pooled_layers(texts, batch_size=args.batch_size).numpy()
    print(f"{len(texts)} texts: identical={np.array_equal(a, b)} max|diff|={float(np.abs(a - b).max()):.3g}")
    for name, encoder in (("current", current), ("fused", fused)) * 2:  # interleaved: shared CPU drifts
        times = []
        for _ in range(3):
            start = time.perf_counter()
            encoder.pooled_layers(texts, batch_size=args.batch_size)
            times.append(time.perf_counter() - start)
        print(f"{name}: median {len(texts) / statistics.median(times):.1f} texts/s ({args.threads} thread(s))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
