"""The fusion decisions the cost model makes on hand-made cases, the guard after
compiling (driven by a made-up report of what ptxas gave), and --fuse."""
import json
from dataclasses import replace

import pytest
from helpers import ROOT

import fusec
import fusec.report
from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import Source
from fusec.frontend import check_source
from fusec.passes import guard
from fusec.passes.cost import target_costs, warps_per_sm


def program(text):
    return check_source(Source("<test>", text))


def wide(inputs: int) -> str:
    params = ", ".join(f"x{i}: f32[n]" for i in range(inputs))
    outs = ", ".join(f"y{j}: f32[n]" for j in range(inputs))
    body = "\n".join(f"    y{j} = tanh(" + " + ".join(f"sin(x{i} * {0.1 + 0.01 * (i + j):.2f})" for i in range(inputs))
                     + ");" for j in range(inputs))
    return f"pipeline w({params}) -> ({outs}) {{\n{body}\n}}\n"


def test_a_memory_bound_chain_fuses_into_one_kernel_and_says_why():
    c = compile_pipeline(fusec.frontend.load(str(ROOT / "examples/scale_bias_relu.fz")), "scale_bias_relu")
    (launch,) = c.interface.kernels
    assert launch.prediction.bound == "memory" and launch.prediction.bytes_per_element == 8
    assert c.partition.decisions[0].stage == "partition" and "predicted" in c.partition.decisions[0].reason
    # Unfused, the same work moves three times the bytes: the model prices that.
    unfused = compile_pipeline(c.program, "scale_bias_relu", CompileOptions(fuse="none"))
    assert sum(k.prediction.us for k in unfused.interface.kernels) > 2.5 * launch.prediction.us


def test_a_row_kernels_per_row_outputs_are_priced_once_a_row():
    """Softmax storing its rows' max and sum as well moves the same bytes an element as
    softmax alone (8 with f32 rows): a value of a row is stored once a row, not an element."""
    softmax = "m = row_max(x); e = exp(x - m); s = row_sum(e); y = e / s;"
    plain = compile_pipeline(program(f"pipeline p(x: f32[r, c]) -> (y: f32[r, c]) {{ {softmax} }}"), "p")
    stats = compile_pipeline(program("pipeline p(x: f32[r, c]) -> (y: f32[r, c], m: f32[r, 1], s: f32[r, 1]) "
                                     f"{{ {softmax} }}"), "p")
    (row,), (with_stats,) = plain.interface.kernels, stats.interface.kernels
    assert row.prediction.bytes_per_element == with_stats.prediction.bytes_per_element == 8
    assert with_stats.prediction.us == pytest.approx(row.prediction.us, rel=0.01)


def test_a_compute_heavy_stage_beside_a_copy_like_one_fuses_to_hide_the_copy():
    p = program("pipeline p(x: f32[n], w: f32[n]) -> (y: f32[n], z: f32[n]) {\n"
                "    y = erf(sin(x) * atan2(x, 1.5)) + log1p(abs(tanh(x))) * exp(-x * x);\n"
                "    z = w * 2.0;\n}")
    c = compile_pipeline(p, "p")
    (launch,) = c.interface.kernels
    assert launch.prediction.bound == "compute"
    separate = compile_pipeline(p, "p", CompileOptions(partition=((0,), (1,))))
    assert c.partition.predicted_us < separate.partition.predicted_us


def test_just_under_and_just_over_a_pressure_point():
    """A wide compute-heavy kernel keeps 40 warps per SM up to 48 registers and
    32 warps from 49 (registers go to a warp 256 at a time); arithmetic runs at
    its full rate from 40 warps (measured on the H200, BENCHMARKS.md): the model
    keeps it one kernel just under that point and splits it just over, where the
    lost warps cost more arithmetic time than the split's second read of the inputs."""
    p = program(wide(8))
    fused = compile_pipeline(p, "w")
    (group,) = fused.partition.groups
    width = fused.interface.kernels[0].variants[0].elements_per_thread
    costs = target_costs("sm_90")
    assert warps_per_sm(48, costs) == 40 and warps_per_sm(49, costs) == 32 and costs.alu_full_warps == 40

    def kernels(regs, spilled=0):
        observed = (guard.Observation(group, width, regs, spilled),)
        return len(compile_pipeline(p, "w", CompileOptions(observed=observed)).interface.kernels)
    assert kernels(48) == 1 and kernels(49) == 2
    assert kernels(255, spilled=800) == 2  # spilling: split too


def test_a_chain_past_the_instruction_caches_splits_in_two():
    """On the H200 a deep chain's time a stage grows once its machine code passes
    about 64 KiB (the probe, BENCHMARKS.md): 32 stages of bf16 in one kernel (124 KiB
    of SASS) ran 1,269 µs against 1,199 for two kernels of 16, where the memory the
    split adds hides under the arithmetic. The f32 chain's code is half as long (4
    elements a thread, not 8): it stays one kernel, as does the 16-stage bf16 one."""
    dq = _decision_quality()

    def kernels(depth, dtype):
        c = compile_pipeline(program(dq.deep(depth, dtype)), f"deep{depth}")
        return sorted(len(g) for g in c.partition.groups)
    assert kernels(32, "bf16") == [16, 16]
    assert kernels(16, "bf16") == [16]
    assert kernels(32, "f32") == [32]


def test_the_code_slowdown_starts_past_the_free_code_and_is_capped():
    from fusec.ir.launch import Elementwise
    from fusec.passes.cost import code_slowdown, compute_ps
    costs = target_costs("sm_90")
    c = compile_pipeline(program(_decision_quality().deep(32, "bf16")), "deep32", CompileOptions(fuse="all"))
    (launch,) = c.interface.kernels
    assert isinstance(launch.form, Elementwise)
    kernel, variant = launch.kernel, launch.variants[0]
    kib = costs.code_bytes_per_ps * compute_ps(kernel, costs) * variant.elements_per_thread / 1024
    assert kib > costs.code_free_kib
    assert code_slowdown(kernel, variant, costs) == pytest.approx(1 + costs.code_per_kib * (kib - costs.code_free_kib))
    one = replace(variant, elements_per_thread=1)  # an eighth of the code: under the free size
    assert code_slowdown(kernel, one, costs) == 1.0
    huge = replace(variant, elements_per_thread=1024)
    assert code_slowdown(kernel, huge, costs) == 1 + costs.code_max


def test_the_guard_plans_again_where_ptxas_surprises_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path))
    p = program(wide(12))
    compiled = compile_pipeline(p, "w")
    costs = target_costs("sm_90")

    def spilling(variant):  # a made-up report: the first kernel spills, the rest as estimated
        first = compiled.interface.kernels[0].variants[0].name
        launch = next(k for k in compiled.interface.kernels if k.variants[0].name == variant)
        return {"num_regs": 255 if variant == first else launch.variants[0].est_regs,
                "local_size_bytes": 1024 if variant == first else 32, "spill_bytes": 1024 if variant == first else 0}
    observed = guard.observe(compiled, spilling)
    reasons = guard.surprises(compiled, observed)
    assert len(reasons) == 1 and "spills (1024 bytes" in reasons[0]
    again = guard.replan(compiled, observed, lambda obs: compile_pipeline(p, "w", CompileOptions(observed=obs)))
    assert again is not compiled and again.cuda != compiled.cuda
    notes = [d.reason for d in again.interface.notes]
    assert any(n.startswith(reasons[0]) for n in notes)
    assert any("planned again" in line for line in fusec.report.report(again.interface)[0]["fusion"])
    # Remembered: the next compile of the program for sm_90 starts from the real figures.
    assert guard.remembered(p, "w", "sm_90") == observed
    # Where ptxas agrees with the model nothing happens.
    agreeing = guard.observe(compiled, lambda v: {"num_regs": 32, "local_size_bytes": 0})
    assert warps_per_sm(32, costs) == 64 and guard.surprises(compiled, agreeing) == []
    assert guard.replan(compiled, agreeing, lambda obs: pytest.fail("no re-plan")) is compiled
    # A stack frame is not a spill (sin and cos keep 32 bytes of local memory on the H200):
    # with ptxas's report it is not re-planned; without it, local memory counts as spilled.
    framed = guard.observe(compiled, lambda v: {"num_regs": 32, "local_size_bytes": 32, "spill_bytes": 0})
    assert guard.surprises(compiled, framed) == []
    unreported = guard.observe(compiled, lambda v: {"num_regs": 32, "local_size_bytes": 32})
    assert len(guard.surprises(compiled, unreported)) == len(compiled.interface.kernels)


def test_a_damaged_guard_entry_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path))
    p = program(wide(8))
    from fusec import cache
    cache.write("guard", guard._key(p, "w", "sm_90"), ".json", b"[[1, 2")
    assert guard.remembered(p, "w", "sm_90") == ()


@pytest.mark.parametrize("mode,kernels", [("none", 8), ("all", 1)])
def test_fuse_modes_on_the_cli_and_jit(run_cli, mode, kernels):
    path = str(ROOT / "examples/transcendental_chain.fz")
    code, stdout, _ = run_cli("compile", path, "--fuse", mode, "--emit", "report")
    assert code == 0 and len(json.loads(stdout)) == kernels
    assert len(fusec.jit(path, fuse=mode, backend="numpy").compiled.interface.kernels) == kernels
    code, alias, _ = run_cli("compile", path, "--unfused", "--emit", "report")
    assert len(json.loads(alias)) == 8


def test_fuse_all_ignores_the_budget_and_auto_honours_it():
    p = program(wide(8))
    assert len(compile_pipeline(p, "w", CompileOptions(fuse="all", max_regs=16)).interface.kernels) == 1
    capped = compile_pipeline(p, "w", CompileOptions(max_regs=48))
    assert all(k.variants[0].est_regs <= 48 or len(k.kernel.stages) == 1 for k in capped.interface.kernels)
    with pytest.raises(ValueError, match="fuse= takes"):
        fusec.jit(wide(8), fuse="some")


def test_close_candidates_are_compiled_and_the_choice_made_on_their_real_registers(tmp_path, monkeypatch):
    """guard.refine, driven by a made-up ptxas: the model's one kernel for wide(8)
    really takes 64 registers (32 warps, where arithmetic slows), every other
    kernel as estimated: the choice moves to a split, and says why."""
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path))
    p = program(wide(8))
    options = CompileOptions()
    compiled = compile_pipeline(p, "w", options)
    (whole,) = compiled.partition.groups
    built = []

    def compile_with(**changes):
        built.append(changes)
        return compile_pipeline(p, "w", replace(options, **changes))

    def registers(candidate):
        return guard.observe(candidate, lambda v: {"num_regs": 64 if len(candidate.partition.groups) == 1 else
                                                   next(k.variants[0].est_regs for k in candidate.interface.kernels
                                                        if k.variants[0].name == v), "spill_bytes": 0})
    refined = guard.refine(compiled, options, compile_with, registers)
    assert sum("partition" in c for c in built) >= 2  # the close candidates, each compiled
    assert len(refined.partition.groups) > 1
    assert any("real registers" in d.reason for d in refined.interface.notes)
    assert any(o.group == tuple(whole) and o.regs == 64 for o in guard.remembered(p, "w", "sm_90"))
    # Where ptxas agrees with the estimate, the choice stands.
    agreeing = guard.refine(compiled, options, lambda **c: compile_pipeline(p, "w", replace(options, **c)),
                            lambda c: guard.observe(c, lambda v: {"num_regs": next(
                                k.variants[0].est_regs for k in c.interface.kernels if k.variants[0].name == v),
                                "spill_bytes": 0}))
    assert agreeing.partition.groups == compiled.partition.groups
    # Not in the other fuse modes, nor for a partition chosen elsewhere (fusec tune).
    for other in (CompileOptions(fuse="all"), CompileOptions(partition=compiled.partition.groups)):
        assert guard.refine(compiled, other, lambda **c: pytest.fail("compiled"), registers) is compiled


def test_the_guard_observes_nothing_of_a_function_its_report_lacks():
    """A kernel whose function a ptxas log does not name is left unobserved (the
    estimate stands), and the others are still observed and judged."""
    source = "pipeline p(x: f32[n]) -> (y: f32[n], z: f32[n]) { y = exp(x) * 2.0; z = x * 3.0; }"
    compiled = compile_pipeline(check_source(Source("t.fz", source)), "p", CompileOptions(fuse="none"))
    names = [k.variants[0].name for k in compiled.interface.kernels]
    seen = guard.observe(compiled, lambda v: None if v == names[0] else {"num_regs": 255, "spill_bytes": 64})
    assert [o.group for o in seen] == [tuple(g) for g in compiled.partition.groups[1:]]
    reasons = guard.surprises(compiled, seen)
    assert len(reasons) == len(names) - 1 and all(names[0] not in r for r in reasons)


def test_nominal_dims_share_the_elements_among_the_space_of_most_named_dims():
    """cross_entropy's first statements are over [rows, 1] and [rows, vocab]: the
    nominal 2^26 elements are [rows, vocab]'s, 8192 x 8192 (the longest shape
    first met, [rows, 1], gave rows all 2^26 and vocab as much: the row kernels
    were priced over 2^52 elements, 10^10 µs)."""
    from fusec.passes.cost import nominal_dims
    from fusec.passes.fusion import ranked_partitions
    from fusec.passes.lower import lower
    assert nominal_dims([("rows", 1), ("rows", "vocab"), (128, 1), (1,)]) == {"rows": 8192.0, "vocab": 8192.0}
    assert nominal_dims([(4, "n"), ("n",)]) == {"n": 2.0 ** 24}
    p = fusec.frontend.load(str(ROOT / "examples/cross_entropy.fz"))
    graph = lower(p, p.pipelines[0])
    assert nominal_dims(s.shape for s in graph.stages) == {"rows": 8192.0, "vocab": 8192.0}
    # the whole pipeline reads 2^26 logits once or a few times: milliseconds at most, not 10^10 µs
    assert ranked_partitions(graph)[0][0] < 10_000


def _decision_quality():
    import importlib.util
    spec = importlib.util.spec_from_file_location("decision_quality", ROOT / "benchmarks" / "decision_quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # no CuPy at import
    return module


def test_decision_quality_plans_its_random_partitions_to_the_time_left():
    dq = _decision_quality()
    entries = [((("a",),), "model's pick", 1000.0), ((("b",),), "unfused", 3000.0)] + \
        [(((f"r{i}",),), "random", 2000.0) for i in range(dq.MAX_RANDOM)] + [((("t",),), "random (model top 5)", 900.0)]
    assert len(dq.kept_candidates(entries, 3)) == 2 + 3
    assert [e[1] for e in dq.kept_candidates(entries, 0)] == ["model's pick", "unfused"]
    full, none = dq.projected_seconds(entries, dq.MAX_RANDOM), dq.projected_seconds(entries, 0)
    assert full > none > 0
    # a long call is timed in fewer repetitions, each a call; a short one in loops of REP_SECONDS
    assert dq.pass_seconds(50_000) < 6 * 0.05 and dq.pass_seconds(100) >= dq.REPS * dq.REP_SECONDS
    assert dq.plan_randoms([entries, entries], 2 * full + 1, 1.0) == dq.MAX_RANDOM
    assert dq.plan_randoms([entries, entries], 2 * none + 1, 1.0) == 0
    middle = dq.plan_randoms([entries], (full + none) / 2, 1.0)
    assert 0 < middle < dq.MAX_RANDOM
    assert dq.projected_seconds(entries, middle) <= (full + none) / 2 < dq.projected_seconds(entries, middle + 1)


def test_decision_quality_passes_interleave_the_candidates():
    """A pass takes each candidate's samples a round at a time (each round every candidate
    still sampling, in a shuffled order), so that a drift of the clock over the pass falls on
    all; a candidate of fewer samples (a long call) drops out of the later rounds."""
    import random
    dq = _decision_quality()
    entries = [{"name": n, "samples": []} for n in "abc"]
    calls = [lambda n=n: n for n in "abc"]
    order = []

    def plan(call, reps, known):
        return (4, 2) if call() == "c" else (4, 5)  # c: long calls, two samples

    def time_calls(call, n):
        order.append(call())
        return 10.0 * n
    dq.timed_pass(entries, calls, plan, time_calls, random.Random(3))
    assert [sorted(order[3 * r:3 * r + 3]) for r in range(2)] == [["a", "b", "c"]] * 2
    assert [sorted(order[6 + 2 * r:8 + 2 * r]) for r in range(3)] == [["a", "b"]] * 3
    assert [len(e["samples"][0]) for e in entries] == [5, 5, 2] and entries[0]["samples"][0][0] == 10.0


def test_decision_quality_summary_of_a_shard(capsys):
    """The table from a shard's record: the pick against the fastest in the second
    pass and on the median of passes, the tuned pick, tau-b over pairs apart by
    more than the noise."""
    dq = _decision_quality()

    def candidate(groups, how, predicted, times, tuned=False):
        return {"groups": groups, "how": how, "ok": True, "tuned": tuned, "predicted": predicted,
                "predicted_ptxas": predicted, "t0": times[0], "t1": times[1], "final": sorted(times)[len(times) // 2]}
    pipeline = {"pipeline": "p", "dtype": "f32", "close": 2, "randoms": 1, "candidates": [
        candidate([[0, 1]], "model's pick", 100.0, (100.0, 108.0, 100.0, 100.0)),
        candidate([[0], [1]], "neighbour of the pick", 110.0, (103.0, 104.0, 103.0, 104.0), tuned=True),
        candidate([[1], [0]], "random", 200.0, (200.0, 201.0)),
    ]}
    shard = {"shard": "0/1", "device": "none", "elapsed": 1.0, "randoms_planned": 1, "max_random": 40,
             "not_measured": [], "probe": [], "pipelines": [pipeline]}
    dq.summary([shard])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| p |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2] == "3 (0; 1)"
    assert cells[3] == "1.038" and cells[4] == "1.000"  # 108 / 104 on the second pass; the fastest on the medians
    assert cells[6] == "1.000, 1.040"  # the tuned pick: the tune set's fastest in the first pass
    # the second pass puts the pick 3.8 % behind its neighbour (the model: ahead), the median of passes ahead
    assert cells[9] == "0.33 (3)" and cells[10] == "1.00, 0.33"
    assert "Picks within 5 % (second pass): 1 of 1" in out
