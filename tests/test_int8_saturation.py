"""benchmarks/int8_saturation.py: its exact integer arithmetic is what ONNX Runtime computes where
no 16-bit pair can saturate (7-bit weights), on any CPU; its float64 rewrite of the real encoder's
MatMulInteger nodes computes that arithmetic."""

from benchmarks.int8_saturation import measure


def test_the_exact_arithmetic_matches_onnx_runtime_with_7_bit_weights():
    got = measure(reduce_range=True, outlier=20.0, seed=0, size=64, rows=8)
    assert got["vs_exact"] < 1e-5
    assert got["vs_float32"] < 0.1  # quantised, so close to float32 but not equal


def test_the_exact_rewrite_computes_the_integer_arithmetic_the_graph_specifies(tmp_path):
    """With 8-bit weights (where this CPU's kernel may saturate) the float64 rewrite of
    MatMulInteger gives the exact sums: equal to numpy's int64 arithmetic."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from benchmarks.int8_saturation import (
        exact_dynamic_int8,
        int8_weight_and_scales,
        quantise_as_exported,
        save_one_matmul,
        with_exact_integer_matmuls,
    )

    rng = np.random.default_rng(1)
    weight = rng.normal(0.0, 0.05, (64, 32)).astype(np.float32)
    save_one_matmul(weight, tmp_path / "float.onnx")
    quantise_as_exported(tmp_path / "float.onnx", tmp_path / "int8.onnx", reduce_range=False)
    with_exact_integer_matmuls(tmp_path / "int8.onnx", tmp_path / "exact.onnx")
    exact_graph = onnx.load(tmp_path / "exact.onnx")
    assert "MatMulInteger" not in {node.op_type for node in exact_graph.graph.node}
    weight_q, weight_scale = int8_weight_and_scales(tmp_path / "exact.onnx", (64, 32))
    x = rng.normal(0.0, 1.0, (8, 64)).astype(np.float32)
    x[:, :4] *= 20.0
    got = ort.InferenceSession(str(tmp_path / "exact.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    expected = exact_dynamic_int8(x, weight_q, weight_scale)
    assert np.abs(got - expected).max() / np.abs(expected).max() < 1e-6
