"""The plain call's fast path (`executor._Call`): a call whose arrays have the
signatures of two earlier ones replays the launches recorded at the second,
checking only its scalars. In the sim, against the reference and the checked path."""
import numpy as np
import pytest
from helpers import ROOT, assert_matches

import fusec
from fusec.errors import ArgumentError

pytestmark = pytest.mark.sim
SBR = str(ROOT / "examples/scale_bias_relu.fz")


def relu(x, s, b):
    return np.maximum(x * np.float32(s) + np.float32(b), np.float32(0))


def test_a_repeated_call_replays_with_new_scalars_and_new_outputs():
    f = fusec.jit(SBR, backend="sim")
    x = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
    f(x, 0.0, 0.0)
    runner = f._runner
    assert not runner._calls  # seen once: nothing recorded
    y1 = f(x, 1.5, -0.25)
    assert len(runner._calls) == 1  # seen twice: recorded
    launched = len(runner.backend.launched)
    y2 = f(x, -2.0, 0.5)  # the same array: the fast path, with the new scalars
    assert len(runner._calls) == 1 and len(runner.backend.launched) == launched + 1
    assert y2 is not y1
    np.testing.assert_array_equal(y1, relu(x, 1.5, -0.25))
    np.testing.assert_array_equal(y2, relu(x, -2.0, 0.5))
    x[:] = -x  # new values at the same address
    np.testing.assert_array_equal(f(x, 3.0, 0.0), relu(x, 3.0, 0.0))
    f(x[:500], 1.0, 0.0)  # a new shape: checked
    f(x[:500], 1.0, 0.0)
    assert len(runner._calls) == 2


def test_the_fast_path_still_checks_scalars():
    f = fusec.jit(SBR, backend="sim")
    x = np.ones(8, np.float32)
    f(x, 1.0, 0.0)
    f(x, 1.0, 0.0)
    assert f._runner._calls
    with pytest.raises(ArgumentError, match="parameter 's' is a scalar f32; got bool"):
        f(x, True, 0.0)
    with pytest.raises(ArgumentError, match="parameter 'b' is a scalar f32; got str"):
        f(x, 1.0, "0")


def test_inout_arrays_on_the_fast_path():
    adam = str(ROOT / "examples/adam.fz")
    f, reference = fusec.jit(adam, backend="sim"), fusec.jit(adam, backend="numpy")
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(5000).astype(np.float32) for _ in range(4)]
    arrays[3] = np.abs(arrays[3])
    expected = [a.copy() for a in arrays]
    for step in range(1, 4):
        scalars = (1e-3, 0.9, 0.999, 1e-8, 1 - 0.9 ** step, 1 - 0.999 ** step)
        f(*arrays, *scalars)
        reference(*expected, *scalars)
    assert len(f._runner._calls) == 1
    for a, e in zip(arrays, expected):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=1e-6)


def test_repeat_counts_on_the_fast_path():
    mod = fusec.jit(str(ROOT / "tests/programs/repeat.fz"), backend="sim")
    reference = fusec.jit(str(ROOT / "tests/programs/repeat.fz"), backend="numpy")
    pipeline = mod.program.pipeline("counted")
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(300).astype(np.float32) if p.shape is not None else
            (3 if p.type.is_int else 0.5) for p in pipeline.params]
    counts = [i for i, p in enumerate(pipeline.params) if p.shape is None and p.type.is_int]
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    for count in (3, 3, 0, 5, 3, 0, 5, 3):  # the same arrays throughout; each count its own launch sequence
        for i in counts:
            args[i] = expected[i] = count
        np.testing.assert_allclose(mod.counted(*args), reference.counted(*expected), rtol=2e-5, atol=1e-6)
    assert len(mod.counted._runner._calls) == 3
    for i in counts:
        args[i] = 3.0
    with pytest.raises(ArgumentError, match="is i32; got a float"):
        mod.counted(*args)  # 3.0 == 3, but a float count is its own key: checked, and refused


def test_new_outputs_that_miss_the_alignment_take_the_checked_path():
    f = fusec.jit(SBR, backend="sim")
    x = np.ones(4096, np.float32)
    f(x, 1.0, 0.0)
    f(x, 1.0, 0.0)
    (call,) = f._runner._calls.values()
    assert "MISALIGNED" in call.source  # the vector variant ran: the new output must be aligned too
    # The generated run's allocator, replaced by one that hands out memory 4 bytes off.
    call.run.__globals__["empty"] = lambda shape, dtype: np.empty(int(np.prod(shape)) + 1, dtype)[1:].reshape(shape)
    y = f(x, 2.0, 1.0)
    np.testing.assert_array_equal(y, 3.0)
    assert y.ctypes.data % 16 == 0  # the checked path's own output, not the misaligned one


def test_a_repeated_call_with_out_replays_into_the_given_arrays():
    dag = fusec.jit(str(ROOT / "examples/dag.fz"), backend="sim")
    reference = fusec.jit(str(ROOT / "examples/dag.fz"), backend="numpy")
    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal(777).astype(np.float32) for _ in range(3))
    outs = (np.empty(777, np.float32), np.empty(777, np.float32))
    for _ in range(3):  # checked, recorded, replayed
        result = dag(a, b, c, out=outs)
        assert result[0] is outs[0] and result[1] is outs[1]
    runner = dag._runner
    assert len(runner._calls) == 1 and "out" in next(iter(runner._calls))
    a[:] = -a  # new values at the same addresses: replayed, into the same outputs
    launched = len(runner.backend.launched)
    result = dag(a, b, c, out=outs)
    assert len(runner.backend.launched) > launched and len(runner._calls) == 1
    assert_matches(result, reference(a, b, c))  # dag's math: libm, within the stated ulps
    other = (np.empty(777, np.float32), np.empty(777, np.float32))
    result = dag(a, b, c, out=other)  # other outputs: a new key, checked
    assert result[0] is other[0] and len(runner._calls) == 1
    np.testing.assert_array_equal(other[0], outs[0])


def test_out_on_the_fast_path_is_still_the_callers_and_checked_when_wrong():
    f = fusec.jit(SBR, backend="sim")
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    y = np.empty(64, np.float32)
    for s in (1.0, 2.0, 3.0):
        assert f(x, s, 0.5, out=y) is y
        np.testing.assert_array_equal(y, relu(x, s, 0.5))
    with pytest.raises(ArgumentError, match="out= array has shape"):
        f(x, 1.0, 0.0, out=np.empty(63, np.float32))
    with pytest.raises(ArgumentError, match="parameter 's' is a scalar f32; got str"):
        f(x, "1", 0.0, out=y)  # a recorded key, a wrong scalar
    read_only = np.empty(64, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        f(x, 1.0, 0.0, out=read_only)


def test_out_none_is_a_plain_call_on_the_fast_path():
    f = fusec.jit(SBR, backend="sim")
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    results = [f(x, 2.0, 0.5, out=None) for _ in range(3)] + [f(x, 2.0, 0.5)]
    assert len(f._runner._calls) == 1  # out=None and no out= share one recording
    assert len({id(r) for r in results}) == 4  # each call its own new output
    for r in results:
        np.testing.assert_array_equal(r, relu(x, 2.0, 0.5))


def test_other_arrays_of_a_recorded_shape_replay_at_their_addresses():
    """A plain call's key holds no addresses where no parameter is written: a call with new
    arrays of a recorded shape replays, reading them; one whose array is not aligned as the
    recorded variant needs is a key of its own (its address modulo 16 bytes), recorded with
    its scalar variant."""
    f = fusec.jit(SBR, backend="sim")
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(4096).astype(np.float32) for _ in range(4)]
    f(xs[0], 1.0, 0.0)
    f(xs[0], 1.0, 0.0)
    runner = f._runner
    (call,) = runner._calls.values()
    assert call.free
    for x in xs[1:]:
        launched = len(runner.backend.launched)
        np.testing.assert_array_equal(f(x, 1.5, -0.25), relu(x, 1.5, -0.25))
        assert len(runner._calls) == 1 and len(runner.backend.launched) == launched + 1
    backing = rng.standard_normal(4097).astype(np.float32)
    shifted = backing[1:]  # 4 bytes past an aligned address
    for _ in range(3):
        np.testing.assert_array_equal(f(shifted, 2.0, 1.0), relu(shifted, 2.0, 1.0))
    assert runner.backend.launched[-1] != runner.backend.launched[0]  # not the vector variant
    assert len(runner._calls) == 2
    for x in xs:  # each key its own variant still
        np.testing.assert_array_equal(f(x, 1.0, 0.0), relu(x, 1.0, 0.0))
        assert runner.backend.launched[-1] == runner.backend.launched[0]


def test_inout_and_out_calls_keep_addresses_in_their_keys():
    """A written array must share no memory with another argument: checked at each new
    address, so a call that aliases is refused however often its shapes were seen."""
    f = fusec.jit("pipeline p(inout a: f32[n], b: f32[n]) { a = a + b; }", backend="sim")
    a, b = np.zeros(64, np.float32), np.ones(64, np.float32)
    for _ in range(3):
        f(a, b)
    assert not next(iter(f._runner._calls.values())).free
    with pytest.raises(ArgumentError, match="share memory"):
        f(a, a)
    g = fusec.jit(SBR, backend="sim")
    x = np.ones(64, np.float32)
    for _ in range(3):
        g(x, 1.0, 0.0, out=np.empty(64, np.float32))
    with pytest.raises(ArgumentError, match="share memory"):
        g(x, 1.0, 0.0, out=x)
