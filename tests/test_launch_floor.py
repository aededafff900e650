"""benchmarks/launch_floor.py without a GPU: it imports with no CuPy, and its table of where
a call's µs go and of issue 13's targets is the arithmetic of the rows it measured."""
import importlib.util

from helpers import ROOT


def load():
    spec = importlib.util.spec_from_file_location("launch_floor", ROOT / "benchmarks" / "launch_floor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # no CuPy, torch or cuda.bindings at import
    return module


def test_the_summary_is_the_arithmetic_of_the_rows():
    rows = {"raw": 6.5, "driver": 5.0, "driver_ex": 4.5, "stream": 0.2, "device": 0.1, "replayed": 5.8, "held": 7.5,
            "out": 6.0, "fresh": 6.2, "checked": 20.0, "torch": 8.0, "compiled": 40.0}
    text = "\n".join(load().summary(rows))
    assert "| driver launch through cuda.bindings (cuLaunchKernelEx, fusec's) | 4.50 |" in text
    assert "| the rest: key, look-up, scalar checks, reuse check, packing, lock | 1.00 |" in text
    assert "on top | 1.70 |" in text
    assert "| a replayed call (its output reused) <= 1.0x RawKernel (6.50): 0.89x, | 5.80 µs | yes |" in text
    assert "| a call with its output allocated (replayed, nothing to reuse) <= 1.0x RawKernel (6.50): 1.15x, " \
           "| 7.50 µs | **no** |" in text
    assert "within 1 µs of cuLaunchKernel (5.00): +0.80, | 5.80 µs | yes |" in text
    assert "alignment checked) within 3 µs of cuLaunchKernel (5.00): +1.20, | 6.20 µs | yes |" in text
    assert "checked in full by the binder: 20.00 µs)" in text
    assert "| torch.compile's host time >= 4x fusec's (torch tensors) | 5.00x | yes |" in text


def test_calls_that_allocate_are_also_set_against_a_launch_that_allocates():
    """The allocating call against RawKernel with its output from cupy.empty each call, the
    torch-tensor call against RawKernel on tensors with its output from torch.empty: rows of
    their own, beside the comparisons with the bare launch."""
    rows = {"raw": 6.5, "driver": 5.0, "driver_ex": 4.5, "stream": 0.2, "device": 0.1, "replayed": 5.8, "held": 7.5,
            "out": 6.0, "fresh": 6.2, "checked": 20.0, "torch": 8.0, "raw_alloc": 8.0, "raw_torch": 7.5}
    text = "\n".join(load().summary(rows))
    assert "| a call with its output allocated (replayed, nothing to reuse) <= 1.0x RawKernel with its output from " \
           "cupy.empty each call (8.00): 0.94x, | 7.50 µs | yes |" in text
    assert "| a torch-tensor call <= 1.0x RawKernel on torch tensors, with its output from torch.empty each call " \
           "(7.50): 1.07x, | 8.00 µs | **no** |" in text
    assert "<= 1.0x RawKernel (6.50): 1.15x, | 7.50 µs | **no** |" in text  # against the bare launch, as before
    del rows["raw_torch"], rows["torch"]
    text = "\n".join(load().summary(rows))
    assert "cupy.empty each call (8.00)" in text and "torch.empty each call" not in text


def test_the_summary_without_torch():
    rows = {"raw": 6.5, "driver": 5.0, "driver_ex": 5.5, "stream": 0.2, "device": 0.1, "replayed": 6.0, "held": 7.5,
            "out": 6.0, "fresh": 6.5, "checked": 20.0}
    text = "\n".join(load().summary(rows))
    assert "torch" not in text and "(cuLaunchKernelEx, fusec's) | 5.50 |" in text


def test_per_call_is_the_median_of_its_runs():
    calls = []
    assert load().per_call(lambda: calls.append(1), lambda: None, iters=10, reps=3) >= 0
    assert len(calls) == 200 + 30
