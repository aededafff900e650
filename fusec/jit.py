"""`fusec.jit`: pipelines as Python callables.

    f = fusec.jit("examples/scale_bias_relu.fz")     # a path, or .fz source text
    y = f(x, 1.5, -0.25)

A file with one pipeline gives that pipeline; with several, a module with one
attribute per pipeline (or the one named by `pipeline=`). Backends: "cuda"
(CuPy), "sim" (emitted CUDA C run on the CPU), "numpy" (the reference), or
"auto": cuda where a device is present, else numpy with one warning.
"""
from __future__ import annotations

import functools
import warnings

from fusec.compiler import Compiled, CompileOptions, compile_pipeline
from fusec.frontend import load
from fusec.ir.program import Program
from fusec.passes.fusion import DEFAULT_MAX_REGS

BACKENDS = ("auto", "cuda", "sim", "numpy")
_OPTIONS = ("fuse", "backend", "max_regs", "arch", "pipeline", "graph", "persistent")


def jit(x=None, /, **options):
    """Compile a .fz file, .fz source, or (as a decorator) a Python function."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"fusec.jit() got unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                        f"(options: {', '.join(_OPTIONS)})")
    if x is None:
        return lambda fn: jit(fn, **options)
    if callable(x):
        from fusec.traced import TracedFunction
        return TracedFunction(x, **options)
    if not isinstance(x, str):
        raise TypeError(f"fusec.jit() takes a path, .fz source text or a function, not {type(x).__name__}")
    program = load(x)
    name = options.pop("pipeline", None)
    names = [p.name for p in program.pipelines]
    if name is not None:
        if name not in names:
            raise ValueError(f"no pipeline named {name!r} (pipelines: {', '.join(names)})")
        return JitPipeline(program, name, **options)
    if len(names) == 1:
        return JitPipeline(program, names[0], **options)
    return JitModule(program, **options)


class JitModule:
    """A .fz file with several pipelines: one attribute each."""

    def __init__(self, program: Program, **options):
        self.program = program
        for p in program.pipelines:
            setattr(self, p.name, JitPipeline(program, p.name, **options))

    def __repr__(self) -> str:
        return f"<fusec module: {', '.join(p.name for p in self.program.pipelines)}>"


class JitPipeline:
    """One compiled pipeline. Call it with its parameters in declaration order
    (or by name); it returns its outputs and updates `inout` arrays in place."""

    def __init__(self, program: Program, name: str, *, fuse: bool = True, backend: str = "auto",
                 max_regs: int = DEFAULT_MAX_REGS, arch: str | None = None, graph: bool = False,
                 persistent: bool = False):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        self.program, self.name = program, name
        self.fuse, self.max_regs, self.arch, self.graph = bool(fuse), max_regs, arch, bool(graph)
        self.persistent = bool(persistent)
        self.backend = _resolve_backend(backend)
        if self.graph and self.backend != "cuda":
            raise ValueError(f"graph=True replays CUDA graphs: it needs the cuda backend, not {self.backend!r}")

    def __repr__(self) -> str:
        form = ("fused" if self.fuse else "unfused") + (", graph" if self.graph else "")
        return f"<fusec pipeline {self.name} ({form}, {self.backend})>"

    @functools.cached_property
    def compiled(self) -> Compiled:
        options = CompileOptions(fuse=self.fuse, max_regs=self.max_regs, persistent=self.persistent)
        return compile_pipeline(self.program, self.name, options)

    @functools.cached_property
    def unfused(self) -> "JitPipeline":
        """The same pipeline, one kernel per stage."""
        if not self.fuse:
            return self
        return JitPipeline(self.program, self.name, fuse=False, backend=self.backend, max_regs=self.max_regs,
                        arch=self.arch, graph=self.graph, persistent=self.persistent)

    @property
    def cuda_source(self) -> str:
        return self.compiled.cuda

    def report(self) -> list[dict]:
        from fusec.report import report
        rows = report(self.compiled)
        backend = getattr(self.__dict__.get("_runner"), "backend", None)
        if hasattr(backend, "attributes"):  # compiled: the kernels' real registers and local memory
            for row in rows:
                row.update(backend.attributes(row["name"]))
        return rows

    @functools.cached_property
    def _runner(self):
        if self.backend == "numpy":
            from fusec.reference import Interpreter
            return functools.partial(Interpreter(self.program).run, self.name)
        from fusec.runtime.executor import Executor
        if self.backend == "sim":
            from fusec.runtime.backends.sim import SimBackend
            return Executor(self.compiled, SimBackend(self.compiled))
        from fusec.runtime.backends.cuda import CudaBackend
        from fusec.runtime.cuda_graphs import GraphExecutor
        executor = GraphExecutor if self.graph else Executor
        return executor(self.compiled, CudaBackend(self.compiled, arch=self.arch))

    def __call__(self, *args, **kwargs):
        return self._runner(*args, **kwargs)

    def foreach(self, sets, *scalars, **named_scalars) -> list:
        """The pipeline over many sets of arrays in one launch (multi-tensor apply):
        `sets` holds one tuple of array arguments per set, in declaration order;
        the scalars are given once. Returns each set's outputs."""
        return self._foreach_runner.foreach(sets, *scalars, **named_scalars)

    @functools.cached_property
    def _foreach_runner(self):
        if self.backend == "numpy":
            return _ReferenceForeach(self)
        from fusec.runtime.foreach import MultiTensorExecutor
        compiled = compile_pipeline(self.program, self.name, CompileOptions(max_regs=self.max_regs, multi_tensor=True))
        if self.backend == "sim":
            from fusec.runtime.backends.sim import SimBackend
            return MultiTensorExecutor(compiled, SimBackend(compiled))
        from fusec.runtime.backends.cuda import CudaBackend
        return MultiTensorExecutor(compiled, CudaBackend(compiled, arch=self.arch))


class _ReferenceForeach:
    """foreach on the numpy backend: the reference, once per set."""

    def __init__(self, pipeline: JitPipeline):
        self.pipeline = pipeline

    def foreach(self, sets, *scalars, **named_scalars) -> list:
        from fusec.errors import ArgumentError
        if not isinstance(sets, (list, tuple)) or not sets:
            raise ArgumentError("foreach takes a non-empty list of argument sets, one tuple of arrays each")
        params = self.pipeline.program.pipeline(self.pipeline.name).params
        results = []
        for arrays in sets:
            given, positional = iter(arrays), iter(scalars)
            args = [next(given) if p.shape is not None else named_scalars.get(p.name) if p.name in named_scalars
                    else next(positional) for p in params]
            results.append(self.pipeline(*args))
        return results


def _resolve_backend(backend: str) -> str:
    if backend != "auto":
        return backend
    from fusec.runtime.backends.cuda import available
    if available():
        return "cuda"
    warnings.warn("fusec: no CUDA device (or no CuPy); backend='auto' runs the NumPy reference",
                  RuntimeWarning, stacklevel=4)
    return "numpy"
