"""The replayed call on a real GPU (issue 13; the gpu tier): what the CPU tests check with
stand-ins, against CuPy's and torch's own objects: a recorded call's arrays are reused only
once nothing references them (CuPy's reference counts as fusec reads them), a result held,
viewed or reached through its memory keeps its values, another stream gets arrays of its own,
new arrays of a recorded shape (and a misaligned view) give their own results, torch tensors
replay on torch's stream."""
import numpy as np
import pytest
from helpers import ROOT

import fusec
from fusec.errors import ArgumentError

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
SBR = str(ROOT / "examples/scale_bias_relu.fz")


def expected(x, s, b):
    return np.maximum(cp.asnumpy(x) * np.float32(s) + np.float32(b), np.float32(0))


def check(y, x, s, b):
    np.testing.assert_allclose(cp.asnumpy(y), expected(x, s, b), rtol=1e-5, atol=1e-6)  # x * s + b: one FMA there


def test_a_dropped_result_is_reused_and_a_held_one_keeps_its_values():
    import weakref
    f = fusec.jit(SBR, backend="cuda")
    x = cp.random.standard_normal(4096, dtype=cp.float32)
    for _ in range(3):
        f(x, 1.0, 0.0)
    address = f(x, 1.0, 0.0).data.ptr
    assert f(x, 2.0, 1.0).data.ptr == address  # CuPy's own counts: nothing held it, so it was taken again
    held = [f(x, float(k), 0.5) for k in range(4)]  # each held: each its own array
    assert len({y.data.ptr for y in held}) == 4
    for k, y in enumerate(held):
        check(y, x, float(k), 0.5)
    # The two arrays the call keeps, each reached otherwise than by the array itself
    for reach in (lambda y: y[1:], lambda y: y.data, lambda y: y.data.mem, weakref.ref):
        a, b = f(x, 5.0, 0.5), f(x, 6.0, 0.5)
        reached = reach(a), reach(b)
        del a, b
        for _ in range(4):
            z = f(x, -1.0, 0.25)
            assert not any(isinstance(r, weakref.ref) and r() is z for r in reached)
        del z
        cp.cuda.Device().synchronize()
        for scale, r in zip((5.0, 6.0), reached):
            if isinstance(r, weakref.ref):
                r = r()
                if r is None:  # no longer kept by the call: freed, never taken again
                    continue
            elif not isinstance(r, cp.ndarray):  # a MemoryPointer, or its memory
                r = cp.ndarray((4096,), cp.float32, r if isinstance(r, cp.cuda.MemoryPointer) else
                               cp.cuda.MemoryPointer(r, 0))
            check(r, x[1:] if r.size == 4095 else x, scale, 0.5)
    for _ in range(4):  # y = f(x) in a loop: the result before is held while the call runs
        y = f(x, 3.0, 0.0)
        check(y, x, 3.0, 0.0)


def test_another_stream_gets_arrays_of_its_own():
    f = fusec.jit(SBR, backend="cuda")
    x = cp.random.standard_normal(4096, dtype=cp.float32)
    for _ in range(3):
        f(x, 1.0, 0.0)
    address = f(x, 1.0, 0.0).data.ptr
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        y = f(x, 2.0, 0.0)
        assert y.data.ptr != address
        check(y, x, 2.0, 0.0)


def test_new_arrays_of_a_recorded_shape_and_a_misaligned_view_give_their_own_results():
    f = fusec.jit(SBR, backend="cuda")
    xs = [cp.random.standard_normal(4097, dtype=cp.float32) for _ in range(6)]
    for x in xs:
        check(f(x[:4096], 1.5, -0.25), x[:4096], 1.5, -0.25)
        check(f(x[1:], 1.5, -0.25), x[1:], 1.5, -0.25)  # 4 bytes off: not the vector variant
    assert len(f._runner._calls) == 2  # aligned and not: a recorded call each


def test_torch_tensors_replay_into_torch_tensors():
    torch = pytest.importorskip("torch")
    f = fusec.jit(SBR, backend="cuda")
    ts = [torch.randn(4096, device="cuda") for _ in range(4)]
    for t in ts * 2:
        y = f(t, 2.0, 0.5)
        assert isinstance(y, torch.Tensor) and y.is_cuda and y.shape == t.shape and y.stride() == (1,)
        torch.testing.assert_close(y, torch.relu(t * 2.0 + 0.5), rtol=1e-5, atol=1e-6)
    grad = torch.randn(4096, device="cuda", requires_grad=True)
    with torch.no_grad():
        for _ in range(3):
            f(grad, 1.0, 0.0)
    with pytest.raises(ArgumentError, match="requires grad"):
        f(grad, 1.0, 0.0)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # torch's current stream: the launch goes there
        y = f(ts[0], 3.0, 0.0)
    side.synchronize()
    torch.testing.assert_close(y, torch.relu(ts[0] * 3.0), rtol=1e-5, atol=1e-6)
