"""Tests written for the survivors of the mutation run over the fusion passes'
helpers and the emitter (benchmarks/mutation_run.py, BENCHMARKS.md: run 4):
each pins, by an explicit assertion, what a surviving mutant changed."""
import math
import random

import pytest

from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import Source
from fusec.frontend import check_source
from fusec.ir.launch import Elementwise, RowBlock
from fusec.passes.fusion import Best, FusionOptions, fuse
from fusec.passes.lower import lower
from fusec.passes.partitions import Context, illegal, neighbours, random_partition
from fusec.passes.recompute import RECOMPUTE_MARGIN, recompute
from fusec.passes.variants import WIDE_VECTOR_REGS, _widths, kernel_registers, plan_variants, vector_width


def graph_of(text: str):
    program = check_source(Source("<test>", text))
    return lower(program, program.pipelines[0])


# Two runs of stages: t, u, y over [n] (a chain: u reads t, y reads t and u), then
# z, q, z again over [m, n].
TWO_RUNS = """pipeline p(x: f32[n], w: f32[m, n]) -> (y: f32[n], z: f32[m, n]) {
    t = x * 2.0;
    u = t + 1.0;
    y = u * t;
    z = w * 3.0;
    q = z + 1.0;
    z = q * 2.0;
}
"""


# ---------------------------------------------------------------------------
# passes/partitions.py


def test_a_kernel_launched_before_the_producer_it_reads_is_illegal():
    """partitions #102: a reader's kernel launched before its producer's is refused,
    though the producer reads nothing the reader writes."""
    graph = graph_of(TWO_RUNS)
    ctx = Context.of(graph)
    assert [s.name for s in graph.stages][:2] == ["t", "u"]
    assert illegal(ctx, [[0, 1, 2], [3, 4, 5]]) is None
    assert illegal(ctx, [[1], [0], [2], [3, 4, 5]]) == "stage u would run before t, which it depends on"
    with pytest.raises(ValueError, match="this partition cannot run: stage u would run before t"):
        fuse(graph, FusionOptions(groups=((1,), (0,), (2,), (3, 4, 5))))


def test_the_neighbours_of_a_partition_include_each_split_of_a_kernel():
    """partitions #147: a kernel cut in two is a neighbour (`fusec tune` times it)."""
    ctx = Context.of(graph_of(TWO_RUNS))
    found = neighbours(ctx, [[0, 1, 2], [3, 4, 5]])
    assert sorted(found) == sorted([[[0], [1, 2], [3, 4, 5]], [[0, 1], [2], [3, 4, 5]],
                                    [[0, 1, 2], [3], [4, 5]], [[0, 1, 2], [3, 4], [5]]])
    assert all(illegal(ctx, p) is None for p in found)


def test_a_random_partition_cuts_each_run_in_order_and_is_legal():
    """partitions #177, #179: every live stage in exactly one kernel, the kernels
    consecutive pieces of the runs of one iteration space."""
    ctx = Context.of(graph_of(TWO_RUNS))
    seen = set()
    for seed in range(40):
        groups = random_partition(ctx, random.Random(seed))
        assert [i for g in groups for i in g] == sorted(ctx.live), (seed, groups)
        assert not any(set(g) & {0, 1, 2} and set(g) & {3, 4, 5} for g in groups), (seed, groups)
        assert illegal(ctx, groups) is None, (seed, groups)
        seen.add(tuple(map(tuple, groups)))
    assert ((0, 1, 2), (3, 4, 5)) in seen and ((0,), (1,), (2,), (3,), (4,), (5,)) in seen


# ---------------------------------------------------------------------------
# passes/recompute.py

COLUMN = """pipeline p(x: f32[rows, cols], w: f32[cols]) -> (y: f32[rows, cols]) {
    s = w * 2.0;
    y = x * s;
}
"""


def model(us_by_stages: dict[int, float], graph):
    """A recompute model: the predicted µs of a graph by its number of stages;
    every value stored, no kernel over the cap."""
    everything = frozenset(v.name for v in graph.values)
    return lambda g: Best(us_by_stages[len(g.stages)], everything, frozenset())


def test_a_rewrite_exactly_at_the_margin_is_not_taken():
    """recompute #16: kept only where predicted faster by more than RECOMPUTE_MARGIN's share."""
    graph = graph_of(COLUMN)
    at_margin = 1000.0 * (1 - RECOMPUTE_MARGIN)
    for after, taken in ((at_margin, False), (math.nextafter(at_margin, 0.0), True)):
        rewritten, decisions = recompute(graph, model({2: 1000.0, 1: after}, graph))
        assert [s.name for s in rewritten.stages] == (["y"] if taken else ["s", "y"]), after
        assert [(d.stage, d.merged) for d in decisions] == [("s", taken)], after


def test_a_recompute_decision_is_about_no_kernel():
    """recompute #23: a decision of the recompute pass, taken or not, names no kernel (-1),
    as a dropped statement's does; the interface keeps it in its notes."""
    graph = graph_of(COLUMN)
    for after, taken in ((500.0, True), (2000.0, False)):
        _, decisions = recompute(graph, model({2: 1000.0, 1: after}, graph))
        assert [(d.stage, d.kernel, d.merged) for d in decisions] == [("s", -1, taken)]


LOOP_AFTER = """pipeline p(x: f32[rows, cols], w: f32[cols], k: i32) -> (y: f32[rows, cols]) {
    s = w * 2.0;
    y = x * s;
    repeat k {
        y = y * 0.5 + 1.0;
    }
}
"""


def test_a_loop_after_a_recomputed_producer_moves_up_by_one_stage():
    """recompute #71: the producer's removal shifts a later loop's whole range by one."""
    graph = graph_of(LOOP_AFTER)
    assert [s.name for s in graph.stages] == ["s", "y", "y_2"] and (graph.loops[0].start, graph.loops[0].stop) == (2, 3)
    rewritten, decisions = recompute(graph, model({3: 1000.0, 2: 500.0}, graph))
    assert [s.name for s in rewritten.stages] == ["y", "y_2"] and [d.merged for d in decisions] == [True]
    assert [(lp.start, lp.stop) for lp in rewritten.loops] == [(1, 2)]
    assert rewritten.loop_of(0) == -1 and rewritten.loop_of(1) == 0



# ---------------------------------------------------------------------------
# passes/variants.py


def launch_of(text: str, **options):
    program = check_source(Source("<test>", text))
    (launch,) = compile_pipeline(program, program.pipelines[0].name, CompileOptions(**options)).interface.kernels
    return launch


def light(body: str, t: str = "f32", out: str = "i8") -> str:
    return f"pipeline q(x: {t}[n], a: {t}[n], b: {t}[n]) -> (y: {out}[n]) {{\n    y = {out}({body});\n}}\n"


SLOTS = {"x": 0, "a": 1, "b": 2, "y": 3}


def test_a_light_kernel_at_exactly_the_wide_vector_limit_takes_32_bytes():
    """variants #2: f32 in, i8 out, estimated at exactly WIDE_VECTOR_REGS: 8 elements a
    thread (32 bytes of x), not 4."""
    launch = launch_of(light("x / a + b"))
    kernel = launch.kernel
    assert kernel_registers(kernel) == WIDE_VECTOR_REGS == 16
    assert vector_width(kernel, WIDE_VECTOR_REGS) == 8 and vector_width(kernel, WIDE_VECTOR_REGS + 1) == 4
    assert [v.elements_per_thread for v in launch.variants] == [8, 1]


def test_without_a_cost_model_the_widest_vector_is_planned():
    """variants #29: plan_variants without `costs` weighs nothing: the widest vector
    comes first, then the one-element variant."""
    kernel = launch_of(light("x * a + b")).kernel
    vector, scalar = plan_variants(kernel, Elementwise(), SLOTS.__getitem__)
    assert (vector.elements_per_thread, scalar.elements_per_thread) == (8, 1)
    assert vector.alignment == ((0, 32), (1, 32), (2, 32), (3, 8)) and scalar.alignment == ()


def test_an_f64_kernel_takes_a_two_element_vector():
    """variants #64: 16 bytes of f64 are two elements: the narrowest width considered is 2."""
    assert _widths(8) == [8, 4, 2] and _widths(2) == [2] and _widths(1) == []
    launch = launch_of(light("x * a + b", "f64", "f64"))
    assert [v.elements_per_thread for v in launch.variants] == [2, 1]
    assert launch.variants[0].alignment == ((0, 16), (1, 16), (2, 16), (3, 16))


def test_the_registers_ptxas_reported_hold_for_every_row_variant():
    """variants #48: an observation (passes.guard) for a row kernel, keyed by its one
    element a thread, replaces the estimate of the warp and cached variants as of the
    plain one (the warp variant's own estimate is higher: ptxas unrolls its loops further)."""
    text = "pipeline s(x: f32[rows, cols]) -> (y: f32[rows, cols]) {\n" \
           "    m = row_max(x);\n    e = exp(x - m);\n    y = e / row_sum(e);\n}\n"
    launch = launch_of(text)
    assert isinstance(launch.form, RowBlock)
    by_width = {w: [v for v in launch.variants if v.elements_per_thread == w and not v.row_resident] for w in (4, 1)}
    warp, cached, plain = by_width[1]  # one element a thread (a 4-wide vector's rows are held in registers)
    assert cached.row_cache == 4 and cached.est_regs == plain.est_regs != 77
    assert warp.est_regs > plain.est_regs and warp.grid.rows_per_block == 8
    assert by_width[4][-1].est_regs > plain.est_regs  # a vector a thread holds more
    observed = plan_variants(launch.kernel, launch.form, {"x": 0, "y": 1}.__getitem__, observed={1: 77})
    assert [(v.elements_per_thread, v.est_regs) for v in observed if v.elements_per_thread == 1] == [(1, 77)] * 3
    assert all(v.est_regs != 77 for v in observed if v.elements_per_thread == 4)  # keyed by its width
    # a row held in registers keeps its own estimate (its registers are mostly its row's)
    assert [v.est_regs for v in observed if v.row_resident] == [v.est_regs for v in launch.variants if v.row_resident]
