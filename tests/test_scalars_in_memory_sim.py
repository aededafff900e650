"""Float scalars read from device memory (`scalars_in_memory`): the kernels take
`const double* NAME_ptr` and read it once, converted as the host converts a
by-value scalar. Sim tier: the emitted module run on the CPU, bit-identical to
the by-value module for every float type; the packing of the pointer against
the kernel's parameter list; the binder's errors."""
import numpy as np
import pytest
from helpers import ROOT

import fusec
from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import ArgumentError
from fusec.frontend import load
from fusec.ir.launch import ScalarArg, ScalarInMemory
from fusec.runtime.packing import ArgumentBuffer, param_format

pytestmark = pytest.mark.sim

# One pipeline per float type of scalar: f16 and bf16 scalars round to their type, then
# compute in f32; a row reduction (one block a row) and the unfused form's several kernels.
PIPELINES = {
    "f32": """
pipeline p(x: f32[n], s: f32, t: f32) -> (y: f32[n]) {
    y = x * s + t;
}""",
    "f64": """
pipeline p(x: f64[n], s: f64, t: f64) -> (y: f64[n]) {
    y = x * s + t;
}""",
    "f16": """
pipeline p(x: f16[n], s: f16, t: f16) -> (y: f32[n]) {
    y = f32(x) * s + t;
}""",
    "bf16": """
pipeline p(x: bf16[n], s: bf16, t: bf16) -> (y: f32[n]) {
    y = f32(x) * s + t;
}""",
}

# Values whose conversions differ: 1/3 (rounds in every type), an f32 denormal, beyond f16's
# largest (65520 rounds to inf in f16), and a bf16 halfway case that rounding through f32 gets
# wrong (1 + 2^-8 + 2^-30: to f32 is 1 + 2^-8, a tie that rounds to 1; once, 1 + 2^-7).
VALUES = [0.0, -2.5, 1 / 3, 1e-39, 65519.0, 1 + 2 ** -8 + 2 ** -30, -7.123456789e-5, 3.0e38]


def _pair(source: str, **options):
    by_value = fusec.jit(source, backend="sim", **options)
    in_memory = fusec.jit(source, backend="sim", scalars_in_memory=True, **options)
    return by_value, in_memory


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_bit_identical_to_the_by_value_module(kind, fuse):
    """Every value on every call path (checked, recorded, replayed: a new value each call, so a
    replay that kept the recorded call's value fails), fused and unfused."""
    by_value, in_memory = _pair(PIPELINES[kind], fuse=fuse)
    dtype = by_value.compiled.interface.signature.params[0].type.numpy_dtype
    x = (np.linspace(-3, 3, 37) * np.pi).astype(dtype)
    for s, t in zip(VALUES, VALUES[3:] + VALUES[:3]):
        found = in_memory(x, np.array(s), np.array(t))
        try:
            expected = by_value(x, s, t)
        except ArgumentError as exc:  # beyond f16's range: refused by value, ±inf from memory (README)
            assert kind == "f16" and "out of its range" in str(exc)
            assert np.isinf(found[x != 0]).all()
            continue
        assert found.tobytes() == expected.tobytes(), (kind, s, t)
    source = in_memory.cuda_source
    assert "const double* __restrict__ s_ptr" in source and "const double* __restrict__ t_ptr" in source


def test_a_row_kernel_reads_its_scalar_as_the_by_value_one():
    """rmsnorm's eps, in a row kernel (one block a row): its read at the kernel's top."""
    source = (ROOT / "examples/rmsnorm.fz").read_text()
    by_value = fusec.jit(source, backend="sim", pipeline="rmsnorm")
    in_memory = fusec.jit(source, backend="sim", pipeline="rmsnorm", scalars_in_memory=("eps",))
    x, w = np.random.default_rng(1).standard_normal((5, 70)).astype(np.float32), np.ones(70, np.float32)
    for eps in (1e-6, 1 / 3, 1e-39):
        assert in_memory(x, w, np.array(eps)).tobytes() == by_value(x, w, eps).tobytes()


def test_integer_and_bool_scalars_stay_by_value():
    source = """
pipeline q(x: f32[n], k: i32, flag: bool, s: f32) -> (y: f32[n]) {
    y = flag ? x * f32(k) * s : x;
}"""
    by_value, in_memory = _pair(source)
    x = np.arange(9, dtype=np.float32)
    assert in_memory(x, 3, True, np.array(0.1)).tobytes() == by_value(x, 3, True, 0.1).tobytes()
    (kernel,) = in_memory.compiled.interface.kernels
    sources = {p.c_name: p.source for p in kernel.params}
    assert isinstance(sources["k"], ScalarArg) and isinstance(sources["flag"], ScalarArg)
    assert isinstance(sources["s_ptr"], ScalarInMemory)
    with pytest.raises(ValueError, match=r"'k' is a scalar i32; only float scalars are read from memory"):
        fusec.jit(source, backend="sim", scalars_in_memory=("k",)).compiled
    with pytest.raises(ValueError, match=r"has no parameter 'nope'"):
        fusec.jit(source, backend="sim", scalars_in_memory=("nope",)).compiled


def test_the_default_form_is_by_value():
    compiled = compile_pipeline(load(PIPELINES["f32"]), "p")
    (kernel,) = compiled.interface.kernels
    assert not any(isinstance(p.source, ScalarInMemory) for p in kernel.params)
    assert not any(p.in_memory for p in compiled.interface.signature.params)
    assert "_ptr" not in compiled.cuda


def test_the_pointer_is_packed_where_the_kernel_declares_it():
    """The parameter replaces the by-value one in place, as an 8-byte address ("P"); the sim
    launcher reads each parameter back as the kernel declares it (`*(const double**)params[j]`),
    so a value at any other offset or of any other width would give other results (above)."""
    by_value = compile_pipeline(load(PIPELINES["f16"]), "p").interface.kernels[0]
    in_memory = compile_pipeline(load(PIPELINES["f16"]), "p", CompileOptions(scalars_in_memory=True))
    kernel = in_memory.interface.kernels[0]
    assert [type(p.source) for p in kernel.params] == \
        [ScalarInMemory if isinstance(p.source, ScalarArg) else type(p.source) for p in by_value.params]
    pointers = [j for j, p in enumerate(kernel.params) if isinstance(p.source, ScalarInMemory)]
    assert [kernel.params[j].c_type for j in pointers] == ["const double*"] * 2
    assert [kernel.params[j].source.type.name for j in pointers] == ["f16", "f16"]
    assert all(param_format(kernel.params[j]) == "P" for j in pointers)
    buffer = ArgumentBuffer(kernel.params)
    values = [0x1000 * (j + 1) if param_format(p) == "P" else 7 for j, p in enumerate(kernel.params)]
    buffer.fill(values)
    for j in pointers:  # each pointer at its offset, 8-byte aligned, holding the address given
        assert buffer.offsets[j] % 8 == 0
        assert int.from_bytes(buffer.buffer.raw[buffer.offsets[j]:buffer.offsets[j] + 8], "little") == values[j]
    # read once at the top, converted through the declared type (f16: rounded once from double)
    assert "const float s = __half2float(__double2half(*s_ptr));" in in_memory.cuda


class _GpuArray:
    """Something that says it lives on a CUDA device (DLPack device type 2)."""

    def __dlpack_device__(self):
        return (2, 0)


@pytest.mark.parametrize("value,message", [
    (0.5, r"pass a 0-d float64 array on the call's device, not a float \(0.5\)"),
    (np.float64(0.5), r"not a float64"),
    (np.array(0.5, np.float32), r"got dtype float32"),
    (np.array([0.5]), r"got shape \(1,\)"),
    (np.zeros((1, 1)), r"got shape \(1, 1\)"),
    (_GpuArray(), r"takes arrays in host memory, got a GPU array"),
    ("0.5", r"takes NumPy arrays or CPU tensors, got str"),
])
def test_binder_errors_name_the_parameter(value, message):
    _, in_memory = _pair(PIPELINES["f32"])
    x = np.ones(4, np.float32)
    with pytest.raises(ArgumentError, match=r"parameter 's' \(f32\) is read from device memory .*" + message):
        in_memory(x, value, np.array(1.0))
    for _ in range(3):  # recorded and replayed calls check it too
        in_memory(x, np.array(2.0), np.array(1.0))
    with pytest.raises(ArgumentError, match=r"parameter 's' \(f32\)"):
        in_memory(x, value, np.array(1.0))


def test_torch_cpu_tensors_as_scalars():
    torch = pytest.importorskip("torch")
    by_value, in_memory = _pair(PIPELINES["bf16"])
    x = torch.linspace(-3, 3, 33).to(torch.bfloat16)
    for s in VALUES[:4]:
        found = in_memory(x, torch.tensor(s, dtype=torch.float64), torch.tensor(0.25, dtype=torch.float64))
        assert torch.equal(found, by_value(x, s, 0.25))
    with pytest.raises(ArgumentError, match=r"parameter 's' \(bf16\).*got dtype float32"):
        in_memory(x, torch.tensor(0.5), torch.tensor(0.25, dtype=torch.float64))
    with pytest.raises(ArgumentError, match=r"parameter 't' \(bf16\).*takes arrays in host memory|parameter 't'"):
        in_memory(x, torch.tensor(0.5, dtype=torch.float64), torch.tensor(0.25, dtype=torch.float64,
                                                                          device="meta"))


def test_options_are_checked():
    with pytest.raises(TypeError, match="scalars_in_memory= takes True, False or the names"):
        fusec.jit(PIPELINES["f32"], backend="sim", scalars_in_memory=3)
    with pytest.raises(ValueError, match="graph=True with scalars_in_memory="):
        fusec.jit(PIPELINES["f32"], backend="cuda", graph=True, scalars_in_memory=True)


# ---- a memory scalar is one of the call's arrays: aliasing, kinds; the option checked up front

DIVIDE = "pipeline p(inout x: f64[n], s: f64) { x = x / s; }"
DIVIDE_OUT = "pipeline p(x: f64[n], s: f64) -> (y: f64[n]) { y = x / s; }"


def test_a_memory_scalar_sharing_a_written_array_is_refused_at_the_first_call():
    """The kernel's `const double* __restrict__ s_ptr` may not point into x, which it writes."""
    torch = pytest.importorskip("torch")
    f = fusec.jit(DIVIDE, backend="sim", scalars_in_memory=True)
    x = torch.arange(1, 11, dtype=torch.float64) * 2
    with pytest.raises(ArgumentError, match=r"'x' and 's' share memory, but 'x' is written"):
        f(x, x[0])
    assert torch.equal(x, torch.arange(1, 11, dtype=torch.float64) * 2)  # nothing launched
    xs = np.arange(1, 11.0) * 2
    with pytest.raises(ArgumentError, match=r"'x' and 's' share memory, but 'x' is written"):
        f(xs, xs[4:5].reshape(()))
    g = fusec.jit(DIVIDE_OUT, backend="sim", scalars_in_memory=True)
    y = np.zeros(10)
    with pytest.raises(ArgumentError, match=r"'s' and 'y' share memory, but 'y' is written"):
        g(xs, y[3:4].reshape(()), out=y)
    f(xs, xs[4:5].copy().reshape(()))  # a copy: its own memory
    assert (xs == np.arange(1, 11.0) / 5).all()


@pytest.mark.parametrize("with_out", [False, True])
def test_a_memory_scalar_sharing_a_written_array_is_refused_on_a_recorded_call(with_out):
    """After clean calls (recorded, replayed: the key holds the written arrays' addresses, not the
    scalar's), a call whose scalar lies in the written array (inout, or out=) is refused as the
    first call's check refuses it, nothing written; clean calls replay on."""
    x = np.arange(1, 11.0) * 2
    if with_out:
        f, y = fusec.jit(DIVIDE_OUT, backend="sim", scalars_in_memory=True), np.zeros(10)
        call, target, message = (lambda s: f(x, s, out=y)), y, r"'s' and 'y' share memory, but 'y' is written"
    else:
        f = fusec.jit(DIVIDE, backend="sim", scalars_in_memory=True)
        call, target, message = (lambda s: f(x, s)), x, r"'x' and 's' share memory, but 'x' is written"
    for _ in range(3):
        call(np.array(1.0))
    assert f._host_runner._calls  # recorded: the calls below are replays but for the check
    before = target.copy()
    for k in (0, 3, 9):
        with pytest.raises(ArgumentError, match=message):
            call(target[k:k + 1].reshape(()))
        assert (target == before).all()
    for _ in range(3):
        call(np.array(2.0))
    assert (target == (x / 2 if with_out else before / 8)).all()


def test_memory_scalars_are_arrays_of_the_call_s_kind():
    """A NumPy scalar array with torch tensors (or the reverse) is two kinds in one call: the
    ArgumentError of any two kinds, on the first call and after recorded ones."""
    torch = pytest.importorskip("torch")
    _, in_memory = _pair(PIPELINES["f64"])
    x = np.arange(5.0)
    with pytest.raises(ArgumentError, match=r"parameter 's' is a torch.Tensor, but parameter 'x' is a "
                                            r"numpy.ndarray: a call takes arrays of one kind"):
        in_memory(x, torch.tensor(2.0, dtype=torch.float64), np.array(0.0))
    with pytest.raises(ArgumentError, match=r"parameter 's' is a numpy.ndarray, but parameter 'x' is a "
                                            r"torch.Tensor"):
        in_memory(torch.arange(5.0, dtype=torch.float64), np.array(2.0), np.array(0.0))
    for _ in range(3):  # recorded and replayed
        assert (in_memory(x, np.array(2.0), np.array(1.0)) == 2 * x + 1).all()
    assert in_memory._host_runner._calls
    with pytest.raises(ArgumentError, match=r"parameter 't' is a torch.Tensor, but parameter 'x' is a numpy"):
        in_memory(x, np.array(2.0), torch.tensor(0.0, dtype=torch.float64))
    t = torch.arange(5.0, dtype=torch.float64)
    found = in_memory(t, torch.tensor(2.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
    assert isinstance(found, torch.Tensor) and torch.equal(found, 2 * t + 1)


def test_a_traced_function_refuses_scalars_in_memory_at_decoration():
    def scale(x, s):
        return x * s
    for chosen in (True, ("s",), "s"):
        with pytest.raises(TypeError, match=r"scalars_in_memory= is for \.fz pipelines, not a traced Python "
                                            r"function \(scale\)"):
            fusec.jit(backend="sim", scalars_in_memory=chosen)(scale)
        with pytest.raises(TypeError, match="scalars_in_memory="):
            fusec.jit(scale, backend="sim", scalars_in_memory=chosen)
    fusec.jit(scale, backend="sim", scalars_in_memory=False)  # by value: as ever


@pytest.mark.parametrize("backend", ["sim", "numpy", "auto"])
def test_names_are_checked_when_the_pipeline_is_made(backend, monkeypatch):
    """On every backend (auto without a GPU: numpy), before anything is compiled."""
    import sys
    jit_module = sys.modules["fusec.jit"]
    monkeypatch.setattr(jit_module, "compile_pipeline", lambda *a, **k: pytest.fail("compiled"))
    monkeypatch.setattr(jit_module, "resolve_backend", lambda b: "numpy" if b == "auto" else b)
    source = "pipeline q(x: f32[n], k: i32, s: f32) -> (y: f32[n]) { y = x * f32(k) * s; }"
    with pytest.raises(ValueError, match=r"pipeline 'q' has no parameter 'nope'"):
        fusec.jit(source, backend=backend, scalars_in_memory=("s", "nope"))
    with pytest.raises(ValueError, match=r"'k' is a scalar i32; only float scalars are read from memory"):
        fusec.jit(source, backend=backend, scalars_in_memory="k")
    with pytest.raises(ValueError, match=r"'x' is an array"):
        fusec.jit(source, backend=backend, scalars_in_memory=["x"])
    fusec.jit(source, backend=backend, scalars_in_memory=("s",))
    fusec.jit(source, backend=backend, scalars_in_memory=True)


def test_names_in_a_file_of_several_pipelines_apply_where_they_are_parameters():
    source = """
pipeline a(x: f64[n], s: f64) -> (y: f64[n]) { y = x * s; }
pipeline b(x: f64[n]) -> (y: f64[n]) { y = x + 1.0; }"""
    module = fusec.jit(source, backend="sim", scalars_in_memory=("s",))
    x = np.arange(4.0)
    assert (module.a(x, np.array(3.0)) == 3 * x).all() and (module.b(x) == x + 1).all()
    with pytest.raises(ValueError, match=r"no pipeline has a parameter 'nope'"):
        fusec.jit(source, backend="sim", scalars_in_memory=("s", "nope"))


def test_graph_is_refused_only_where_a_float_scalar_is_read_from_memory(monkeypatch):
    """graph=True (the cuda backend, made without a GPU: nothing is compiled until a call) with
    scalars_in_memory: refused where some float scalar would be read from memory, not otherwise."""
    import sys
    monkeypatch.setattr(sys.modules["fusec.jit"], "resolve_backend", lambda b: b)
    by_value_only = "pipeline q(x: f32[n], k: i32) -> (y: f32[n]) { y = x * f32(k); }"
    for chosen in (True, ()):
        assert fusec.jit(by_value_only, backend="cuda", graph=True, scalars_in_memory=chosen).options.graph
    with pytest.raises(ValueError, match=r"graph=True with scalars_in_memory= .*read from memory: s, t"):
        fusec.jit(PIPELINES["f32"], backend="cuda", graph=True, scalars_in_memory=True)
    with pytest.raises(ValueError, match=r"graph=True with scalars_in_memory= .*read from memory: t\)"):
        fusec.jit(PIPELINES["f32"], backend="cuda", graph=True, scalars_in_memory=("t",))
