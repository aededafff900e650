"""The fusion pass's shortcuts give the figures of the plain computation:
a group merged from the group one stage shorter (build_kernel.Merged), the
register walk a lane group at a time (regs._walk), the arithmetic of the last
kernel priced remembered (cost.compute_ps)."""
from pathlib import Path

import pytest

from fusec.errors import Source
from fusec.frontend import check_source
from fusec.passes import cost, regs
from fusec.passes.build_kernel import Merged, build_kernel
from fusec.passes.fusion import FusionOptions, Pricer, predict_partition
from fusec.passes.lower import lower
from fusec.passes.partitions import Context

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("fusion_hurts", "dag", "polar", "adam", "layernorm", "quantize", "time_step", "cross_entropy")

# Each stage reads an input the ones before do not: a merge cannot be extended and is made afresh.
NEW_INPUTS = """
pipeline p(a: f32[n], b: f32[n], c: f32[n], s: f32) -> (x: f32[n], y: f32[n], z: f32[n]) {
    t = a * s + 1.0;
    x = exp(t) * b;
    y = t * c + sin(a);
    z = y * x - t;
}
"""
# The same statement shapes over other inputs, types and constants: same group indices, other kernels.
OTHER = """
pipeline p(a: f64[n], b: f64[n], c: f64[n], s: f64) -> (x: f64[n], y: f64[n], z: f64[n]) {
    t = a * 2.0 + s;
    x = tanh(t) * c;
    y = t * b + cos(c);
    z = y / x - t;
}
"""


def _graphs():
    for name in EXAMPLES:
        program = check_source(Source(name, (ROOT / "examples" / f"{name}.fz").read_text()))
        for pipeline in program.pipelines:
            yield f"{name}.{pipeline.name}", lower(program, pipeline)
    for name, text in (("new_inputs", NEW_INPUTS), ("other", OTHER)):
        program = check_source(Source(name, text))
        yield name, lower(program, program.pipelines[0])


def _runs(ctx: Context) -> list[list[int]]:
    """The live stages in runs of one iteration space and loop, as the search sees them."""
    graph, runs = ctx.graph, []
    for i in sorted(ctx.live):
        if runs and graph.stages[runs[-1][-1]].space == graph.stages[i].space \
                and graph.loop_of(runs[-1][-1]) == graph.loop_of(i):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


@pytest.mark.parametrize("name,graph", list(_graphs()), ids=lambda x: x if isinstance(x, str) else "")
def test_a_merge_extended_a_stage_at_a_time_builds_the_kernel_built_afresh(name, graph):
    ctx = Context.of(graph)
    for run in _runs(ctx):
        for start in range(len(run)):
            merged = None
            for end in range(start + 1, len(run) + 1):
                stages = [graph.stages[i] for i in run[start:end]]
                merged = Merged(stages) if merged is None else merged.extended(stages[-1])
                stored = set(ctx.stored(tuple(run[start:end])))
                assert build_kernel(graph, stages, stored, merged=merged) == build_kernel(graph, stages, stored)


def test_the_pricer_of_one_graph_prices_its_groups_not_another_graphs():
    """Two graphs with the same group indices, priced in turns (each Pricer extending
    its own merges, compute_ps remembering the last kernel), price as fresh Pricers."""
    graphs = {name: graph for name, graph in _graphs() if name in ("new_inputs", "other")}
    pricers = {name: Pricer(Context.of(g), FusionOptions()) for name, g in graphs.items()}
    groups = [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3), (1,), (1, 2), (1, 2, 3), (2, 3), (0, 1, 2, 3)]
    seen = {}
    for group in groups:
        for name, pricer in pricers.items():
            seen[name, group] = pricer.price(group)[2]
    for (name, group), us in seen.items():
        assert us == Pricer(Context.of(graphs[name]), FusionOptions()).price(group)[2]
    assert seen["new_inputs", (0, 1, 2, 3)] != seen["other", (0, 1, 2, 3)]
    # and a partition's total, priced after the other graph's
    for name, graph in graphs.items():
        assert predict_partition(graph, [[0, 1], [2, 3]]) == Pricer(Context.of(graph), FusionOptions()).total(
            [[0, 1], [2, 3]])


def test_compute_ps_remembers_a_kernel_by_its_body_not_its_place():
    costs = cost.target_costs("sm_90")
    kernels = []
    for name, graph in _graphs():
        if name in ("new_inputs", "other"):
            stages = list(graph.stages)
            kernels.append(build_kernel(graph, stages, set(Context.of(graph).stored(tuple(range(len(stages)))))))
    first, second = (cost._compute_ps(k, costs) for k in kernels)
    assert first != second
    for _ in range(2):
        assert cost.compute_ps(kernels[0], costs) == first
        assert cost.compute_ps(kernels[1], costs) == second


def _reference_walk(plan, lanes: int, group: int) -> float:
    """regs._walk as it was written first: an instruction at a time, in Python."""
    value_regs, lane_regs = (lambda n: plan.figures[n][0]), (lambda n: plan.figures[n][1 if lanes == 1 else 2])
    uniform = plan.uniform
    held_regs = {n: (value_regs(n), 0.0) if n in uniform else
                 (0, lane_regs(n) if plan.instrs[n].op == "load" else value_regs(n)) for n in range(len(plan.instrs))}
    groups = -(-lanes // group)
    runs, skipped = {}, {}
    for a, (g_at, p) in regs._release_points(plan, groups).items():
        entry = (*held_regs[a], g_at)
        runs.setdefault(p, []).append(entry)
        if a in plan.stores_at.get(p, ()):
            skipped.setdefault(p, []).append(entry)
    live = peak = sum(once + per_lane * lanes for once, per_lane in map(held_regs.__getitem__, plan.loads))
    for g in range(groups):
        count = min(group, lanes - g * group)
        for p, n in enumerate(plan.steps):
            if n is not None and not (n in uniform and g > 0):
                once, per_lane = held_regs[n]
                held = once + per_lane * count
                live += held
                one, further = plan.figures[n][3], plan.figures[n][4]
                scratch = one + regs.FURTHER_LANE_SCRATCH * further * ((1 if n in uniform else lanes) - 1)
                peak = max(peak, live + scratch)
                if n not in plan.last:
                    live -= held
                rel = runs.get(p, ())
            else:
                rel = skipped.get(p, ())
            store_lanes = sum(lane_regs(s) for s in plan.stores_at.get(p, ()))
            if lanes > 1:
                live += store_lanes * count
            for once, per_lane, g_at in rel:
                if g_at is None or g_at == g:
                    live -= once + per_lane * count
            peak = max(peak, live)
            if lanes > 1 and g == groups - 1:
                live -= store_lanes * lanes
    return peak


@pytest.mark.parametrize("name,graph", list(_graphs()), ids=lambda x: x if isinstance(x, str) else "")
def test_the_walk_a_lane_group_at_a_time_gives_the_walk_an_instruction_at_a_time(name, graph):
    ctx = Context.of(graph)
    for run in _runs(ctx):
        for start in range(len(run)):
            for end in range(start + 1, min(len(run), start + 4) + 1):  # groups of up to four stages
                stages = [graph.stages[i] for i in run[start:end]]
                kernel = build_kernel(graph, stages, set(ctx.stored(tuple(run[start:end]))))
                estimate = regs.KernelEstimate(kernel)
                estimate(regs.VariantShape())
                estimate(regs.VariantShape(grid_stride=True, loop=True))
                for plan in estimate._plans.values():
                    for lanes in (1, 2, 4, 8, 16):
                        for group in dict.fromkeys((1, 2, lanes)):
                            if group <= lanes:
                                assert regs._walk(plan, lanes, group) == _reference_walk(plan, lanes, group)
