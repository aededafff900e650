"""foreach (multi-tensor apply): one launch over many sets of arrays of
different sizes, in the sim (several blocks share the work table; sets smaller
than a work item, larger than one, and empty), against the reference."""
import numpy as np
import pytest
from helpers import ROOT, assert_matches

import fusec
from fusec.errors import ArgumentError

ADAM = str(ROOT / "examples" / "adam.fz")
pytestmark = pytest.mark.sim

SCALARS = (1e-3, 0.9, 0.999, 1e-8, 0.1, 0.001)


def adam_sets(sizes, seed=0):
    rng = np.random.default_rng(seed)
    sets = []
    for n in sizes:
        p, g, m, v = (rng.standard_normal(n).astype(np.float32) for _ in range(4))
        sets.append((p, g, m, np.abs(v)))
    return sets


def step_and_compare(f, sets, expected):
    """One Adam step: f.foreach over `sets`, the reference once per set over
    `expected` (their copies); then every array equal."""
    f.foreach(sets, *SCALARS)
    reference = fusec.jit(ADAM, backend="numpy")
    for arrays in expected:
        reference(*arrays, *SCALARS)
    for got, want in zip(sets, expected):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_foreach_in_one_launch_equals_the_reference_per_set():
    sizes = [10, 70_000, 1, 0, 200_003, 65_536, 3]
    sets, expected = adam_sets(sizes), adam_sets(sizes)
    f = fusec.jit(ADAM, backend="sim")
    step_and_compare(f, sets, expected)
    backend = f._foreach_runner.backend
    assert backend.launched == ["adam_k0_mt"]  # one launch for all seven sets


def test_foreach_returns_each_sets_outputs():
    f = fusec.jit(str(ROOT / "examples" / "dag.fz"), backend="sim")
    rng = np.random.default_rng(2)
    sets = [tuple(rng.standard_normal(n).astype(np.float32) for _ in range(3)) for n in (5, 100_000)]
    results = f.foreach(sets)
    for (a, b, c), outputs in zip(sets, results):  # sigmoid: glibc's expf against NumPy's, within tolerance
        assert_matches(outputs, fusec.jit(str(ROOT / "examples" / "dag.fz"), backend="numpy")(a, b, c))


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_foreach_bad_input(backend):
    f = fusec.jit(ADAM, backend=backend)
    sets = adam_sets([4, 5])
    with pytest.raises(ArgumentError, match="non-empty list"):
        f.foreach([], *SCALARS)
    if backend == "sim":
        with pytest.raises(ArgumentError, match="foreach set 1: expected 4 arrays"):
            f.foreach([sets[0], sets[1][:3]], *SCALARS)
        mixed = (sets[1][0].astype(np.float64),) + sets[1][1:]
        with pytest.raises(ArgumentError, match="foreach set 1: parameter 'param': expected dtype f32"):
            f.foreach([sets[0], mixed], *SCALARS)
        with pytest.raises(ArgumentError, match="foreach set 0: parameter 'grad': dim 'n' is 5 here but 4"):
            f.foreach([(sets[0][0], sets[1][1], sets[0][2], sets[0][3])], *SCALARS)
        with pytest.raises(ArgumentError, match="foreach is missing scalar"):
            f.foreach(sets, 1e-3)


def test_foreach_needs_one_elementwise_kernel():
    with pytest.raises(ValueError, match="no broadcasting"):
        fusec.jit(str(ROOT / "examples" / "bias_gelu.fz"), backend="sim").foreach([])
    with pytest.raises(ValueError, match="fuses into one kernel"):
        fusec.jit(ADAM, backend="sim", fuse="none").foreach([])


def test_foreach_sets_may_not_share_written_memory():
    f = fusec.jit(ADAM, backend="sim")
    a, b = adam_sets([8, 8])
    with pytest.raises(ArgumentError, match="shares memory with another set"):
        f.foreach([a, (a[0],) + b[1:]], *SCALARS)  # both sets would update the same param
    shared_grad = (b[0], a[1], b[2], b[3])  # a gradient read by two sets is fine
    f.foreach([a, shared_grad], *SCALARS)


def test_foreach_vectors_where_aligned_and_elements_elsewhere():
    """Sets whose arrays start 4 bytes into an allocation take the one-element
    path; aligned sets their 16-byte vectors, with a tail; both equal the reference."""
    sizes = [70_001, 5, 130_000, 66_000]
    base, expected = adam_sets([n + 1 for n in sizes], seed=4), adam_sets([n + 1 for n in sizes], seed=4)
    shift = [j % 2 for j in range(len(sizes))]  # every other set misaligned
    sets = [tuple(a[s:s + n] for a in arrays) for arrays, s, n in zip(base, shift, sizes)]
    want = [tuple(a[s:s + n] for a in arrays) for arrays, s, n in zip(expected, shift, sizes)]
    f = fusec.jit(ADAM, backend="sim")
    step_and_compare(f, sets, want)
    ((_, prepared),) = f._foreach_runner._prepared
    assert prepared.aligned == [True, False, True, False]


def test_foreach_keeps_its_tables_for_the_same_arrays():
    """A second call with the same arrays reuses the checked tables (and sees
    their new values); a set with a different array is checked afresh."""
    f = fusec.jit(ADAM, backend="sim")
    runner = f._foreach_runner
    sets, expected = adam_sets([1000, 70_000]), adam_sets([1000, 70_000])
    for step in range(3):
        step_and_compare(f, sets, expected)
        sets[0][1][:] = expected[0][1][:] = step  # a new gradient, in place
    assert len(runner._prepared) == 1
    fresh = (sets[1][0].copy(),) + sets[1][1:]
    f.foreach([sets[0], fresh], *SCALARS)
    assert len(runner._prepared) == 2
    read_only = sets[1][0].copy()
    read_only.flags.writeable = False
    with pytest.raises(ArgumentError, match="foreach set 1: parameter 'param' is inout, but the array is read-only"):
        f.foreach([sets[0], (read_only,) + sets[1][1:]], *SCALARS)


def _foreach_capable():
    from helpers import multi_tensor_pipelines
    return [pytest.param(program, name, id=ident) for ident, program, name, _ in multi_tensor_pipelines()]


@pytest.mark.parametrize("program,name", _foreach_capable())
def test_every_foreach_capable_pipeline_equals_its_calls(program, name):
    """Every pipeline foreach accepts, over sets of 70,001, 5, 0 and 1,000
    elements (the second set 1 element into its allocations), equals one sim
    call per set, outputs and inout arrays both."""
    from helpers import loaded_as_jit_does, random_args

    from fusec.jit import JitOptions, JitPipeline
    pipeline = program.pipeline(name)
    arrays = [i for i, p in enumerate(pipeline.params) if p.shape is not None]
    sets, per_call = [], []
    for j, size in enumerate([70_001, 5, 0, 1000]):
        shift = 1 if j == 1 else 0
        args = random_args(pipeline, size + shift, seed=j)
        args = [a[shift:] if i in arrays else a for i, a in enumerate(args)]
        sets.append(args)
        per_call.append([a.copy() if i in arrays else a for i, a in enumerate(args)])
    scalars = [a for i, a in enumerate(sets[0]) if i not in arrays]
    f = JitPipeline(loaded_as_jit_does(program), name, JitOptions(backend="sim"))
    results = f.foreach([tuple(args[i] for i in arrays) for args in sets], *scalars)
    for args, expected_args, result in zip(sets, per_call, results):
        expected = f(*expected_args)
        if expected is not None:
            assert_matches(result, expected)
        for i in arrays:
            assert_matches(args[i], expected_args[i])


def test_foreach_holds_no_arrays():
    """A kept preparation describes memory by address, shape and dtype; it keeps
    no array alive (an optimizer's old gradients are freed as usual)."""
    import gc
    import weakref
    f = fusec.jit(ADAM, backend="sim")
    sets = adam_sets([100, 70_000])
    grads = [weakref.ref(arrays[1]) for arrays in sets]
    f.foreach(sets, *SCALARS)
    assert len(f._foreach_runner._prepared) == 1
    del sets
    gc.collect()
    assert all(ref() is None for ref in grads)
