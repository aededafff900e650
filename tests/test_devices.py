"""Every GPU of a host, on the CPU: which device a call runs on, and the
error for a call whose arrays are on two devices (the cuda backend's array
model over a stand-in for CuPy's arrays; the gpu tier runs the real ones)."""
from types import SimpleNamespace

import pytest

import fusec
from fusec.errors import ArgumentError
from fusec.runtime.backends import cuda
from fusec.runtime.binder import Binder


class FakeArray:
    """What the cuda backend reads of a CuPy array."""

    def __init__(self, device, n=8, dtype="float32"):
        import numpy as np
        self.data = SimpleNamespace(device_id=device, ptr=4096 * (device + 1))
        self.dtype, self.shape, self.strides = np.dtype(dtype), (n,), (np.dtype(dtype).itemsize,)
        self.size, self.nbytes = n, n * self.dtype.itemsize
        self.flags = SimpleNamespace(c_contiguous=True)
        self._c_contiguous = True


@pytest.fixture
def fake_cupy(monkeypatch):
    cp = SimpleNamespace(ndarray=FakeArray, empty=None,
                         cuda=SimpleNamespace(runtime=SimpleNamespace(getDevice=lambda: 0)))
    monkeypatch.setattr(cuda, "cupy", lambda: cp)
    cuda._runtime.cache_clear()
    yield cp
    cuda._runtime.cache_clear()  # the stand-in's runtime is not kept for later tests


def binder_on(device, cp, source="pipeline p(a: f32[n], b: f32[n]) -> (y: f32[n]) { y = a + b; }"):
    f = fusec.jit(source, backend="numpy")
    return Binder(f.compiled.interface.signature, cuda.DeviceArrays(cp, device))


def test_the_first_arrays_device_is_the_calls(fake_cupy):
    assert cuda.call_device((FakeArray(1), FakeArray(0)), {}) == 1
    assert cuda.call_device((2.0,), {"a": FakeArray(3)}) == 3
    assert cuda.call_device((2.0, 3), {}) == 0  # no array: the current device


def test_arrays_of_one_device_bind(fake_cupy):
    call = binder_on(1, fake_cupy).bind((FakeArray(1), FakeArray(1)), {})
    assert call.dims == {"n": 8}


@pytest.mark.parametrize("first,second", [(0, 1), (1, 0)])
def test_a_call_on_two_devices_is_refused_naming_the_parameter(fake_cupy, first, second):
    binder = binder_on(first, fake_cupy)
    with pytest.raises(ArgumentError) as info:
        binder.bind((FakeArray(first), FakeArray(second)), {})
    assert str(info.value) == (f"parameter 'b': the array is on device {second}, but the call's first array is "
                               f"on device {first}: a call's arrays must all be on one device")


def test_a_tensor_that_requires_grad_is_keyed_apart_while_grad_mode_is_on(fake_cupy):
    """A call recorded under no_grad is not replayed for a tensor the binder would refuse
    (it requires grad while grad mode is on: autograd would not see the call)."""
    torch = pytest.importorskip("torch")
    backend = object.__new__(cuda.CudaBackend)
    backend.cp, backend._reader_cache = fake_cupy, {}
    weight = torch.ones(4, requires_grad=True)
    with torch.no_grad():
        recorded = backend.signature(weight)
    assert backend.signature(weight) != recorded
    plain = torch.ones(4)
    with torch.no_grad():
        assert backend.signature(plain) == backend.signature(plain.detach())
    assert backend.signature(plain) == backend.signature(plain.detach())  # alike in either mode
    with torch.no_grad():
        assert backend.signature(weight) == recorded


def test_foreachs_key_of_many_tensors_holds_grad_mode_where_one_requires_grad(fake_cupy):
    torch = pytest.importorskip("torch")
    backend = object.__new__(cuda.CudaBackend)
    backend.cp, backend._reader_cache = fake_cupy, {}
    tensors = [torch.ones(3), torch.ones(5, requires_grad=True)]
    with torch.no_grad():
        recorded = backend.signatures(tensors)
        assert backend.signatures(tensors) == recorded
    assert backend.signatures(tensors) != recorded
    plain = [torch.ones(3), torch.ones(5)]
    with torch.no_grad():
        assert backend.signatures(plain) == backend.signatures(plain)
        unchanged = backend.signatures(plain)
    assert backend.signatures(plain) == unchanged  # no tensor requires grad: grad mode is not in the key


def test_a_device_of_another_architecture_gets_the_pipeline_compiled_for_it(fake_cupy, monkeypatch):
    """A host of an sm_90 and an sm_80: each device's module is built for its own arch
    (the first device's would not load on an older one)."""
    import contextlib

    import fusec.passes.guard as guard
    current, archs, loaded = [0], {0: "sm_90", 1: "sm_80"}, []

    @contextlib.contextmanager
    def on_device(device):
        before, current[0] = current[0], device
        try:
            yield
        finally:
            current[0] = before
    fake_cupy.cuda.Device = lambda *a: SimpleNamespace(id=current[0])
    driver = SimpleNamespace(cuModuleGetFunction=lambda module, name: (0, name))
    for name, value in {"device_arch": lambda: archs[current[0]], "current_device": lambda: current[0],
                        "on_device": on_device, "driver": lambda: driver, "checked": lambda result: result[1],
                        "function_attribute": lambda function, attribute: 1024, "available": lambda: True,
                        "load_module": lambda source, arch, fast_math=False: loaded.append(arch)}.items():
        monkeypatch.setattr(cuda, name, value)
    monkeypatch.setattr(guard, "observe", lambda compiled, attributes: ())
    f = fusec.jit("pipeline p(a: f32[n], b: f32[n]) -> (y: f32[n]) { y = a * b + 1.0; }", backend="cuda")
    runners = {device: f._runner_on(device) for device in (0, 1)}
    assert loaded == ["sm_90", "sm_80"]
    assert {d: r.interface.arch for d, r in runners.items()} == {0: "sm_90", 1: "sm_80"}
    assert f.compiled.interface.arch == "sm_90"  # the first device's, as before
    pinned = fusec.jit("pipeline p(a: f32[n]) -> (y: f32[n]) { y = a * 2.0; }", backend="cuda", arch="sm_80")
    pinned._runner_on(0)
    assert loaded[-1] == "sm_80"  # an arch given is kept on every device
