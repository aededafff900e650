"""The peer generators (what `fusec bench` races against) compute what the
reference computes, checked on the CPU: NumPy stands in for cupy.fuse's
CuPy, and PyTorch eager runs on the CPU where it is installed."""
import numpy as np
import pytest
from helpers import assert_matches, pipelines, random_args

from fusec.bench.peers import TorchOps, Unsupported, XpOps, check_supported, peer_function
from fusec.passes.lower import lower
from fusec.reference import _erf
from fusec.reference import run as reference

PIPELINES = pipelines()


def _peer_and_args(program, name, ops, in_place=True):
    pipeline = program.pipeline(name)
    graph = lower(program, pipeline)
    check_supported(graph, ops)
    return peer_function(graph, ops, [p.name for p in pipeline.params], in_place), pipeline


@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "out_of_place"])
@pytest.mark.parametrize("ident,program,name", PIPELINES, ids=[p[0] for p in PIPELINES])
def test_numpy_peer_equals_reference(ident, program, name, in_place):
    try:
        peer, pipeline = _peer_and_args(program, name, XpOps(np, erf=_erf), in_place)
    except Unsupported as why:
        pytest.skip(f"peer cannot express it: {why}")
    args = random_args(pipeline, 77, seed=3)
    expected_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    expected = reference(program, name, *expected_args)
    with np.errstate(all="ignore"):
        got = peer(*args)
    if in_place:
        if expected is not None:
            assert_matches(got, expected)
        for p, a, e in zip(pipeline.params, args, expected_args):
            if p.role == "inout":
                assert_matches(a, e)
    else:  # outputs first, then the new values of the inout arrays the pipeline assigns
        graph = lower(program, pipeline)
        assigned = {graph.value(r).buffer for r in graph.results}
        finals = tuple(e for p, e in zip(pipeline.params, expected_args) if p.role == "inout" and p.name in assigned)
        outs = () if expected is None else expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        assert_matches(got, outs + finals)


@pytest.mark.parametrize("ident,program,name", PIPELINES, ids=[p[0] for p in PIPELINES])
def test_torch_eager_peer_on_cpu_equals_reference(ident, program, name):
    torch = pytest.importorskip("torch")
    try:
        peer, pipeline = _peer_and_args(program, name, TorchOps(torch))
    except Unsupported as why:
        pytest.skip(f"peer cannot express it: {why}")
    args = random_args(pipeline, 77, seed=5)
    expected_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    expected = reference(program, name, *expected_args)

    def to_torch(a):
        if not isinstance(a, np.ndarray):
            return a
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(a.copy())

    def to_numpy(t, like):
        return t.to(torch.float32).numpy().astype(like.dtype) if t.dtype == torch.bfloat16 else t.numpy()

    targs = [to_torch(a) for a in args]
    got = peer(*targs)
    if expected is not None:
        got = got if isinstance(got, tuple) else (got,)
        exp = expected if isinstance(expected, tuple) else (expected,)
        assert_matches(tuple(to_numpy(g, e) for g, e in zip(got, exp)), exp)
    for p, a, e in zip(pipeline.params, targs, expected_args):
        if p.role == "inout":
            assert_matches(to_numpy(a, e), e)
