"""The vector/scalar choice, run in the sim: aligned arrays take the 16-byte
variant (with a scalar tail for odd lengths); offsets into a larger buffer,
and broadcast rows that do not hold whole vectors, take the scalar one; both
give the reference's results."""
import numpy as np
import pytest
from helpers import ROOT, assert_matches, load_program

import fusec

pytestmark = pytest.mark.sim


def sim(example):
    f = fusec.jit(str(ROOT / "examples" / f"{example}.fz"), backend="sim")
    return f, f._runner.backend


def reference(example, *args):
    from fusec.reference import run
    return run(load_program(ROOT / "examples" / f"{example}.fz"), load_program(
        ROOT / "examples" / f"{example}.fz").pipelines[0].name, *args)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 1023, 1024, 1027])
def test_aligned_arrays_take_the_vector_variant_with_a_tail(n):
    f, backend = sim("scale_bias_relu")
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    assert_matches(f(x, 1.5, -0.25), reference("scale_bias_relu", x, 1.5, -0.25))
    assert backend.launched[-1] == "scale_bias_relu_k0_v4"


@pytest.mark.parametrize("offset", [1, 2, 3, 4])
def test_offsets_into_a_larger_buffer(offset):
    f, backend = sim("scale_bias_relu")
    base = np.random.default_rng(offset).standard_normal(1000 + offset).astype(np.float32)
    x = base[offset:]
    out = np.empty(1000 + 4, np.float32)[offset % 4:][:1000]
    assert_matches(f(x, 2.0, 1.0, out=out), reference("scale_bias_relu", x, 2.0, 1.0))
    aligned = x.ctypes.data % 16 == 0 and out.ctypes.data % 16 == 0
    assert backend.launched[-1] == ("scale_bias_relu_k0_v4" if aligned else "scale_bias_relu_k0")


@pytest.mark.parametrize("cols", [8, 16, 12, 7])
def test_broadcast_rows_must_hold_whole_vectors(cols):
    f, backend = sim("bias_gelu")
    rng = np.random.default_rng(cols)
    h = rng.standard_normal((5, cols)).astype(np.float16)
    b = rng.standard_normal(cols).astype(np.float16)
    expected = h.copy()
    reference("bias_gelu", expected, b)
    f(h, b)
    assert_matches(h, expected)
    assert backend.launched[-1] == ("bias_gelu_k0_v8" if cols % 8 == 0 else "bias_gelu_k0")


def test_misaligned_broadcast_operand_takes_the_scalar_variant():
    f, backend = sim("bias_gelu")
    h = np.ones((4, 16), np.float16)
    b = np.ones(17, np.float16)[1:]  # 2-byte aligned
    expected = h.copy()
    reference("bias_gelu", expected, b)
    f(h, b)
    assert_matches(h, expected)
    assert backend.launched[-1] == "bias_gelu_k0"


def test_mixed_widths_widen_the_vector_of_a_light_kernel():
    f, backend = sim("quantize")
    buffer = np.empty(1001 + 8, np.float32)  # x 32-byte aligned: 8 f32 move as one vector
    start = (-buffer.ctypes.data % 32) // 4
    x = buffer[start:start + 1001]
    x[:] = np.linspace(-200, 200, 1001)
    assert_matches(f(x, 1.0), reference("quantize", x, 1.0))
    # f32 in, i8 and bool out: 8 elements, so the narrow stores move 8 bytes (32 bytes of f32)
    assert backend.launched[-1] == "quantize_k0_v8"
    assert_matches(f(x[:13], 1.0), reference("quantize", x[:13], 1.0))  # one vector and a tail of 5


def test_mixed_widths_keep_16_bytes_of_the_widest_in_a_heavy_kernel():
    from fusec.compiler import compile_pipeline
    program = load_program(ROOT / "tests/programs/numerics.fz")
    (launch,) = compile_pipeline(program, "ints").interface.kernels  # i32 and i8, integer division: 22 registers
    vector, scalar = launch.variants
    assert scalar.est_regs > 16 and vector.elements_per_thread == 4
