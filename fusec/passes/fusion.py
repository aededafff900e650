"""The fusion pass: which stages become one kernel, decided by the cost model.

Candidates (passes.partitions): the greedy merge under register caps from 32
to 255 (what a fixed budget would pick), everything that may fuse fused
(--fuse all), and the cheapest consecutive split of every run of stages
(dynamic programming over the cost model's price of each group). Each
candidate kernel is priced as it will run: built as the plan pass builds it,
with the variant the runtime launches first and that variant's own register
estimate (passes.variants, passes.cost). The cheapest candidate wins; the
decisions record why each stage is where it is, and the prediction of the
chosen partition beside the runners-up.

A register budget given by the user (`max_regs`) is a hard cap: only
candidates within it are considered. --fuse none is the unfused form; --fuse
all ignores every budget.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from fusec.ir.launch import RegisterLoop
from fusec.ir.stages import Decision, StageGraph
from fusec.passes.build_kernel import Merged, build_kernel
from fusec.passes.cost import (
    NOMINAL_ELEMENTS,
    Prediction,
    nominal_dims,
    nominal_elements,
    nominal_row,
    predict,
    target_costs,
)
from fusec.passes.liveness import needed_after
from fusec.passes.partitions import Context, Group, decisions_for, greedy, illegal, segments
from fusec.passes.forms import form_of
from fusec.passes.variants import plan_variants, variant_for_rows
from fusec.target import DEFAULT_ARCH

FUSE_MODES = ("auto", "all", "none")
# The caps of the greedy candidates: what fixed budgets from a quarter to all
# of the register file per thread would pick.
CAPS = (32, 40, 48, 56, 64, 80, 96, 128, 160, 192, 255)
# A repeat count given at call time is priced as this many iterations.
NOMINAL_COUNT = 10
# Merged bodies a Pricer keeps to extend (Pricer._merged): the open groups of a search.
MERGES_KEPT = 256


@dataclass(frozen=True, slots=True)
class FusionOptions:
    mode: str = "auto"
    max_regs: int | None = None   # a hard cap on the estimate of the variant that runs
    arch: str = DEFAULT_ARCH
    elements: int = NOMINAL_ELEMENTS
    groups: tuple[tuple[int, ...], ...] | None = None  # a partition chosen elsewhere (fusec tune): used as given
    observed: tuple = ()  # passes.guard.Observation: compiled kernels' real registers, in place of estimates
    fast_math: bool = False


@dataclass(frozen=True, slots=True)
class Best:
    """The auto mode's pick for a graph, as the recompute pass weighs it."""

    us: float                    # predicted
    stored: frozenset[str]       # values its kernels write to memory
    over_cap: frozenset[str]     # statements in kernels over FusionOptions.max_regs


@dataclass(frozen=True, slots=True)
class Partition:
    groups: tuple[tuple[int, ...], ...]   # stage indices per kernel, in launch order
    stored: tuple[frozenset[str], ...]    # values each kernel writes to memory
    decisions: tuple[Decision, ...]
    # Per loop of the graph: its kernels (group indices), and whether they are one
    # kernel iterating in registers (else they are launched `count` times).
    loops: tuple[tuple[tuple[int, ...], bool], ...] = ()
    predicted_us: float | None = None     # the cost model's total for the chosen candidate


def fuse(graph: StageGraph, options: FusionOptions = FusionOptions()) -> Partition:
    if options.mode not in FUSE_MODES:
        raise ValueError(f"fuse mode must be one of {', '.join(FUSE_MODES)}, got {options.mode!r}")
    if options.mode == "none":
        stages = graph.stages
        decisions = [Decision(s.name, i, False, "unfused form: one kernel per stage") for i, s in enumerate(stages)]
        loops = tuple((tuple(range(loop.start, loop.stop)), False) for loop in graph.loops)
        return Partition(tuple((i,) for i in range(len(stages))), tuple(frozenset(s.outputs) for s in stages),
                         tuple(decisions), loops)
    ctx = Context.of(graph)
    pricer = Pricer(ctx, options)
    if options.groups is not None:
        groups = [list(g) for g in options.groups]
        why = illegal(ctx, groups)
        if why:
            raise ValueError(f"this partition cannot run: {why}")
        us = pricer.total(groups)
        summary = Decision("partition", 0, False, f"given: {us:.0f} µs predicted at {options.elements} elements")
        return _partition(ctx, groups, [summary] + decisions_for(ctx, groups), us)
    if options.mode == "all":
        groups, decisions = greedy(ctx, lambda group, stage: None)
        return _partition(ctx, groups, decisions, pricer.total(groups))
    if not ctx.live:
        return _partition(ctx, [], [], 0.0)
    priced = _search(graph, options)[2]
    us, name, groups, decisions = priced[0]
    if decisions is None:
        decisions = decisions_for(ctx, groups)
    others = "; ".join(f"{n}: {u:.0f} µs, {len(g)} kernel{'s' if len(g) != 1 else ''}" for u, n, g, _ in priced[1:4])
    summary = Decision("partition", 0, False, f"{name}: {us:.0f} µs predicted at {options.elements} elements"
                       + (f" (next: {others})" if others else ""))
    return _partition(ctx, groups, [summary] + decisions, us)


def best_partition(graph: StageGraph, options: FusionOptions = FusionOptions()) -> Best:
    """The auto mode's pick for `graph`."""
    ctx, pricer, ranked = _search(graph, options)
    if not ctx.live:
        return Best(0.0, frozenset(), frozenset())
    us, _, groups, _ = ranked[0]
    stages = graph.stages
    over = frozenset(stages[i].name for g in groups if options.max_regs is not None
                     and pricer.price(tuple(g))[0] > options.max_regs for i in g)
    return Best(us, frozenset().union(*(ctx.stored(tuple(g)) for g in groups)), over)


def ranked_partitions(graph: StageGraph, options: FusionOptions = FusionOptions()) -> list[tuple]:
    """Every candidate of the auto mode, best first: (predicted µs, which candidates, groups)."""
    return [(us, name, groups) for us, name, groups, _ in _search(graph, options)[2]]


@functools.lru_cache(maxsize=8)
def _search(graph: StageGraph, options: FusionOptions) -> tuple[Context, "Pricer", list[tuple]]:
    """`_ranked` for a graph, remembered: the recompute pass and the fusion pass
    ask for the same graph's candidates."""
    ctx = Context.of(graph)
    pricer = Pricer(ctx, options)
    return ctx, pricer, _ranked(ctx, pricer, options) if ctx.live else []


def _ranked(ctx: Context, pricer: "Pricer", options: FusionOptions) -> list[tuple]:
    """(predicted µs, names, groups, decisions or None) of every candidate, cheapest first."""
    candidates: dict[tuple, list] = {}  # partition -> [its names, groups, decisions]

    def add(name: str, groups: list[list[int]], decisions: list[Decision] | None) -> None:
        entry = candidates.setdefault(_key(groups), [[], groups, decisions])
        entry[0].append(name)

    caps = [c for c in CAPS if options.max_regs is None or c <= options.max_regs]
    if options.max_regs is not None and options.max_regs not in caps:
        caps.append(options.max_regs)
    for cap in caps:
        add(f"greedy under {cap} registers", *greedy(ctx, pricer.within(cap)))
    if options.max_regs is None:
        add("everything fused", *greedy(ctx, lambda group, stage: None))
    add("cheapest consecutive split",
        segments(ctx, pricer.group_us if options.max_regs is None else pricer.capped(options.max_regs)), None)
    return sorted(((pricer.total(g), _names(names), g, d) for names, g, d in candidates.values()),
                  key=lambda c: (c[0], len(c[2])))


def _names(names: list[str]) -> str:
    """The candidates that gave one partition: greedy caps as a range."""
    caps = [int(n.split()[2]) for n in names if n.startswith("greedy under ")]
    rest = [n for n in names if not n.startswith("greedy under ")]
    if caps:
        rest.insert(0, f"greedy under {caps[0]}{f'-{caps[-1]}' if len(caps) > 1 else ''} registers")
    return ", ".join(rest)


def _key(groups: list[list[int]]) -> tuple:
    return tuple(map(tuple, groups))


def _partition(ctx: Context, groups: list[list[int]], decisions: list[Decision], us: float | None) -> Partition:
    graph = ctx.graph
    loops = []
    extra = []
    for n, loop in enumerate(graph.loops):
        members = tuple(k for k, g in enumerate(groups) if graph.loop_of(g[0]) == n)
        body = [j for j in range(loop.start, loop.stop) if j in ctx.live]
        # One kernel for the whole body: it iterates in registers.
        loops.append((members, len(members) == 1 and len(groups[members[0]]) == len(body)))
        if not loops[-1][1] and members:
            extra.append(Decision(graph.stages[loop.start].name, members[0], False,
                                  f"repeat body is {len(members)} kernels, launched {loop.count} times: "
                                  "not one kernel iterating in registers"))
    return Partition(tuple(map(tuple, groups)), tuple(ctx.stored(tuple(g)) for g in groups),
                     tuple(decisions + extra + ctx.dropped()), tuple(loops), us)


class Pricer:
    """The cost model's price of a group of stages as one kernel (cached per group)."""

    def __init__(self, ctx: Context, options: FusionOptions):
        self.ctx, self.options = ctx, options
        self.costs = target_costs(options.arch, options.fast_math)
        self.price = functools.lru_cache(maxsize=None)(self._price)
        self._merges: dict[Group, Merged] = {}
        self.observed = observed_registers(options.observed)
        self.dims = nominal_dims((stage.shape for stage in ctx.graph.stages), options.elements)

    def _price(self, group: Group) -> tuple[int, Prediction, float]:
        """(registers of the variant that runs, its prediction, µs including repeats)."""
        graph = self.ctx.graph
        stages = [graph.stages[i] for i in group]
        loop_index = graph.loop_of(group[0])
        loop = graph.loops[loop_index] if loop_index >= 0 else None
        body = [j for j in range(loop.start, loop.stop) if j in self.ctx.live] if loop else []
        count = (loop.count if isinstance(loop.count, int) else NOMINAL_COUNT) if loop else 1
        if loop is not None and list(group) == body:  # the whole body: one kernel iterating in registers
            kernel = build_kernel(graph, stages, needed_after(graph, loop, self.ctx.live), loop=loop)
            form, repeats = RegisterLoop(count), 1
        else:
            kernel = build_kernel(graph, stages, set(self.ctx.stored(group)), merged=self._merged(group))
            form, repeats = form_of(kernel), count
        variants = plan_variants(kernel, form, lambda buffer: 0, self.costs, self.observed.get(tuple(group)))
        variant = variant_for_rows(variants, nominal_row(kernel, self.dims))
        iterations = count if isinstance(form, RegisterLoop) else 1
        prediction = predict(kernel, variant, nominal_elements(kernel.shape, self.dims), self.costs, iterations)
        return variant.est_regs, prediction, prediction.us * repeats

    def _merged(self, group: Group) -> Merged:
        """The group's stages merged: from the group one stage shorter where that was
        priced last (the search grows groups a stage at a time), kept until extended."""
        stages = self.ctx.graph.stages
        prefix = self._merges.pop(group[:-1], None)
        merged = prefix.extended(stages[group[-1]]) if prefix else Merged([stages[i] for i in group])
        self._merges[group] = merged
        if len(self._merges) > MERGES_KEPT:
            del self._merges[next(iter(self._merges))]
        return merged

    def group_us(self, group: Group) -> float:
        return self.price(group)[2]

    def capped(self, cap: int):
        def price(group: Group) -> float:
            regs, _, us = self.price(group)
            return us if regs <= cap or len(group) == 1 else float("inf")
        return price

    def within(self, cap: int):
        """accept() for the greedy: the merged kernel's variant that runs stays within `cap` registers."""
        def accept(group: Group, stage: int) -> str | None:
            regs = self.price(group + (stage,))[0]
            return None if regs <= cap else f"estimated {regs} registers > budget {cap}"
        return accept

    def total(self, groups: list[list[int]]) -> float:
        return sum(self.group_us(tuple(g)) for g in groups)


def observed_registers(observed) -> dict[tuple[int, ...], dict[int, int]]:
    """group -> {elements per thread: registers}: a compiled kernel's real count,
    with each 4 spilled bytes counted as a register beyond 255, which the cost
    model prices as spill traffic."""
    out: dict[tuple[int, ...], dict[int, int]] = {}
    for o in observed:
        regs = o.regs if not o.spill_bytes else max(o.regs, 255) + -(-o.spill_bytes // 4)
        out.setdefault(tuple(o.group), {})[o.elements_per_thread] = regs
    return out


def predict_partition(graph: StageGraph, groups: list[list[int]], options: FusionOptions = FusionOptions()) -> float:
    """The cost model's total for any legal partition of `graph` (µs at options.elements)."""
    ctx = Context.of(graph)
    return Pricer(ctx, options).total(groups)
