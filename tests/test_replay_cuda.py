"""The cuda backend's replayed call on the CPU: CuPy and the driver replaced by
stand-ins that record each launch (function, grid, block, stream handle and the
packed arguments, read back from the argument buffer), so the generated replay
(`Executor.replay`, the recorded call's inline driver launch) is checked against
the checked path's launch of the same call, and against what changed between
calls: the current stream, the device, a dtype, a scalar, the out= array."""
import contextlib
import sys
import types
import weakref

import numpy as np
import pytest
from helpers import ROOT

import fusec
import fusec.passes.guard as guard
from fusec.errors import ArgumentError
from fusec.runtime.backends import cuda

SBR = str(ROOT / "examples/scale_bias_relu.fz")


class MemoryPointer:
    def __init__(self, ptr, device_id):
        self.ptr, self.device_id, self.mem = ptr, device_id, object()


class CUstream:
    def __init__(self, handle=0):
        self.handle = int(handle)

    def __int__(self):
        return self.handle


class CUlaunchConfig:
    def __init__(self):
        self.hStream, self.attrs, self.numAttrs = CUstream(0), [], 0


class CUlaunchAttribute:
    def __init__(self):
        dim = types.SimpleNamespace(x=1, y=1, z=1)
        self.id, self.value = None, types.SimpleNamespace(clusterDim=dim)


class Allocator:
    """CuPy's current allocator (a pool's malloc): memory at a new address each call, on the
    current device; its calls counted."""

    def __init__(self, name, standin, offset=0):
        self.name, self.standin, self.offset, self.calls, self.last = name, standin, offset, 0, None

    def __call__(self, nbytes):
        self.calls += 1
        self.standin.next += 1 << 16
        memory = MemoryPointer(self.standin.next + self.offset, self.standin.device)
        self.last = weakref.ref(memory)  # (a reference would keep it from being reused)
        return memory

    def __repr__(self):
        return self.name


class Standin:
    """CuPy and the driver, as much as the cuda backend reads of them."""

    def __init__(self):
        self.device, self.stream, self.launches, self.next = 0, types.SimpleNamespace(ptr=0), [], 1 << 20
        standin = self

        class ndarray:
            def __init__(self, shape, dtype=np.float32, memptr=None, device=None, ptr=None):
                self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
                self.dtype = np.dtype(dtype)
                self.size = int(np.prod(self.shape))
                self.strides = self._strides = tuple(
                    int(np.prod(self.shape[i + 1:])) * self.dtype.itemsize for i in range(len(self.shape)))
                self.nbytes = self.size * self.dtype.itemsize
                if memptr is not None:  # memory given (a recorded call's, from the allocator in use)
                    self.data = memptr
                elif ptr is None and device is None:  # as CuPy's ndarray(shape, dtype): the allocator in use
                    self.data = standin.allocator(self.nbytes)
                else:
                    if ptr is None:
                        standin.next += 1 << 16
                        ptr = standin.next
                    self.data = MemoryPointer(ptr, standin.device if device is None else device)
                self._c_contiguous = True
                self.flags = types.SimpleNamespace(c_contiguous=True)
        self.ndarray = ndarray

        @contextlib.contextmanager
        def on_device(device):
            before, standin.device = standin.device, device
            try:
                yield types.SimpleNamespace(id=device)
            finally:
                standin.device = before

        def device(*args):
            return on_device(args[0]) if args else types.SimpleNamespace(
                id=standin.device, compute_capability="90", attributes={"MultiProcessorCount": 132})
        self.allocator, self.allocator_reads = Allocator("the pool's malloc", self), 0
        self.cp = types.SimpleNamespace(
            ndarray=ndarray, empty=ndarray, asarray=lambda a: a,
            cuda=types.SimpleNamespace(get_current_stream=lambda: self.stream, Device=device,
                                       runtime=types.SimpleNamespace(getDevice=lambda: self.device),
                                       get_allocator=self.get_allocator))
        self.buffers = {}  # the argument buffers' pointer arrays -> the buffers, to read launches back
        self.driver = types.SimpleNamespace(
            cuLaunchKernel=self.launch, cuLaunchKernelEx=self.launch_ex, CUstream=CUstream,
            CUlaunchConfig=CUlaunchConfig, CUlaunchAttribute=CUlaunchAttribute,
            CUlaunchAttributeID=types.SimpleNamespace(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION="cluster"),
            cuModuleGetFunction=lambda module, name: (0, (name, self.device)),
            cuOccupancyMaxActiveBlocksPerMultiprocessor=lambda *a: (0, 8))

    def get_allocator(self):  # cupy.cuda.get_allocator, its reads counted
        self.allocator_reads += 1
        return self.allocator

    def launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        buffer = self.buffers[params]
        self.launches.append((function, gx, bx, shared, int(stream), buffer.layout.unpack_from(buffer.buffer)))
        return (0,)

    def launch_ex(self, config, function, params, extra):
        assert not config.numAttrs  # no cluster in these pipelines
        return self.launch(function, config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX,
                           config.blockDimY, config.blockDimZ, config.sharedMemBytes, config.hStream, params, extra)



@pytest.fixture(params=["ex", "plain"])
def gpu(monkeypatch, request):
    """The stand-ins, launching through cuLaunchKernelEx or cuLaunchKernel (cuda.LAUNCH_ENTRY)."""
    monkeypatch.setattr(cuda, "LAUNCH_ENTRY", request.param)
    standin = Standin()
    for name, value in {"cupy": lambda: standin.cp, "driver": lambda: standin.driver, "available": lambda: True,
                        "device_arch": lambda: "sm_90", "load_module": lambda *a: None,
                        "checked": lambda result: result[1], "function_attribute": lambda f, a: 1024}.items():
        monkeypatch.setattr(cuda, name, value)
    monkeypatch.setattr(sys.modules["fusec.jit"], "resolve_backend", lambda backend: "cuda")
    monkeypatch.setattr(guard, "replan", lambda compiled, observed, again: compiled)
    monkeypatch.setattr(guard, "observe", lambda compiled, attributes: ())

    class ArgumentBuffer(cuda.ArgumentBuffer):  # each known by its pointer array, to read launches back
        __slots__ = ()

        def __init__(self, params):
            super().__init__(params)
            standin.buffers[self.params] = self
    monkeypatch.setattr(cuda, "ArgumentBuffer", ArgumentBuffer)
    cuda._runtime.cache_clear()
    yield standin
    cuda._runtime.cache_clear()  # the stand-in's runtime is not kept for later tests


def checked_launch(f, standin, *args, **kwargs):
    """The launch the checked path makes of this call (nothing recorded or replayed)."""
    runner = f._runner
    calls, seen, last = dict(runner._calls), set(runner._seen), (runner._last_plain[0], runner._last_out[0])
    runner.forget()
    before = len(standin.launches)
    result = f(*args, **kwargs)
    runner.forget()
    runner._calls.update(calls)
    runner._seen.update(seen)
    runner._last_plain[0], runner._last_out[0] = last
    (launch,) = standin.launches[before:]
    return launch, result


def replayed_launch(f, standin, *args, **kwargs):
    """The launch of a call that must be replayed (its key recorded)."""
    replays = []
    run = type(f._runner).call_missed
    f._runner.call_missed = lambda *a: replays.append(a) or run(f._runner, *a)
    try:
        before = len(standin.launches)
        result = f(*args, **kwargs)
    finally:
        del f._runner.call_missed
    assert not replays, "the call was not replayed"
    (launch,) = standin.launches[before:]
    return launch, result


def with_output(launch, result):
    """A launch with its output's address in place of the call's new output's (each call has its own)."""
    function, grid, block, shared, stream, args = launch
    return function, grid, block, shared, stream, tuple("y" if a == result.data.ptr else a for a in args)


def recorded(gpu):
    f = fusec.jit(SBR, backend="cuda")
    x = gpu.ndarray(4096)
    f(x, 1.0, 0.0)
    f(x, 1.0, 0.0)
    assert len(f._runner._calls) == 1
    return f, x


def test_a_replayed_launch_is_the_checked_paths_launch(gpu):
    f, x = recorded(gpu)
    for s, b in ((1.5, -0.25), (-2.0, 3.0), (2, 0.5)):  # an int for an f32 scalar: the binder's conversion
        replayed = with_output(*replayed_launch(f, gpu, x, s, b))
        assert replayed == with_output(*checked_launch(f, gpu, x, s, b))
        assert replayed[-1][2:4] == (np.float32(s), np.float32(b))
    source = next(iter(f._runner._calls.values())).source  # the driver's launch, inline
    assert ("launch_ex(" if cuda.LAUNCH_ENTRY == "ex" else "launch(") in source


def test_a_replayed_launch_goes_to_the_current_stream(gpu):
    f, x = recorded(gpu)
    for handle in (0, 1234, 0, 99):
        gpu.stream = types.SimpleNamespace(ptr=handle)
        launch, _ = replayed_launch(f, gpu, x, 1.0, 0.0)
        assert launch[4] == handle


def test_a_replayed_call_still_checks_its_scalars(gpu):
    f, x = recorded(gpu)
    for bad, message in ((True, "got bool"), ("1", "got str"), (1e39, "out of its range"), (1j, "complex")):
        with pytest.raises(ArgumentError, match=message):
            f(x, bad, 0.0)
    nan, _ = replayed_launch(f, gpu, x, float("nan"), 0.0)
    assert np.isnan(nan[-1][2])


def test_a_changed_dtype_or_shape_at_the_same_address_is_checked(gpu):
    f, x = recorded(gpu)
    for dtype in (np.int32, np.float64):  # int32: the same strides, only the dtype differs
        with pytest.raises(ArgumentError, match="expected dtype f32"):
            f(gpu.ndarray(4096, dtype, ptr=x.data.ptr), 1.0, 0.0)
    shorter = gpu.ndarray(1000, ptr=x.data.ptr)
    launch, y = checked_launch(f, gpu, shorter, 1.0, 0.0)
    assert y.shape == (1000,) and launch[-1][-1] == 1000  # n: the new shape's, not the recorded one's


def test_an_array_on_another_device_is_not_replayed_on_the_current_ones(gpu):
    """Same address, shape and dtype, but on device 1 while device 0 is current: the call
    runs on device 1 (its module, its recording), never through device 0's replay."""
    f, x = recorded(gpu)
    elsewhere = gpu.ndarray(4096, device=1, ptr=x.data.ptr)
    f(elsewhere, 1.0, 0.0)
    for _ in range(2):
        before = len(gpu.launches)
        y = f(elsewhere, 1.0, 0.0)
        (launch,) = gpu.launches[before:]
        assert launch[0][1] == 1 and y.data.device_id == 1  # device 1's function, its output there
    assert gpu.device == 0 and len(f._runners[1]._calls) == 1
    with gpu.cp.cuda.Device(1):  # device 1 current, the array on device 0: device 0's function
        before = len(gpu.launches)
        f(x, 1.0, 0.0)
        assert gpu.launches[before][0][1] == 0
    a, b = gpu.ndarray(8), gpu.ndarray(8, device=1)
    two = fusec.jit("pipeline p(a: f32[n], b: f32[n]) -> (y: f32[n]) { y = a + b; }", backend="cuda")
    for _ in range(3):
        with pytest.raises(ArgumentError, match="parameter 'b': the array is on device 1"):
            two(a, b)


def test_out_is_replayed_into_the_given_array_and_a_new_one_is_keyed_apart(gpu):
    f = fusec.jit(SBR, backend="cuda")
    x, y, z = gpu.ndarray(4096), gpu.ndarray(4096), gpu.ndarray(4096)
    f(x, 1.0, 0.0, out=y)
    f(x, 1.0, 0.0, out=y)
    launch, result = replayed_launch(f, gpu, x, 2.0, 1.0, out=y)
    assert result is y and launch == checked_launch(f, gpu, x, 2.0, 1.0, out=y)[0]
    assert y.data.ptr in launch[-1]
    launch, result = checked_launch(f, gpu, x, 2.0, 1.0, out=z)
    assert result is z and z.data.ptr in launch[-1]
    with pytest.raises(ArgumentError, match="out= array has shape"):
        f(x, 1.0, 0.0, out=gpu.ndarray(4095))
    assert f(x, 1.0, 0.0, out=None) is not y


def test_the_inline_key_of_torch_tensors_is_the_backends_signature(gpu):
    """The generated key reads a tensor as `CudaBackend.signature` does (grad mode
    where the tensor requires grad), with no frame of its own."""
    torch = pytest.importorskip("torch")
    f = fusec.jit(SBR, backend="cuda")
    f(gpu.ndarray(16), 1.0, 0.0)
    runner = f._runner
    runner._generate_calls()  # generated now that torch is imported
    tensors = [torch.ones(4), torch.ones(4, requires_grad=True), torch.ones(2, 3).t(), torch.nn.Parameter(torch.ones(3)),
               torch.ones(4, dtype=torch.float16)]
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            for t in tensors:  # a plain call's key: the address modulo 16 bytes for it; a graph's: the address
                signature = runner.backend.signature(t)
                assert runner._plain_key((t, 1.0, 0.0)) == (signature[1:], signature[0] % 16)
                assert runner._scalars_key((t, 1.0, 0.0)) == (runner.backend.signature(t), float, 1.0, float, 0.0)
    assert "tensor_data_ptr" in "".join(__import__("linecache").getlines(runner._plain_key.__code__.co_filename))
    sparse = torch.ones(4).to_sparse()
    assert runner._plain_key((sparse, 1.0, 0.0)) is None


# ---- recycling: a recorded call's arrays taken again once nothing references them


def test_a_dropped_output_is_reused_and_a_held_one_is_not(gpu):
    f, x = recorded(gpu)
    y = f(x, 1.0, 0.0)
    address = y.data.ptr
    del y
    launch, y = replayed_launch(f, gpu, x, 2.0, 1.0)
    assert y.data.ptr == address and address in launch[-1]  # the same array, written by this launch
    assert with_output(launch, y) == with_output(*checked_launch(f, gpu, x, 2.0, 1.0))
    z = f(x, 1.0, 0.0)  # y is held: z is another array
    assert z.data.ptr != y.data.ptr
    outputs = []
    for _ in range(6):  # y = f(x) in a loop: the call before's result is held while the call runs
        before = z
        z = f(x, 1.0, 0.0)
        assert z is not before
        outputs.append(z.data.ptr)
    assert len(set(outputs)) == 2  # the two kept take turns


@pytest.mark.parametrize("holder", ["list", "weakref", "pointer", "memory", "shape", "strides", "stream", "allocator"])
def test_an_output_referenced_or_changed_is_not_reused(gpu, holder):
    """Anything that still reaches the array, its MemoryPointer or its memory keeps it the
    caller's; a new shape, or another stream or allocator, is not the array the call needs."""
    import weakref
    f, x = recorded(gpu)
    for _ in range(3):
        f(x, 1.0, 0.0)  # both kept sets unreferenced
    y = f(x, 1.0, 0.0)
    keep = None
    if holder == "list":
        keep = [y]
    elif holder == "weakref":
        keep = weakref.ref(y)
    elif holder == "pointer":
        keep = y.data
    elif holder == "memory":
        keep = y.data.mem
    elif holder == "shape":  # each checked on its own (CuPy's shape setter changes both)
        y.shape = (64, 64)
    elif holder == "strides":  # as CuPy's _set_shape_and_strides leaves it
        y.strides, y._c_contiguous = (8,), False
    elif holder == "stream":
        gpu.stream = types.SimpleNamespace(ptr=77)
    elif holder == "allocator":
        gpu.allocator = Allocator("another allocator", gpu)
    address = y.data.ptr
    del y
    addresses = {f(x, 1.0, 0.0).data.ptr for _ in range(4)}  # each result dropped at once
    assert address not in addresses
    assert keep is not None or holder in ("shape", "strides", "stream", "allocator")
    if holder in ("stream", "allocator"):  # on that stream, with that allocator, the new arrays are reused
        assert len(addresses) == 1


def test_temporaries_are_reused_and_large_arrays_are_not(gpu):
    f = fusec.jit(SBR, backend="cuda", fuse=False)  # three kernels: two temporaries
    x = gpu.ndarray(4096)
    for _ in range(3):
        f(x, 1.0, 0.0)
    before = len(gpu.launches)
    results = [f(x, 1.0, 0.0) for _ in range(3)]  # held: new outputs, new temporaries
    launches = gpu.launches[before:]
    assert len({launch[-1][0] for launch in launches[1::3]}) == 3  # the second kernel's input: each call's own
    del results
    before = len(gpu.launches)
    for _ in range(4):
        f(x, 1.0, 0.0)
    calls = [tuple(launch[-1] for launch in gpu.launches[before + 3 * j:before + 3 * j + 3]) for j in range(4)]
    assert calls[0] == calls[2] and calls[1] == calls[3]  # the two sets kept, each taken again in turn
    big = gpu.ndarray(1 << 17)  # 512 KiB an array: more than the recycled calls' bytes
    f(big, 1.0, 0.0)
    f(big, 1.0, 0.0)
    assert len({f(big, 1.0, 0.0).data.ptr for _ in range(3)}) == 3


def test_a_new_array_takes_its_memory_from_the_allocator_in_use_read_once_a_call(gpu):
    """A recorded call that allocates (its results held) reads CuPy's allocator once, takes
    its output's memory from it (an array over that memory, not one that asks again) and
    launches into it as the checked path would; an allocator set between calls is the one
    the next call takes from; a call that reuses a set reads the allocator once too."""
    f, x = recorded(gpu)
    held = [f(x, 1.0, 0.0) for _ in range(3)]
    for allocator in (gpu.allocator, Allocator("another allocator", gpu)):
        gpu.allocator = allocator
        for s in (2.0, 3.0):
            reads, calls = gpu.allocator_reads, allocator.calls
            launch, y = replayed_launch(f, gpu, x, s, 1.0)
            held.append(y)
            assert gpu.allocator_reads == reads + 1 and allocator.calls == calls + 1
            assert y.data is allocator.last() and y.data.ptr in launch[-1]
            assert with_output(launch, y) == with_output(*checked_launch(f, gpu, x, s, 1.0))
    held.clear()
    f(x, 1.0, 0.0)
    reads, calls = gpu.allocator_reads, gpu.allocator.calls
    f(x, 1.0, 0.0)  # the result before was dropped: its set reused, the allocator read and not called
    assert gpu.allocator_reads == reads + 1 and gpu.allocator.calls == calls


def test_memory_that_misses_the_alignment_is_not_launched_as_aligned(gpu):
    """An allocator that hands out memory 4 bytes off: the recorded call (the vector
    variant) gives up on it, and the checked path launches the scalar variant into an
    output of its own."""
    f, x = recorded(gpu)
    vector = replayed_launch(f, gpu, x, 1.0, 0.0)[0][0]
    held = [f(x, 1.0, 0.0) for _ in range(3)]  # nothing to reuse: the next calls allocate
    gpu.allocator = Allocator("4 bytes off", gpu, offset=4)
    for s in (2.0, 3.0):
        before = len(gpu.launches)
        y = f(x, s, 1.0)
        held.append(y)
        (launch,) = gpu.launches[before:]
        assert y.data.ptr % 16 == 4 and launch[0] != vector and y.data.ptr in launch[-1]
        assert with_output(launch, y) == with_output(*checked_launch(f, gpu, x, s, 1.0))


def test_a_set_is_reused_only_where_none_of_its_arrays_is_referenced(gpu):
    """Two outputs a call: the kept set whose second output the caller still holds (its
    first dropped) is passed over for the other; once dropped, it is taken again."""
    f = fusec.jit("pipeline p(a: f32[n]) -> (y: f32[n], z: f32[n]) { y = a * 2.0; z = a + 1.0; }", backend="cuda")
    x = gpu.ndarray(4096)
    for _ in range(4):
        f(x)  # two sets kept, both dropped
    z = f(x)[1]  # the older set taken again; its y dropped at once, its z held
    kept = z.data.ptr
    f(x)  # the other set, dropped: now the older one
    y, other = f(x)  # the set holding z is checked first, and passed over
    assert kept not in (y.data.ptr, other.data.ptr)
    del y, other, z
    assert f(x)[1].data.ptr == kept  # dropped: the set is taken again


def test_out_calls_reuse_their_temporaries(gpu):
    f = fusec.jit(SBR, backend="cuda", fuse=False)
    x, y = gpu.ndarray(4096), gpu.ndarray(4096)
    for _ in range(3):
        f(x, 1.0, 0.0, out=y)
    before = len(gpu.launches)
    assert f(x, 2.0, 1.0, out=y) is y and f(x, 2.0, 1.0, out=y) is y
    first, second = gpu.launches[before:before + 3], gpu.launches[before + 3:]
    assert [launch[-1] for launch in first] == [launch[-1] for launch in second]  # one set: nothing else holds it
    assert y.data.ptr in first[-1][-1]


def test_the_replay_follows_the_device_last_called_on(gpu):
    f, x = recorded(gpu)
    elsewhere = gpu.ndarray(4096, device=1)
    for _ in range(3):
        f(elsewhere, 1.0, 0.0)
    assert f._replaying is f._runners[1]
    launch, _ = replayed_launch(f, gpu, elsewhere, 1.0, 0.0)
    assert launch[0][1] == 1
    f(x, 1.0, 0.0)  # device 0's array: its runner's replay again (installed by the checked path)
    launch, _ = replayed_launch(f, gpu, x, 1.0, 0.0)
    assert launch[0][1] == 0 and f._replaying is f._runners[0]
    with gpu.cp.cuda.Device(1):  # the replay of device 0 while device 1 is current: not run there
        assert f._runners[0].replay((x, 1.0, 0.0)) is executor_module().MISS


def executor_module():
    from fusec.runtime import executor
    return executor


def test_keys_read_tensors_inline_once_torch_is_imported_after_the_first_call(gpu):
    pytest.importorskip("torch")
    f, x = recorded(gpu)
    runner = f._runner
    runner._torch_known = False  # as if torch had been imported after the keys were generated
    old = runner.replay
    f(gpu.ndarray(8), 1.0, 0.0)  # a miss: generated again, torch's tensors inline, and tried from then on
    assert runner.replay is not old and runner._torch_known and f._replay is runner.replay
    assert "tensor_data_ptr" in "".join(__import__("linecache").getlines(runner.replay.__code__.co_filename))
    launch, y = replayed_launch(f, gpu, x, 2.0, 1.0)  # the call recorded before, replayed by the new code
    assert with_output(launch, y) == with_output(*checked_launch(f, gpu, x, 2.0, 1.0))


def test_a_new_array_of_a_recorded_shape_is_replayed_at_its_address(gpu):
    f, x = recorded(gpu)
    for other in (gpu.ndarray(4096), gpu.ndarray(4096, ptr=x.data.ptr + 4096)):
        launch, y = replayed_launch(f, gpu, other, 2.0, 1.0)
        assert other.data.ptr in launch[-1] and x.data.ptr not in launch[-1]
        assert with_output(launch, y) == with_output(*checked_launch(f, gpu, other, 2.0, 1.0))
    shifted = gpu.ndarray(4096, ptr=x.data.ptr + 4)  # misses the vector variant's 16 bytes
    expected = with_output(*checked_launch(f, gpu, shifted, 2.0, 1.0))
    for _ in range(3):  # a key of its own (the address modulo 16): checked, recorded, replayed
        before = len(gpu.launches)
        y = f(shifted, 2.0, 1.0)
        (launch,) = gpu.launches[before:]
        assert with_output(launch, y) == expected
    assert expected[0] != gpu.launches[0][0]  # another variant than the first recorded one
    assert len(f._runner._calls) == 2


def test_a_non_contiguous_array_of_a_recorded_shape_is_refused(gpu):
    f, x = recorded(gpu)
    strided = gpu.ndarray(4096)
    strided.strides = strided._strides = (8,)
    strided._c_contiguous, strided.flags.c_contiguous = False, False
    for _ in range(3):
        with pytest.raises(ArgumentError, match="contiguous"):
            f(strided, 1.0, 0.0)


def test_a_launch_whose_buffer_another_call_holds_takes_one_of_its_own(gpu):
    """Each written-out launch takes an argument buffer (and configuration) from its list and
    gives it back: a call that finds the list empty (another thread launching it) makes one
    more, and leaves the other's alone."""
    f, x = recorded(gpu)
    names = next(iter(f._runner._calls.values())).run.__globals__
    held = names["l0_free"].pop()  # as another thread would hold it
    before = held.arguments.layout.unpack_from(held.buffer)
    launch, y = replayed_launch(f, gpu, x, 2.0, 1.0)
    assert with_output(launch, y) == with_output(*checked_launch(f, gpu, x, 2.0, 1.0))
    assert held.arguments.layout.unpack_from(held.buffer) == before and len(names["l0_free"]) == 1
    names["l0_free"].append(held)
    for s in (3.0, 4.0):  # both taken in turn, each packed with its own call's arguments
        launch, y = replayed_launch(f, gpu, x, s, 1.0)
        assert launch[-1][2] == s


def test_threads_replaying_one_call_each_launch_their_own_arguments_into_their_own_outputs(gpu, monkeypatch):
    """Four threads replaying one recorded call, switching as often as the interpreter lets
    them: each launch reads its own thread's scalars back from the buffer it was given, and
    no two threads ever hold the same output (recycled arrays are taken by one call at a time)."""
    import threading
    f, x = recorded(gpu)
    held, errors = {}, []

    def launch_of_thread(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        """The stand-in's launch, its record with the scalar of the thread that made it."""
        buffer = gpu.buffers[params]
        gpu.launches.append((threading.current_thread().scalar, buffer.layout.unpack_from(buffer.buffer)))
        return (0,)
    gpu.driver.cuLaunchKernel = gpu.launch = launch_of_thread
    f._runner.forget()
    threading.current_thread().scalar = 1.0
    f(x, 1.0, 0.0)
    f(x, 1.0, 0.0)  # recorded again, through the launch above
    gpu.launches.clear()
    monkeypatch.setattr(sys, "getswitchinterval", sys.getswitchinterval)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(s: float):
        threading.current_thread().scalar = s
        try:
            for _ in range(300):
                y = f(x, s, 0.0)
                held[s] = y
                if any(other is y for key, other in list(held.items()) if key != s):
                    errors.append("two threads hold one output")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))
    threads = [threading.Thread(target=work, args=(float(k + 2),)) for k in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    assert len(gpu.launches) == 1200
    for s, args in gpu.launches:
        assert args[2] == s  # s as this thread passed it


def torch_standin(gpu, monkeypatch):
    """torch, its CPU tensors standing in for CUDA ones (get_device() 0, the outputs on the
    CPU, torch's stream a handle of its own, 4321)."""
    torch = pytest.importorskip("torch")
    from fusec.interop import torch_arrays
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0, raising=False)
    view = torch_arrays.device_view

    def device_view(cp, tensor, device):  # its checks, then a stand-in array at the tensor's address
        try:
            view(cp, tensor, device)
        except AttributeError:  # the stand-in CuPy's missing UnownedMemory: the checks have run
            pass
        return gpu.ndarray(tuple(tensor.shape), torch_arrays.numpy_dtypes()[tensor.dtype], ptr=tensor.data_ptr())
    monkeypatch.setattr(torch_arrays, "device_view", device_view)
    kinds = cuda.DeviceArrays.kind

    def kind(self, value):  # torch's kind with CPU outputs, its stream a handle of its own
        if self._torch is None and torch_arrays.is_tensor(value):
            self._torch = torch_arrays.TorchTensors(torch.device("cpu"), self._torch_view)
            self._torch.stream_handle = lambda: 4321
        return kinds(self, value)
    monkeypatch.setattr(cuda.DeviceArrays, "kind", kind)
    return torch


def test_torch_tensors_replay_on_torchs_stream_into_torch_outputs(gpu, monkeypatch):
    """CPU tensors standing in for CUDA ones (get_device() 0, the outputs on the CPU): a call
    of tensors is recorded and replayed as the checked path launches it, on torch's stream,
    into a new tensor as torch.empty would make it (an empty tensor's new_empty_strided);
    another tensor of the recorded shape replays at its own address; one that requires grad
    is refused under grad mode, however often its shape was seen."""
    torch = torch_standin(gpu, monkeypatch)
    f = fusec.jit(SBR, backend="cuda")
    t = torch.randn(4096)
    for _ in range(3):
        y = f(t, 1.0, 0.0)
    assert type(y) is torch.Tensor and y.shape == (4096,) and y.stride() == (1,) and y.dtype == torch.float32
    new = next(iter(f._runner._calls.values())).run.__globals__["new0"]
    assert new.func.__name__ == "new_empty_strided" and new.func.__self__.numel() == 0
    for tensor in (t, torch.randn(4096)):
        launch, y = replayed_launch(f, gpu, tensor, 2.0, 1.0)
        assert launch[4] == 4321 and tensor.data_ptr() in launch[-1] and y.data_ptr() in launch[-1]
        expected, z = checked_launch(f, gpu, tensor, 2.0, 1.0)
        names = {y.data_ptr(): "y", z.data_ptr(): "y"}
        assert tuple(names.get(a, a) for a in launch[-1]) == tuple(names.get(a, a) for a in expected[-1])
    grad = torch.randn(4096, requires_grad=True)
    with torch.no_grad():
        for _ in range(3):
            f(grad, 1.0, 0.0)
    for _ in range(2):
        with pytest.raises(ArgumentError, match="requires grad"):
            f(grad, 1.0, 0.0)


def test_keys_read_tensors_first_once_a_call_of_tensors_was_recorded(gpu, monkeypatch):
    """The generated key tests for CuPy's arrays first until a call of tensors is recorded,
    then for tensors first (generated again once, not at later recordings); the keys it
    computes are the same either way, and CuPy's calls are still replayed."""
    torch = torch_standin(gpu, monkeypatch)
    f, x = recorded(gpu)
    runner = f._runner
    runner._generate_calls()  # generated now that torch is imported: CuPy's arrays tested first

    def order():
        source = "".join(__import__("linecache").getlines(runner.replay.__code__.co_filename))
        return source.index("is ndarray") < source.index("is tensor_kind0")
    assert order() and not runner.backend.tensors_first
    t = torch.randn(4096)
    key = runner._plain_key((x, 1.0, 0.0)), runner._plain_key((t, 1.0, 0.0))
    for _ in range(2):
        f(t, 1.0, 0.0)  # the second recorded: tensors first from now on
    assert not order() and runner.backend.tensors_first and f._replay is runner.replay
    assert (runner._plain_key((x, 1.0, 0.0)), runner._plain_key((t, 1.0, 0.0))) == key
    replay = runner.replay
    for other in (torch.randn(2, 8), torch.randn(3, 8)):
        for _ in range(2):
            f(other.reshape(-1), 1.0, 0.0)  # other shapes recorded: nothing generated again
    assert runner.replay is replay
    launch, y = replayed_launch(f, gpu, x, 2.0, 1.0)
    assert with_output(launch, y) == with_output(*checked_launch(f, gpu, x, 2.0, 1.0))
    launch, y = replayed_launch(f, gpu, t, 2.0, 1.0)
    assert launch[4] == 4321 and type(y) is torch.Tensor


def test_new_tensors_are_made_as_torch_empty_makes_them():
    """A recorded call's new tensors (TorchTensors.allocator: an empty tensor's
    new_empty_strided, one such tensor a dtype, holding no memory) have torch.empty's shape,
    strides, dtype and device for every shape (a 0-d one, empty dims, dims of 1), need no
    grad, and are inference tensors exactly where torch.empty's would be."""
    import itertools

    from fusec.interop import torch_arrays
    from fusec.types import ALL
    torch = pytest.importorskip("torch")
    kind = torch_arrays.TorchTensors(torch.device("cpu"), torch_arrays.host_view)
    shapes = [s for ndim in range(4) for s in itertools.product((0, 1, 3), repeat=ndim)] + [(2, 5, 7)]
    for t in ALL:
        dtype = getattr(torch, t.torch)
        for shape in shapes:
            new = kind.allocator(shape, t.numpy_dtype)()
            expected = torch.empty(shape, dtype=dtype)
            assert (new.shape, new.stride(), new.dtype, new.device) == \
                (expected.shape, expected.stride(), dtype, expected.device), (t, shape)
            assert not new.requires_grad
    make = kind.allocator((4, 3), np.dtype(np.float32))
    assert make.func.__self__ is kind.allocator((7,), np.dtype(np.float32)).func.__self__
    assert make.func.__self__.numel() == 0
    with torch.inference_mode():
        assert make().is_inference()
        inside = torch_arrays.TorchTensors(torch.device("cpu"), torch_arrays.host_view).allocator((3,), np.dtype(np.int8))
    assert not make().is_inference() and not inside().is_inference()  # the empty tensor's own mode plays no part

