"""The register-estimate corpus: generated .fz pipelines, compiled in every
form, batched through nvcc, each function's ptxas registers beside fusec's
estimate of it.

Families (`Case.family`): simple chains, wide (many inputs and outputs), deep
(long chains), multi-output, transcendental-heavy, many-live-value (values
used far from where they are computed), f16/bf16/f64 and integer pipelines,
broadcasts (2-D and 3-D with per-column and per-row operands), repeat loops,
and the examples and test programs. Each case is compiled (everything of one
iteration space fused, or fusec's own decision under a cap of 64 registers)
in the forms it has: the one-element and the vector variant (plus narrower
and wider vectors for some), the grid-stride form (`persistent=True`), the
multi-tensor form (where foreach can run it), and the loop kernel of a
`repeat` body. Each function is estimated for its `VariantShape`
(`regs.variant_shape` of its launch form).

Generation is deterministic (a fixed seed per case); the partitions fusec
decides follow its fusion pass. Nothing is cached between runs.
"""
from __future__ import annotations

import os
import random
import re
import statistics
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from helpers import PROGRAMS

from fusec.codegen.emit import emit_module
from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import Source
from fusec.frontend import check_source
from fusec.ir.kernels import Kernel
from fusec.ir.launch import (
    ColumnReduce,
    Elementwise,
    GridStride,
    KernelLaunch,
    MultiTensor,
    RegisterLoop,
    RowBlock,
)
from fusec.passes.regs import VariantShape, estimate_kernel, variant_shape

# Math functions that expand into libdevice code, and cheap ones that do not.
TRANSCENDENTAL = ("exp", "tanh", "sin", "cos", "log1p", "erf", "sqrt", "sigmoid", "atan", "expm1", "log", "cbrt",
                  "exp2", "rsqrt", "sinh", "cosh", "tan", "asin", "acos", "log2", "log10")
BINARY_MATH = ("pow", "atan2")
CHEAP = ("abs", "floor", "round", "trunc")


@dataclass(frozen=True)
class Case:
    family: str
    name: str                  # unique in the corpus
    source: str                # .fz text
    fuse_all: bool = False     # one kernel per iteration space (fuse="all"), else the default decision under a cap of 64
    widths: tuple[int, ...] = ()  # extra vector widths to emit beside the one the planner picked
    pipeline: str = ""         # the pipeline of `source` to compile (default: `name`)


@dataclass(frozen=True)
class Function:
    """One emitted function of the corpus and fusec's estimate of it."""

    family: str
    form: str                  # scalar, vector, grid-stride, loop, multi-tensor
    name: str                  # the __global__ function
    kernel: Kernel
    variant: VariantShape
    estimate: int


# ---------------------------------------------------------------- generators

def _params(names, dtype, shape="[n]") -> str:
    return ", ".join(f"{x}: {dtype}{shape}" for x in names)


def _outs(names, dtype, shape="[n]") -> str:
    return ", ".join(f"{y}: {dtype}{shape}" for y in names)


def _pipeline(name, params, outs, lines) -> str:
    head = f"pipeline {name}({params})" + (f" -> ({outs})" if outs else "")
    return head + " {\n" + "".join(f"    {line}\n" for line in lines) + "}\n"


def _term(rng: random.Random, operands: list[str], heavy: float) -> str:
    """A small expression of one or two operands: heavy is the chance of a math function."""
    a, b = rng.choice(operands), rng.choice(operands)
    roll = rng.random()
    if roll < heavy:
        fn = rng.choice(TRANSCENDENTAL)
        return f"{fn}({a} * {rng.uniform(0.1, 0.9):.3f})"
    if roll < heavy + 0.08:
        return f"{rng.choice(BINARY_MATH)}({a}, {b} + 1.5)"
    if roll < heavy + 0.2:
        return f"{rng.choice(('min', 'max'))}({a}, {b})"
    if roll < heavy + 0.28:
        return f"({a} > {b} ? {a} : {b} * 0.5)"
    return f"{a} {rng.choice('+-*')} {b} * {rng.uniform(0.1, 2.0):.3f}"


def _mix(rng: random.Random, operands: list[str], terms: int, heavy: float) -> str:
    return " + ".join(_term(rng, operands, heavy) for _ in range(terms))


def simple(i: int, dtype: str = "f32") -> str:
    rng = random.Random(100 + i)
    ins = [f"x{j}" for j in range(rng.randint(1, 3))]
    lines, last = [], ins[0]
    for j in range(rng.randint(2, 5)):
        op = rng.choice(["{} * s", "{} + b", "max({}, 0.0)", "{} * {} + b", "abs({}) - s"])
        lines.append(f"t{j} = {op.format(last, rng.choice(ins))};")
        last = f"t{j}"
    lines.append(f"y = {last} + {ins[-1]};")
    return _pipeline(f"simple{i}_{dtype}", f"{_params(ins, dtype)}, s: f32, b: f32", _outs(["y"], dtype), lines)


def wide(i: int, inputs: int, outputs: int, heavy: float, dtype: str = "f32", terms: int = 3) -> str:
    """Every output mixes several inputs (all of them when terms >= inputs)."""
    rng = random.Random(200 + i)
    ins = [f"x{j}" for j in range(inputs)]
    outs = [f"y{j}" for j in range(outputs)]
    lines = []
    for y in outs:
        chosen = rng.sample(ins, min(terms, inputs)) if terms < inputs else ins
        lines.append(f"{y} = {_mix(rng, chosen, max(terms, 2), heavy)};")
    return _pipeline(f"wide{i}_{dtype}", _params(ins, dtype), _outs(outs, dtype), lines)


def deep(i: int, length: int, inputs: int, heavy: float, dtype: str = "f32", reach: int = 2) -> str:
    """A chain of `length` statements, each reading the last and one of the `reach` before it."""
    rng = random.Random(300 + i)
    ins = [f"x{j}" for j in range(inputs)]
    values = list(ins)
    lines = []
    for j in range(length):
        a = values[-1]
        b = rng.choice(values[-reach - 1:-1] or ins) if len(values) > 1 else ins[0]
        lines.append(f"t{j} = {_term(rng, [a, b], heavy)};")
        values.append(f"t{j}")
    lines.append(f"y = {values[-1]} + {ins[0]};")
    return _pipeline(f"deep{i}_{dtype}", _params(ins, dtype), _outs(["y"], dtype), lines)


def multi_output(i: int, inputs: int, outputs: int, heavy: float, dtype: str = "f32") -> str:
    rng = random.Random(400 + i)
    ins = [f"x{j}" for j in range(inputs)]
    outs = [f"y{j}" for j in range(outputs)]
    lines = [f"{y} = {_term(rng, ins, heavy)};" for y in outs]
    return _pipeline(f"multi{i}_{dtype}", _params(ins, dtype), _outs(outs, dtype), lines)


def transcendental(i: int, length: int, inputs: int, dtype: str = "f32") -> str:
    """A chain of math functions, each feeding the next, mixed with an input now and then."""
    rng = random.Random(500 + i)
    ins = [f"x{j}" for j in range(inputs)]
    lines, last = [], ins[0]
    for j in range(length):
        fn = rng.choice(TRANSCENDENTAL + BINARY_MATH)
        arg = f"{last} * 0.7 + {rng.choice(ins)}" if rng.random() < 0.4 else last
        lines.append(f"t{j} = {fn}({arg}, {rng.choice(ins)});" if fn in BINARY_MATH else f"t{j} = {fn}({arg});")
        last = f"t{j}"
    lines.append(f"y = {last};")
    return _pipeline(f"trans{i}_{dtype}", _params(ins, dtype), _outs(["y"], dtype), lines)


def live(i: int, values: int, inputs: int, heavy: float, dtype: str = "f32") -> str:
    """`values` values computed from the inputs first and combined only at the end, in reverse."""
    rng = random.Random(600 + i)
    ins = [f"x{j}" for j in range(inputs)]
    lines = [f"a{j} = {_term(rng, ins, heavy)};" for j in range(values)]
    acc = f"a{values - 1}"
    for j in range(values - 2, -1, -1):
        acc = f"({acc}) * a{j} + x{j % inputs}" if j % 3 == 0 else f"max({acc}, a{j}) - a{j} * {0.25 + j / 64:.4f}"
        lines.append(f"c{j} = {acc};")
        acc = f"c{j}"
    lines.append(f"y = {acc};")
    return _pipeline(f"live{i}_{dtype}", _params(ins, dtype), _outs(["y"], dtype), lines)


def integer(i: int) -> str:
    kinds = [
        ("quant", "x: f32[n], inv: f32", "q: i8[n], clipped: bool[n]",
         ["r = round(x * inv);", "clipped = r > 127.0 || r < -127.0;", "q = i8(clamp(r, -127.0, 127.0));"]),
        ("ints", "a: i32[n], b: i32[n]", "q: i32[n], r: i32[n]",
         ["q = a / b + a * 3;", "r = a % b + max(a, b);"]),
        ("bytes", "a: u8[n], b: u8[n]", "y: u8[n]", ["y = a * 3 + b / 5 + min(a, b);"]),
        ("i8mix", "a: i8[n], b: i8[n], c: i8[n]", "y: i8[n], z: i8[n]",
         ["y = a * b + c;", "z = max(a, c) - b * 2;"]),
        ("i64", "a: i64[n], b: i64[n]", "y: i64[n]", ["y = a * b + a / 7 - b % 3;"]),
        ("dequant", "q: i8[n], scale: f32", "y: f32[n]", ["y = f32(q) * scale + 0.5;"]),
        ("f16quant", "x: f16[n], inv: f32", "q: i8[n]", ["q = i8(clamp(round(x * inv), -127.0, 127.0));"]),
        ("i32math", "a: i32[n], b: i32[n], c: i32[n]", "y: i32[n]", ["y = a ** 3 + abs(b) * c - min(a, c) / 3;"]),
    ]
    tag, params, outs, lines = kinds[i % len(kinds)]
    return _pipeline(f"int{i}_{tag}", params, outs, lines)


def broadcast(i: int, dtype: str = "f32", heavy: float = 0.2) -> str:
    """2-D or 3-D iteration spaces with per-column, per-row and per-plane operands."""
    rng = random.Random(800 + i)
    layouts = [
        ("[rows, cols]", ["[cols]"]),
        ("[rows, cols]", ["[cols]", "[rows, 1]"]),
        ("[rows, cols]", ["[rows, 1]"]),
        ("[a, b, c]", ["[a, 1, c]", "[c]", "[a, b, 1]"]),
        ("[a, b, c]", ["[b, 1]"]),
        ("[rows, cols]", ["[cols]", "[cols]", "[rows, 1]"]),
    ]
    full, small = layouts[i % len(layouts)]
    inputs = rng.randint(1, 3)
    params = [f"x{j}: {dtype}{full}" for j in range(inputs)] + [f"b{j}: {dtype}{s}" for j, s in enumerate(small)]
    operands = [f"x{j}" for j in range(inputs)] + [f"b{j}" for j in range(len(small))]
    outs = [f"y{j}" for j in range(rng.randint(1, 2))]
    lines = [f"{y} = {_mix(rng, operands, rng.randint(2, 4), heavy)} + x0;" for y in outs]
    return _pipeline(f"bcast{i}_{dtype}", ", ".join(params), _outs(outs, dtype, full), lines)


def loop(i: int, carried: int, depth: int, heavy: float, dtype: str = "f32", count: str = "k",
         broadcast: bool = False) -> str:
    """A repeat body over one iteration space: `carried` arrays updated in
    registers `count` times, reading coefficient arrays (per column and per
    row, with `broadcast`)."""
    rng = random.Random(900 + i)
    states = [f"s{j}" for j in range(carried)]
    full, small = ("[rows, cols]", ["[cols]", "[rows, 1]"]) if broadcast else ("[n]", ["[n]", "[n]"])
    coeffs = [f"c{j}" for j in range(2 if broadcast else rng.randint(0, 2))]
    params = [f"inout {s}: {dtype}{full}" for s in states] + [f"{c}: {dtype}{small[j]}" for j, c in enumerate(coeffs)]
    params += ["dt: f32"] + (["k: i32"] if count == "k" else [])
    body = []
    for s in states:
        operands = states + coeffs
        expr = " + ".join(_term(rng, operands, heavy) for _ in range(depth))
        body.append(f"        {s} = {s} + dt * ({expr});")
    text = f"pipeline loop{i}_{dtype}({', '.join(params)}) {{\n    repeat {count} {{\n" + "\n".join(body)
    return text + "\n    }\n}\n"


def cases() -> list[Case]:
    out: list[Case] = []

    def add(family, source, name=None, **kw):
        name = name or re.search(r"pipeline (\w+)\(", source).group(1)
        out.append(Case(family, name, source, **kw))

    for i in range(8):
        add("simple", simple(i), widths=(2, 8) if i % 2 == 0 else ())
    for i, (n_in, n_out, heavy, budget) in enumerate([
            (4, 1, 0.0, 64), (6, 2, 0.1, 64), (8, 4, 0.1, 64), (8, 8, 0.0, 255), (12, 4, 0.3, 255),
            (12, 12, 0.0, 64), (12, 12, 0.3, 255), (16, 4, 0.0, 255), (16, 8, 0.2, 64), (16, 16, 0.1, 255),
            (24, 4, 0.0, 255), (24, 8, 0.2, 64), (6, 6, 0.5, 255), (10, 2, 0.0, 255), (20, 10, 0.1, 255)]):
        add("wide", wide(i, n_in, n_out, heavy, terms=n_in if i % 3 == 0 else 4), fuse_all=budget == 255,
            widths=(2,) if i % 4 == 1 else ())
    for i, (length, n_in, heavy, reach) in enumerate([
            (8, 1, 0.0, 1), (16, 1, 0.1, 2), (24, 2, 0.0, 4), (32, 1, 0.05, 2), (48, 2, 0.0, 3),
            (12, 3, 0.3, 6), (40, 1, 0.1, 8), (20, 2, 0.0, 12)]):
        add("deep", deep(i, length, n_in, heavy, reach=reach), fuse_all=True, widths=(2, 8) if i % 3 == 0 else ())
    for i, (n_in, n_out, heavy) in enumerate([(1, 2, 0.0), (2, 4, 0.1), (3, 6, 0.0), (1, 8, 0.2), (2, 3, 0.5),
                                              (4, 8, 0.0)]):
        add("multi-output", multi_output(i, n_in, n_out, heavy), fuse_all=True, widths=(2,) if i % 2 else ())
    for i, (length, n_in) in enumerate([(2, 1), (4, 1), (6, 2), (8, 1), (10, 2), (12, 1), (3, 3), (16, 2),
                                        (5, 1), (7, 2)]):
        add("transcendental", transcendental(i, length, n_in), fuse_all=True, widths=(2,) if i % 3 == 0 else ())
    for i, (values, n_in, heavy) in enumerate([(4, 1, 0.0), (8, 2, 0.1), (12, 1, 0.0), (16, 3, 0.1),
                                               (24, 2, 0.0), (6, 2, 0.5), (20, 4, 0.05), (32, 2, 0.0)]):
        add("many-live", live(i, values, n_in, heavy), fuse_all=True)
    for dtype in ("f16", "bf16", "f64"):
        offset = {"f16": 0, "bf16": 30, "f64": 60}[dtype]
        add(dtype, simple(offset, dtype))
        add(dtype, simple(offset + 1, dtype), widths=(2, 4) if dtype != "f64" else (1,))
        add(dtype, wide(offset, 8, 4, 0.1, dtype, terms=4), fuse_all=True)
        add(dtype, wide(offset + 1, 12, 6, 0.0, dtype, terms=12), fuse_all=True)
        add(dtype, wide(offset + 2, 6, 2, 0.3, dtype), fuse_all=True)
        add(dtype, deep(offset, 16, 1, 0.1, dtype), fuse_all=True)
        add(dtype, deep(offset + 1, 32, 2, 0.0, dtype, reach=4), fuse_all=True)
        add(dtype, transcendental(offset, 6, 1, dtype), fuse_all=True)
        add(dtype, transcendental(offset + 1, 3, 2, dtype), fuse_all=True)
        add(dtype, multi_output(offset, 2, 4, 0.1, dtype), fuse_all=True)
        add(dtype, live(offset, 12, 2, 0.1, dtype), fuse_all=True)
        add(dtype, broadcast(offset, dtype))
        add(dtype, broadcast(offset + 1, dtype))
        add(dtype, loop(offset, 2, 2, 0.0, dtype))
    for i in range(8):
        add("integer", integer(i))
    for i in range(12):
        add("broadcast", broadcast(i, heavy=0.3 if i >= 6 else 0.1), fuse_all=True)
    for i, (carried, depth, heavy, count) in enumerate([
            (1, 1, 0.0, "100"), (2, 2, 0.0, "k"), (3, 2, 0.1, "k"), (4, 3, 0.0, "50"), (6, 2, 0.0, "k"),
            (2, 4, 0.3, "k"), (8, 2, 0.0, "k"), (5, 4, 0.1, "20"), (3, 6, 0.0, "k"), (1, 3, 0.5, "k")]):
        add("loop", loop(i, carried, depth, heavy, count=count), fuse_all=True)
    add("loop", loop(10, 3, 3, 0.1, count="k", broadcast=True), fuse_all=True)
    add("loop", loop(11, 12, 2, 0.0, count="k"), fuse_all=True)
    add("loop", loop(12, 4, 3, 0.2, "bf16", count="k"), fuse_all=True)
    add("loop", loop(13, 3, 3, 0.2, "f64", count="10"), fuse_all=True)
    for path in PROGRAMS:
        for name in re.findall(r"^pipeline (\w+)\(", path.read_text(), re.M):
            add("example", path.read_text(), pipeline=name, name=f"ex_{path.stem}_{name}")
    return out


# ---------------------------------------------------------------- compiling

def compile_case(case: Case) -> list[tuple[str, list[Function]]]:
    """(CUDA module, its functions) for each form of the case. Each form's
    pipeline is renamed, so that the functions of all modules have distinct names."""
    modules = []
    for form in ("fused", "persistent", "multi-tensor"):
        name = f"{case.name}_{form[0]}"
        source = case.source.replace(f"pipeline {case.pipeline or case.name}(", f"pipeline {name}(")
        program = check_source(Source(f"{name}.fz", source))
        options = CompileOptions(fuse="all" if case.fuse_all else "auto", max_regs=None if case.fuse_all else 64,
                                 persistent=form == "persistent", multi_tensor=form == "multi-tensor")
        try:
            compiled = compile_pipeline(program, name, options)
        except ValueError:  # foreach cannot run this pipeline
            continue
        interface = compiled.interface
        if form == "fused":
            # Every width asked for, and the widest vector where the cost model chose a
            # narrower one: the corpus holds the same functions whatever the model decides.
            interface = replace(interface, kernels=tuple(_with_widths(k, case.widths + (_widest(k),))
                                                         for k in interface.kernels))
            cuda = emit_module(interface, program.source.name)
        else:
            cuda = compiled.cuda
        # A loop kernel is the same in the persistent form: counted once.
        launches = [k for k in interface.kernels if form != "persistent" or not isinstance(k.form, RegisterLoop)]
        modules.append((cuda, [f for k in launches for f in functions(case.family, k)]))
    return modules


def _widest(launch: KernelLaunch) -> int:
    """The vector width fusec's rule gives a kernel (1: none)."""
    from fusec.passes.variants import kernel_registers, vector_width
    return vector_width(launch.kernel, kernel_registers(launch.kernel))


def _with_widths(launch: KernelLaunch, widths: tuple[int, ...]) -> KernelLaunch:
    """An elementwise kernel with vector variants of other widths beside its own."""
    if not isinstance(launch.form, Elementwise):
        return launch
    template = launch.variants[0]
    have = {v.elements_per_thread for v in launch.variants}
    extra = tuple(replace(template, name=f"{launch.kernel.name}_w{w}", elements_per_thread=w)
                  for w in dict.fromkeys(widths) if w not in have and w > 1)
    return replace(launch, variants=launch.variants + extra)


FORM_NAMES = {Elementwise: "vector", GridStride: "grid-stride", RegisterLoop: "loop", MultiTensor: "multi-tensor",
              RowBlock: "row", ColumnReduce: "column"}


def functions(family: str, launch: KernelLaunch) -> list[Function]:
    """The emitted functions of one kernel, each with the variant it is and its estimate."""
    out = []
    for variant in launch.variants:
        shape = variant_shape(launch.form, variant.elements_per_thread)
        if getattr(variant.grid, "rows_per_block", 1) > 1:  # a row kernel's warp-per-row variant
            shape = replace(shape, warp=True)
        form = "scalar" if shape == VariantShape() else FORM_NAMES[type(launch.form)] + ("-warp" if shape.warp else "")
        # a row held in registers: the plan's own estimate (its registers depend on the row's passes)
        estimate = variant.est_regs if variant.row_resident else estimate_kernel(launch.kernel, shape)
        out.append(Function(family, form, variant.name, launch.kernel, shape, estimate))
    return out


# ---------------------------------------------------------------- ptxas

@dataclass(frozen=True)
class Usage:
    registers: int
    spill_bytes: int  # stores and loads


def batch_source(modules: list[str]) -> str:
    """Several modules as one translation unit, as `fusec compile` writes a file of
    several pipelines: the includes once at the top, then each module's body (its
    prelude helpers are guarded; the kernels are extern "C" and named apart)."""
    includes, bodies = set(), []
    for cuda in modules:
        lines = cuda.splitlines()
        includes.update(line for line in lines if line.startswith("#include"))
        bodies.append("\n".join(line for line in lines if not line.startswith("#include")))
    return "\n".join(sorted(includes)) + "\n" + "\n".join(bodies)


def ptxas_usage(cuda: str, workdir: str, tag: str = "m") -> dict[str, Usage]:
    """function name -> Usage, from `nvcc -cubin -arch=sm_90 -O3 -Xptxas -v`."""
    src = os.path.join(workdir, f"{tag}.cu")
    with open(src, "w") as f:
        f.write(cuda)
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v",
                           "-o", os.path.join(workdir, f"{tag}.cubin"), src], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src}:\n{proc.stderr[-4000:]}")
    usage, current, spills = {}, None, 0
    for line in proc.stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            current = m.group(1)
        if m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
            spills = int(m.group(1)) + int(m.group(2))
        if m := re.search(r"Used (\d+) registers", line):
            usage[current] = Usage(int(m.group(1)), spills)
    return usage


def measure(modules: list[str], jobs: int | None = None) -> dict[str, Usage]:
    """ptxas usage of every function of `modules`, in `jobs` translation units
    compiled in parallel (one nvcc process each), of about equal size."""
    jobs = jobs or max(2, os.cpu_count() or 2)
    order = sorted(range(len(modules)), key=lambda n: -len(modules[n]))
    batches: list[list[str]] = [[] for _ in range(jobs)]
    sizes = [0] * jobs
    for n in order:  # the largest module first, into the smallest batch
        b = sizes.index(min(sizes))
        batches[b].append(modules[n])
        sizes[b] += len(modules[n])
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(jobs) as pool:
        results = pool.map(lambda nb: ptxas_usage(batch_source(nb[1]), workdir, f"batch{nb[0]}"),
                           enumerate(b for b in batches if b))
        usage: dict[str, Usage] = {}
        for part in results:
            usage.update(part)
    return usage


# ---------------------------------------------------------------- figures

def within(estimate: int, real: int) -> bool:
    """The calibration's bound: within max(4, 20 %) of ptxas."""
    return abs(estimate - real) <= max(4, 0.2 * real)


def far_under(estimate: int, real: int) -> bool:
    """More than 25 % under ptxas where ptxas uses 48 registers or more (near the budget)."""
    return real >= 48 and estimate < 0.75 * real


def summary(rows: list[tuple[str, int, int]]) -> str:
    """A markdown row per group: (group, estimate, real) -> count, median
    estimate/real, worst under and worst over (%), share within the bound."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for group, estimate, real in rows:
        groups.setdefault(group, []).append((estimate, real))
        groups.setdefault("all", []).append((estimate, real))
    lines = ["| group | functions | median est/real | worst under | worst over | within max(4, 20 %) |",
             "|---|---:|---:|---:|---:|---:|"]
    for group, pairs in sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        ratios = sorted(e / r for e, r in pairs)
        median = statistics.median(ratios)
        share = sum(within(e, r) for e, r in pairs) / len(pairs)
        lines.append(f"| {group} | {len(pairs)} | {median:.2f} | {100 * (ratios[0] - 1):+.0f} % | "
                     f"{100 * (ratios[-1] - 1):+.0f} % | {100 * share:.1f} % |")
    return "\n".join(lines)
