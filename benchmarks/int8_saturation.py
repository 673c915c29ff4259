"""Does ONNX Runtime's dynamic-int8 MatMul compute exactly on this CPU, or does it saturate?

The default encoder runs an int8 graph: ``quantize_dynamic`` with ``QInt8`` per-channel weights and
``uint8`` activations quantised per call (:func:`uamt.encoders.onnx_runtime.quantize_onnx`). The integer
product of a ``uint8`` activation and an ``int8`` weight needs 16 bits. Where the CPU has no VNNI
(AVX2 alone), the kernel adds *pairs* of such products in 16 bits, which can saturate. With VNNI
or AMX the sums are exact int32. ``reduce_range=True`` (7-bit weights) keeps every pair inside 16
bits.

This quantises one 384 × 384 MatMul, as the encoder's are, both ways. It feeds activations with a
few outlier dimensions, as a transformer's LayerNorm outputs have, and compares ONNX Runtime's
output with the exact integer arithmetic the graph specifies (``DynamicQuantizeLinear``, then
int32 sums and the scales) and with float32. The error is relative to the largest output. The
exact arithmetic is reproduced to float rounding only where the kernel does not saturate.

    python benchmarks/int8_saturation.py [--outlier 20] [--seed 0]

Measured 2026-12-06 on an AMD EPYC with AVX2 and no VNNI (the 2-core VM of docs/pipeline.md, "On a
fresh AVX2 host"): the default export is 3.7e-01 from exact, against 7.2e-08 with reduce_range (7-bit weights), which is 3.7e-02 from float32.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import numpy as np


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return f"{model}; " + " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in wanted)


def exact_dynamic_int8(x: np.ndarray, weight_q: np.ndarray, weight_scale: np.ndarray) -> np.ndarray:
    """What the quantised graph specifies: ``x`` [n, K] quantised to uint8 with one scale and zero
    point over its range (which includes 0), times int8 ``weight_q`` [K, N], in int64, times the
    scales (``weight_scale`` [N], one per output channel; zero weight points)."""
    low, high = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = np.float32((high - low) / 255.0)
    zero_point = np.clip(np.round(-low / scale), 0, 255)
    x_q = np.clip(np.round(x / scale) + zero_point, 0, 255).astype(np.int64)
    return ((x_q - zero_point) @ weight_q.astype(np.int64)) * float(scale) * weight_scale[None, :].astype(np.float64)


def measure(reduce_range: bool, outlier: float, seed: int, size: int = 384, rows: int = 64) -> dict[str, float]:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(seed)
    weight = rng.normal(0.0, 0.05, (size, size)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, size])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with tempfile.TemporaryDirectory() as tmp:
        float_path, int8_path = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        onnx.save(model, float_path)
        logging.disable(logging.WARNING)  # the quantiser's advice to pre-process
        try:
            quantize_dynamic(
                float_path, int8_path, weight_type=QuantType.QInt8, per_channel=True,
                op_types_to_quantize=["MatMul"], reduce_range=reduce_range,
            )
        finally:
            logging.disable(logging.NOTSET)
        quantised = onnx.load(int8_path)
        arrays = {i.name: numpy_helper.to_array(i) for i in quantised.graph.initializer}
        weight_q = next(v for v in arrays.values() if v.dtype == np.int8 and v.shape == (size, size))
        weight_scale = next(v for k, v in arrays.items() if "scale" in k and v.size == size)
        session = ort.InferenceSession(str(int8_path), providers=["CPUExecutionProvider"])
        x = rng.normal(0.0, 1.0, (rows, size)).astype(np.float32)
        x[:, :8] *= outlier
        got = session.run(None, {"x": x})[0].astype(np.float64)
    exact = exact_dynamic_int8(x, weight_q, weight_scale)
    reference = x.astype(np.float64) @ weight.astype(np.float64)
    return {
        "vs_exact": float(np.abs(got - exact).max() / np.abs(exact).max()),
        "vs_float32": float(np.abs(got - reference).max() / np.abs(reference).max()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outlier", type=float, default=20.0, help="scale of the 8 outlier dimensions")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import onnxruntime

    print(f"CPU: {cpu_flags()}; onnxruntime {onnxruntime.__version__}")
    for reduce_range in (False, True):
        got = measure(reduce_range, args.outlier, args.seed)
        label = "reduce_range=True (7-bit weights)" if reduce_range else "default export (the encoder's)"
        print(f"{label}: max |ort - exact| / max |exact| = {got['vs_exact']:.1e}; vs float32 {got['vs_float32']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
