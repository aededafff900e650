"""One binder for every backend: the same bad calls are refused by the numpy and
sim backends with the same message, and nothing is written before every check
has passed (the GPU tier runs the same cases on the cuda backend)."""
import numpy as np
import pytest

import fusec
from fusec.errors import ArgumentError

pytestmark = pytest.mark.sim

# An inout array, two outputs, a broadcast operand, an integer count.
SOURCE = """
pipeline step(inout h: f32[rows, cols], b: f32[cols], s: f32, k: u64) -> (y: f32[rows, cols], z: f32[cols]) {
    repeat k { h = h * s + b; }
    y = h * 2.0;
    z = b + s;
}
"""
ROWS, COLS = 3, 5
SENTINEL = -7.25


def fresh():
    """Arguments of a good call, and out= arrays poisoned with a sentinel."""
    rng = np.random.default_rng(0)
    h = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    b = rng.standard_normal(COLS).astype(np.float32)
    out = (np.full((ROWS, COLS), SENTINEL, np.float32), np.full(COLS, SENTINEL, np.float32))
    return h, b, out


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


# Each: (what is wrong, a function of the good arguments giving (args, kwargs)).
BAD_CALLS = [
    ("too many arguments", lambda h, b, out: ((h, b, 1.0, 1, 5), {})),
    ("a missing argument", lambda h, b, out: ((h, b, 1.0), {})),
    ("an unknown keyword", lambda h, b, out: ((h, b, 1.0, 1), {"q": 1})),
    ("an argument twice", lambda h, b, out: ((h, b, 1.0, 1), {"s": 1.0})),
    ("a wrong dtype", lambda h, b, out: ((h, b.astype(np.float64), 1.0, 1), {"out": out})),
    ("a wrong rank", lambda h, b, out: ((h, b[None], 1.0, 1), {"out": out})),
    ("dims that disagree", lambda h, b, out: ((h, b[:4].copy(), 1.0, 1), {"out": out})),
    ("a non-contiguous array", lambda h, b, out: ((np.ones((COLS, ROWS), np.float32).T, b, 1.0, 1), {"out": out})),
    ("a negative stride", lambda h, b, out: ((h, b[::-1], 1.0, 1), {"out": out})),
    ("a read-only inout", lambda h, b, out: ((_readonly(h), b, 1.0, 1), {"out": out})),
    ("an inout broadcast view", lambda h, b, out: ((np.broadcast_to(b, (ROWS, COLS)), b, 1.0, 1), {"out": out})),
    ("an inout aliasing an input", lambda h, b, out: ((h, h[0], 1.0, 1), {"out": out})),
    ("out= aliasing an input", lambda h, b, out: ((h, b, 1.0, 1), {"out": (out[0], b)})),
    ("out= of the wrong count", lambda h, b, out: ((h, b, 1.0, 1), {"out": out[0]})),
    ("out= of the wrong shape", lambda h, b, out: ((h, b, 1.0, 1), {"out": (out[0], out[1][:3])})),
    ("a read-only out=", lambda h, b, out: ((h, b, 1.0, 1), {"out": (out[0], _readonly(out[1]))})),
    ("a float for an integer", lambda h, b, out: ((h, b, 1.0, 1.5), {"out": out})),
    ("a negative count", lambda h, b, out: ((h, b, 1.0, -1), {"out": out})),
    ("a count beyond 2**63 - 1", lambda h, b, out: ((h, b, 1.0, 2 ** 63), {"out": out})),
    ("a float beyond f32", lambda h, b, out: ((h, b, 1e300, 1), {"out": out})),
    ("an int beyond any float", lambda h, b, out: ((h, b, 10 ** 400, 1), {"out": out})),
    ("a bool for a float", lambda h, b, out: ((h, b, True, 1), {"out": out})),
    ("a string for a float", lambda h, b, out: ((h, b, "1.0", 1), {"out": out})),
    ("a list for an array", lambda h, b, out: (([[1.0] * COLS] * ROWS, b, 1.0, 1), {"out": out})),
    ("stream= on the CPU", lambda h, b, out: ((h, b, 1.0, 1), {"stream": object()})),
]


@pytest.mark.parametrize("what,make", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_every_backend_refuses_a_bad_call_alike_and_writes_nothing(what, make):
    messages = {}
    for backend in ("numpy", "sim"):
        f = fusec.jit(SOURCE, backend=backend)
        h, b, out = fresh()
        before = h.copy()
        args, kwargs = make(h, b, out)
        with pytest.raises(ArgumentError) as caught:
            f(*args, **kwargs)
        messages[backend] = str(caught.value).replace("the numpy backend", "the backend").replace(
            "the sim backend", "the backend").replace("this backend", "the backend")
        np.testing.assert_array_equal(h, before)
        assert (out[0] == SENTINEL).all() and (out[1] == SENTINEL).all()
    assert messages["numpy"] == messages["sim"], messages


def test_the_messages_name_what_is_wrong():
    f = fusec.jit(SOURCE, backend="numpy")
    h, b, out = fresh()
    cases = [
        (lambda: f(h, b, 1e300, 1), "parameter 's' is f32; 1e\\+300 is out of its range"),
        (lambda: f(h, b, 10 ** 400, 1), "parameter 's' is f32; 1000"),
        (lambda: f(h, b, 1.0, 2 ** 63), "repeat count 'k' is 9223372036854775808; at most 2\\^63 - 1"),
        (lambda: f(h, b, 1.0, -1), "parameter 'k' is u64; -1 is out of its range"),
        (lambda: f(h, b[:4].copy(), 1.0, 1), "parameter 'b': dim 'cols' is 4 here but 5 from parameter 'h'"),
        (lambda: f(h, b, 1.0, 1, out=(out[0], out[1][:3])), "output 'z': out= array has shape \\(3,\\), expected \\(5,\\)"),
        (lambda: f(h, h[0], 1.0, 1), "'h' and 'b' share memory, but 'h' is written"),
    ]
    for call, message in cases:
        with pytest.raises(ArgumentError, match=message):
            call()


def test_a_good_call_agrees_on_both_backends_and_writes_out():
    results = {}
    for backend in ("numpy", "sim"):
        f = fusec.jit(SOURCE, backend=backend)
        h, b, out = fresh()
        y, z = f(h, b, 0.5, 3, out=out)
        assert y is out[0] and z is out[1]
        results[backend] = (h, y, z)
    for a, e in zip(results["sim"], results["numpy"]):
        np.testing.assert_array_equal(a, e)


def test_a_literal_dim_in_a_dim_equation_is_quoted_as_a_size():
    f = fusec.jit("pipeline p(x: f32[n], y: f32[4]) -> (z: f32[n]) { z = x + y; }", backend="numpy")
    with pytest.raises(ArgumentError, match="dims 'n' \\(3\\) and of literal size 4 \\(4\\) must be equal"):
        f(np.ones(3, np.float32), np.ones(4, np.float32))


# Every integer type, each array its own size: y_T = x_T + s_T.
INT_TYPES = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
             "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64}
EDGES = (f"pipeline edges({', '.join(f'x_{t}: {t}[n_{t}]' for t in INT_TYPES)}, "
         f"{', '.join(f's_{t}: {t}' for t in INT_TYPES)}) -> ({', '.join(f'y_{t}: {t}[n_{t}]' for t in INT_TYPES)}) {{\n"
         + "".join(f"    y_{t} = x_{t} + s_{t};\n" for t in INT_TYPES) + "}")


def _edge_call(f, scalars: dict):
    xs = [np.zeros(3 + k, dtype) for k, dtype in enumerate(INT_TYPES.values())]
    return f(*xs, *(scalars[t] for t in INT_TYPES))


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_an_integer_scalar_at_either_end_of_its_range_reaches_the_kernel_exactly(backend):
    f = fusec.jit(EDGES, backend=backend)
    for end in (0, 1):
        edge = {t: int(np.iinfo(d).min if end == 0 else np.iinfo(d).max) for t, d in INT_TYPES.items()}
        # As Python ints (the binder's fast path) and as NumPy scalars of the type (its full check).
        for scalars in (edge, {t: INT_TYPES[t](v) for t, v in edge.items()}):
            for t, y in zip(INT_TYPES, _edge_call(f, scalars)):
                assert y.dtype == INT_TYPES[t] and y.tolist() == [edge[t]] * y.size, t


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_an_integer_scalar_one_beyond_its_range_is_refused(backend):
    f = fusec.jit(EDGES, backend=backend)
    good = {t: 0 for t in INT_TYPES}
    for t, dtype in INT_TYPES.items():
        info = np.iinfo(dtype)
        for value in (int(info.min) - 1, int(info.max) + 1):
            kinds = [value] + ([np.int64(value)] if t not in ("i64", "u64") else [])
            for given in kinds:  # a Python int, and a NumPy integer of a wider type
                with pytest.raises(ArgumentError, match=f"parameter 's_{t}' is {t}; {value} is out of its range"):
                    _edge_call(f, {**good, t: given})


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_a_literal_dim_is_checked_at_call_time(backend):
    f = fusec.jit("pipeline p(x: f32[rows, 4]) -> (y: f32[rows, 4]) { y = x * 2.0; }", backend=backend)
    with pytest.raises(ArgumentError, match=r"parameter 'x': expected shape \[rows, 4\], got \(3, 5\)"):
        f(np.ones((3, 5), np.float32))
    out = np.full((3, 5), SENTINEL, np.float32)
    with pytest.raises(ArgumentError, match=r"output 'y': out= array has shape \(3, 5\), expected \(3, 4\)"):
        f(np.ones((3, 4), np.float32), out=out)
    assert (out == SENTINEL).all()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(f(x), x * 2)
