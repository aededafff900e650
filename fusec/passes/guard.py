"""The guard after compiling: what ptxas really gave each kernel, held against what the model assumed.

The register estimate only prunes. Once a module is loaded, each kernel's
function that runs reports its real registers and local memory; where it
spills, or its real registers leave fewer warps per SM than the prediction
assumed, the compiler plans again with the real figures for that group of
stages (`CompileOptions.observed`): the cost model then prefers a narrower
vector or a split. The observations are kept in fusec's cache, so the next
compile of the same program for the same architecture starts from them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable

from fusec import __version__, cache
from fusec.ir.stages import Decision
from fusec.passes.cost import target_costs, warps_per_sm


@dataclass(frozen=True, slots=True)
class Observation:
    """A compiled function's real resources: the kernel's stages (their indices in
    the stage graph), the variant's elements per thread, registers and spilled
    bytes (ptxas's spill stores and loads)."""

    group: tuple[int, ...]
    elements_per_thread: int
    regs: int
    spill_bytes: int


def observe(compiled, attributes: Callable[[str], dict]) -> tuple[Observation, ...]:
    """The real resources of each kernel's first variant (the one that runs), from
    `attributes(variant name)` (a backend's: num_regs, and spill_bytes as ptxas
    reported them, else local_size_bytes: a stack frame then counts as a spill;
    None where it has nothing of that function)."""
    out = []
    for group, launch in zip(compiled.partition.groups, compiled.interface.kernels):
        variant = launch.variants[0]
        real = attributes(variant.name)
        if real is None:  # not reported: nothing observed of this kernel
            continue
        out.append(Observation(tuple(group), variant.elements_per_thread, real["num_regs"],
                               real["spill_bytes"] if "spill_bytes" in real else real["local_size_bytes"]))
    return tuple(out)


def surprises(compiled, observed: tuple[Observation, ...]) -> list[str]:
    """Why the plan no longer holds, one reason per kernel (none: it holds)."""
    costs = target_costs(compiled.interface.arch)
    reasons = []
    seen_of = {o.group: o for o in observed}
    for group, launch in zip(compiled.partition.groups, compiled.interface.kernels):
        seen = seen_of.get(tuple(group))
        if seen is None:
            continue
        assumed = launch.prediction.warps if launch.prediction else warps_per_sm(launch.variants[0].est_regs, costs)
        real = warps_per_sm(seen.regs, costs)
        if seen.spill_bytes:
            reasons.append(f"{launch.variants[0].name} spills ({seen.spill_bytes} bytes of spill stores and loads, "
                           f"{seen.regs} registers; estimated {launch.variants[0].est_regs})")
        elif real < assumed:
            reasons.append(f"{launch.variants[0].name} uses {seen.regs} registers (estimated "
                           f"{launch.variants[0].est_regs}): {real} warps per SM where the model assumed {assumed}")
    return reasons


def _key(program, pipeline: str, arch: str) -> str:
    return cache.key(program.source.text, pipeline, arch, __version__)


def remembered(program, pipeline: str, arch: str) -> tuple[Observation, ...]:
    """Observations kept for this program, pipeline and architecture."""
    data = cache.read("guard", _key(program, pipeline, arch), ".json")
    if data is None:
        return ()
    try:
        return tuple(Observation(tuple(o[0]), o[1], o[2], o[3]) for o in json.loads(data))
    except (ValueError, TypeError, IndexError):
        return ()  # a damaged entry: start afresh


def remember(compiled, observed: tuple[Observation, ...]) -> tuple[Observation, ...]:
    """Keeps `observed` beside what was known for the program; returns all of it."""
    program, pipeline, arch = compiled.program, compiled.interface.pipeline, compiled.interface.arch
    known = {(o.group, o.elements_per_thread): o for o in remembered(program, pipeline, arch) + observed}
    data = json.dumps([[list(o.group), o.elements_per_thread, o.regs, o.spill_bytes] for o in known.values()])
    cache.write("guard", _key(program, pipeline, arch), ".json", data.encode())
    return tuple(known.values())


def replan(compiled, observed: tuple[Observation, ...], compile_again: Callable[[tuple], object]):
    """`compiled` planned again with the real registers where they surprise the model
    (and the reasons in its notes), or `compiled` itself where nothing does."""
    reasons = surprises(compiled, observed)
    if not reasons:
        return compiled
    again = compile_again(remember(compiled, observed))
    notes = tuple(Decision("guard", 0, False, f"{r}: planned again with the real registers") for r in reasons)
    return replace(again, interface=replace(again.interface, notes=again.interface.notes + notes))


# Close candidates: within this share of the best prediction, at most this many compiled.
CLOSE = 0.10
CLOSE_COMPILED = 4


def refine(compiled, options, compile_with: Callable[..., object],
           registers: Callable[[object], tuple[Observation, ...]]):
    """Before the first launch, where the model's best partitions are close: the
    top few compiled (NVRTC and ptxas, no device needed), their real registers
    and spills read (`registers(candidate)`), and the pipeline planned again
    with them, so the estimate only prunes. `compiled` was compiled with
    `options` (CompileOptions); `compile_with(**changes)` compiles the pipeline
    with some of them changed. Returns `compiled` where nothing is close or the
    fuse mode is not auto; the observations are remembered."""
    from fusec.passes.fusion import ranked_partitions
    if options.fuse != "auto" or options.partition is not None:
        return compiled
    ranked = ranked_partitions(compiled.graph, options.auto_fusion())
    close = [groups for us, _, groups in ranked if us <= ranked[0][0] * (1 + CLOSE)][:CLOSE_COMPILED]
    if len(close) < 2:  # nothing close: the estimate decided alone
        return compiled
    known = {(o.group, o.elements_per_thread) for o in options.observed}
    observed = tuple(options.observed)
    for groups in close:
        candidate = compile_with(partition=tuple(map(tuple, groups)))
        observed += tuple(o for o in registers(candidate) if (o.group, o.elements_per_thread) not in known)
    if observed == tuple(options.observed):
        return compiled
    again = compile_with(observed=remember(compiled, observed))
    note = Decision("guard", 0, False, f"{len(close)} partitions within {CLOSE:.0%} of the best prediction "
                                       "compiled, and the choice made again with their real registers")
    return replace(again, interface=replace(again.interface, notes=again.interface.notes + (note,)))
