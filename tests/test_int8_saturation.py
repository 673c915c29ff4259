"""benchmarks/int8_saturation.py: its exact integer arithmetic is what ONNX Runtime computes where
no 16-bit pair can saturate (7-bit weights), on any CPU."""

from benchmarks.int8_saturation import measure


def test_the_exact_arithmetic_matches_onnx_runtime_with_7_bit_weights():
    got = measure(reduce_range=True, outlier=20.0, seed=0, size=64, rows=8)
    assert got["vs_exact"] < 1e-5
    assert got["vs_float32"] < 0.1  # quantised, so close to float32 but not equal
