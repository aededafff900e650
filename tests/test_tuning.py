"""Measured choice (fusec tune, fusec.jit(tune=True)) without a GPU: the candidates,
the winner by a stand-in measurement, and the cache that keeps it."""
import pytest
from helpers import ROOT

import fusec
from fusec.compiler import CompileOptions, compile_pipeline
from fusec.runtime import tuning

CHAIN = str(ROOT / "examples/transcendental_chain.fz")


def compiled():
    program = fusec.frontend.load(CHAIN)
    return compile_pipeline(program, "transcendental_chain"), CompileOptions()


def test_the_candidates_are_the_models_best_and_their_neighbours():
    c, options = compiled()
    found = tuning.candidates(c, options)
    assert 2 <= len(found) <= tuning.MAX_CANDIDATES
    assert found[0][0] == c.partition.groups  # the model's pick first
    assert [us for _, _, us in found[1:]] == sorted(us for _, _, us in found[1:])
    assert any("neighbour" in how for _, how, _ in found)


def test_the_candidates_start_from_the_compiled_choice():
    """A choice refined on real registers (guard.refine) need not be the estimate's
    best: the set is built around it, so tuning times it and its neighbours."""
    c, options = compiled()
    other = next(groups for groups, how, _ in tuning.candidates(c, options) if "neighbour" in how)
    refined = compile_pipeline(c.program, "transcendental_chain", CompileOptions(partition=other))
    found = tuning.candidates(refined, options)
    assert found[0][0] == other and found[0][1] == "the model's choice"
    assert c.partition.groups in [groups for groups, _, _ in found]


def test_the_fastest_measured_wins_and_a_wrong_one_never_does(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path))
    c, options = compiled()
    found = tuning.candidates(c, options)
    fastest, wrong = found[-1][0], found[-2][0]

    def measure(candidates):  # a stand-in: the last candidate is fastest, the one before computes wrongly
        groups = [candidate.partition.groups for candidate in candidates]
        assert groups == [g for g, _, _ in found]  # every candidate, compiled, measured together
        return [None if g == wrong else (1.0 if g == fastest else 5.0) for g in groups]
    timings = tuning.tune(c, options, measure)
    assert timings[0].groups == fastest and timings[0].measured_us == 1.0
    assert timings[-1].measured_us is None and timings[-1].groups == wrong
    shapes = tuning.shape_class({"n": 1000})
    assert shapes == (("n", 1024),) and tuning.shape_class({"n": 1024}) == shapes
    tuning.remember(c.program, "transcendental_chain", shapes, "H200", options, timings)
    assert tuning.cached_partition(c.program, "transcendental_chain", shapes, "H200", options) == fastest
    assert tuning.cached_partition(c.program, "transcendental_chain", shapes, "A100", options) is None
    assert tuning.cached_partition(c.program, "transcendental_chain", (("n", 2048),), "H200", options) is None
    assert "| kernels | found as |" in tuning.describe(timings) and "differs" in tuning.describe(timings)


def test_candidates_are_timed_in_interleaved_rounds_so_a_drift_falls_on_all():
    """A device that slows by 10 % over the tuning (its power cap): timed one candidate
    after the other, the 2 % faster one timed last would lose; interleaved, it wins.
    Each sample is a loop of calls of at least SAMPLE_US."""
    clock = [0.0]
    base = {"slower": 1000.0, "faster": 980.0}  # µs a call at full speed
    loops = []

    def time_calls(call, n):
        us = base[call()] * n * (1 + 0.10 * min(1.0, clock[0] / 20_000))  # 10 % slower after 20 ms
        clock[0] += us
        loops.append(us)
        return us
    calls = [lambda: "slower", lambda: "faster"]
    slower, faster = tuning.interleaved_medians(calls, time_calls, rounds=9)
    assert faster < slower
    sized = 2 * (1 + 2)  # each: the warm-up calls, then a sample of 1 and of 2 calls
    assert min(loops[sized:]) >= tuning.SAMPLE_US  # then loops of at least SAMPLE_US
    # the same drift with the candidates timed one after the other: the faster one, timed last, loses
    clock[0] = 0.0
    first = [time_calls(calls[0], 2) for _ in range(9)]
    second = [time_calls(calls[1], 2) for _ in range(9)]
    assert sorted(second)[4] > sorted(first)[4]


def test_a_sample_is_sized_after_the_first_calls_and_capped():
    """The first calls of a pipeline are checked and recorded (slower on the host): a
    sample is sized after WARM_CALLS of them, doubling until it takes SAMPLE_US; a call
    that takes no time (nothing to do) stops at MAX_SAMPLE_CALLS, not millions."""
    seen = []

    def time_calls(call, n):
        seen.append(n)
        first = len(seen) == 1
        return (5000.0 if first else 0.0) + call() * n  # the first calls: 5 ms of host work
    assert tuning.sample_calls(lambda: 100.0, time_calls) == 32  # 32 x 100 µs >= 2 ms
    assert seen[0] == tuning.WARM_CALLS and seen[1:] == [1, 2, 4, 8, 16, 32]
    seen.clear()
    assert tuning.sample_calls(lambda: 0.0, time_calls) == tuning.MAX_SAMPLE_CALLS


def test_tune_needs_the_cuda_backend():
    with pytest.raises(ValueError, match="tune=True times candidates on the GPU"):
        fusec.jit(CHAIN, backend="sim", tune=True)


def test_fusec_tune_without_a_gpu_says_so(run_cli, monkeypatch):
    import fusec.runtime.backends.cuda as cuda
    monkeypatch.setattr(cuda, "available", lambda: False)
    code, _, err = run_cli("tune", CHAIN)
    assert code == 2 and "needs a CUDA device" in err


def test_rounds_leave_out_the_clearly_slower_but_keep_the_close():
    """After PRUNE_AFTER rounds a candidate slower than the fastest by more than
    PRUNE_MARGIN is timed no more; one within it is timed every round (a margin of
    nothing, or no pruning, fails this)."""
    base = {"fast": 1000.0, "close": 1000.0 * (1 + tuning.PRUNE_MARGIN / 2), "slow": 1000.0 * (1 + 2 * tuning.PRUNE_MARGIN)}
    timed = {name: 0 for name in base}

    def time_calls(call, n):
        name = call()
        timed[name] += 1
        return base[name] * n
    calls = [lambda name=name: name for name in base]
    fast, close, slow = tuning.interleaved_medians(calls, time_calls, rounds=7)
    sizing = 3  # the warm-up calls, then samples of 1 and 2 calls (2 x 1 ms reach SAMPLE_US)
    assert timed["slow"] - sizing == tuning.PRUNE_AFTER
    assert timed["fast"] - sizing == timed["close"] - sizing == 7
    assert fast < close < slow
