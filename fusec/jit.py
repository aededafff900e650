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
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from fusec.compiler import Compiled, CompileOptions, compile_pipeline
from fusec.frontend import load
from fusec.ir.launch import call_signature, in_memory_scalars
from fusec.ir.program import Program
from fusec.passes import guard
from fusec.passes.fusion import FUSE_MODES
from fusec.runtime.cuda_graphs import GraphExecutor
from fusec.runtime.executor import MISS, Missed
from fusec.target import DEFAULT_ARCH, check_arch, check_max_regs

BACKENDS = ("auto", "cuda", "sim", "numpy")


@dataclass(frozen=True, slots=True)
class JitOptions:
    """`fusec.jit`'s options, checked as the command line checks its own."""

    fuse: bool | str = "auto"   # "auto", "all", "none"; True and False mean "auto" and "none"
    backend: str = "auto"
    max_regs: int | None = None
    arch: str | None = None
    graph: bool = False
    persistent: bool = False
    fast_math: bool = False
    tune: bool = False
    # Float scalars the kernels read from device memory, each call's value a 0-d float64 array
    # on the call's device (names, or True: every float scalar); () passes every scalar by value.
    scalars_in_memory: bool | tuple[str, ...] = ()

    def __post_init__(self):
        chosen = self.scalars_in_memory
        if isinstance(chosen, str):
            chosen = (chosen,)
        if isinstance(chosen, list):
            chosen = tuple(chosen)
        if not (isinstance(chosen, bool) or isinstance(chosen, tuple) and all(isinstance(n, str) for n in chosen)):
            raise TypeError(f"fusec.jit(): scalars_in_memory= takes True, False or the names of float scalar "
                            f"parameters; got {self.scalars_in_memory!r}")
        object.__setattr__(self, "scalars_in_memory", chosen)
        if isinstance(self.fuse, bool):
            object.__setattr__(self, "fuse", "auto" if self.fuse else "none")
        if self.fuse not in FUSE_MODES:
            raise (ValueError if isinstance(self.fuse, str) else TypeError)(f"fusec.jit(): fuse= takes {', '.join(map(repr, FUSE_MODES))}, True or False; "
                             f"got {self.fuse!r}")
        for name in ("graph", "persistent", "fast_math", "tune"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"fusec.jit(): {name}= takes True or False, got {getattr(self, name)!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"fusec.jit(): backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
        for name, check in (("max_regs", check_max_regs), ("arch", check_arch)):
            if getattr(self, name) is not None:
                try:
                    check(getattr(self, name))
                except ValueError as exc:
                    raise ValueError(f"fusec.jit(): {name}= {exc}") from None


def jit(source=None, /, *, fuse: bool | str = "auto", backend: str = "auto", max_regs: int | None = None,
        arch: str | None = None, pipeline: str | None = None, graph: bool = False, persistent: bool = False,
        fast_math: bool = False, tune: bool = False, scalars_in_memory: bool | tuple[str, ...] = ()):
    """Compile a .fz file (a path), .fz source text, or (as a decorator) a Python function.

    fuse: "auto" (the cost model decides; True), "all" (every stage that may
    fuse, fused), "none" (one kernel per statement; False). backend: "auto",
    "cuda", "sim" or "numpy". max_regs: the fusion's register budget (default:
    half occupancy on `arch`). arch: the target, e.g. "sm_90" (default: the
    device's, or sm_90 without one). pipeline: which pipeline of a file with
    several. graph: replay CUDA graphs. persistent: grid-stride kernels.
    fast_math: f32 functions as their hardware approximations, denormals
    flushed (README, "Fast math"). tune: at the first call, time the cost
    model's best few partitions on the device and keep the fastest (cached per
    pipeline, shape class and GPU; needs the cuda backend). scalars_in_memory: float
    scalars (names, or True for all) that the kernels read from device memory: each
    call passes a 0-d float64 array on its device for them (a torch tensor made in a
    compiled graph, so a new value needs no recompilation and no synchronization);
    the numpy backend (the reference) takes them by value as ever.
    """
    options = JitOptions(fuse, backend, max_regs, arch, graph, persistent, fast_math, tune, scalars_in_memory)
    if source is None:
        return lambda fn: _jit(fn, options, pipeline)
    return _jit(source, options, pipeline)


def _jit(source, options: JitOptions, pipeline: str | None):
    if callable(source):
        if options.scalars_in_memory:
            raise TypeError(f"fusec.jit(): scalars_in_memory= is for .fz pipelines, not a traced Python function "
                            f"({getattr(source, '__name__', type(source).__name__)}): its float scalars are "
                            f"Python floats, passed by value")
        from fusec.traced import TracedFunction
        return TracedFunction(source, options, pipeline)
    if not isinstance(source, str):
        raise TypeError(f"fusec.jit() takes a path, .fz source text or a function, not {type(source).__name__}")
    program = load(source)
    names = [p.name for p in program.pipelines]
    if pipeline is not None:
        if pipeline not in names:
            raise ValueError(f"no pipeline named {pipeline!r} (pipelines: {', '.join(names)})")
        return JitPipeline(program, pipeline, options)
    if len(names) == 1:
        return JitPipeline(program, names[0], options)
    return JitModule(program, options)


class JitModule:
    """A .fz file with several pipelines: one attribute each."""

    def __init__(self, program: Program, options: JitOptions = JitOptions()):
        self.program = program
        chosen = options.scalars_in_memory
        names = isinstance(chosen, tuple) and bool(chosen)
        if names:  # each a parameter of some pipeline, read where it is one
            params = {p.name for pipeline in program.pipelines for p in pipeline.params}
            for name in chosen:
                if name not in params:
                    raise ValueError(f"scalars_in_memory: no pipeline has a parameter '{name}' (pipelines: "
                                     f"{', '.join(p.name for p in program.pipelines)})")
        for p in program.pipelines:
            mine = options if not names else replace(
                options, scalars_in_memory=tuple(n for n in chosen if any(q.name == n for q in p.params)))
            setattr(self, p.name, JitPipeline(program, p.name, mine))

    def __repr__(self) -> str:
        return f"<fusec module: {', '.join(p.name for p in self.program.pipelines)}>"


class JitPipeline:
    """One compiled pipeline. Call it with its parameters in declaration order
    (or by name); it returns its outputs and updates `inout` arrays in place."""

    def __init__(self, program: Program, name: str, options: JitOptions = JitOptions()):
        self.program, self.name, self.options = program, name, options
        if options.scalars_in_memory:
            # The names checked now, on every backend (the numpy backend takes them by value, but a
            # typo is one there too), before anything is compiled: ValueError naming the parameter.
            in_memory = in_memory_scalars(call_signature(program.pipeline(name)), options.scalars_in_memory)
            if in_memory and options.graph:
                raise ValueError(f"fusec.jit(): graph=True with scalars_in_memory= is not supported yet (a graph "
                                 f"holds its scalars' values; read from memory: {', '.join(in_memory)})")
        self.backend = resolve_backend(options.backend)
        if options.graph and self.backend != "cuda":
            raise ValueError(f"graph=True replays CUDA graphs: it needs the cuda backend, not {self.backend!r}")
        if options.tune and self.backend != "cuda":
            raise ValueError(f"tune=True times candidates on the GPU: it needs the cuda backend, not {self.backend!r}")
        # The runner whose recorded replays a plain call tries first (cuda: the runner of the
        # device last called on; its `replay` and `replay_out`), and those replays
        self._replaying, self._replay, self._replay_out = None, _no_replay, _no_replay

    def __repr__(self) -> str:
        form = {"none": "unfused", "all": "all fused"}.get(self.options.fuse, "fused") + \
            (", graph" if self.options.graph else "")
        return f"<fusec pipeline {self.name} ({form}, {self.backend})>"

    @functools.cached_property
    def arch(self) -> str:
        """The target: as given, else the device's (cuda backend), else the default."""
        if self.options.arch is not None:
            return self.options.arch
        if self.backend == "cuda":
            from fusec.runtime.backends.cuda import device_arch
            return device_arch()
        return DEFAULT_ARCH

    def compile_options(self, **changes) -> CompileOptions:
        """The options this pipeline compiles with; a tuned partition stays chosen (the
        guard's re-plan after compiling changes variants within it, not the partition)."""
        o = self.options
        return CompileOptions(**{"fuse": o.fuse, "max_regs": o.max_regs, "arch": self.arch,
                                 "persistent": o.persistent, "fast_math": o.fast_math,
                                 "scalars_in_memory": o.scalars_in_memory,
                                 "partition": self.__dict__.get("_tuned_partition"), **changes})

    @functools.cached_property
    def compiled(self) -> Compiled:
        """The compiled pipeline, planned with what earlier compiles for this target
        observed of real registers (passes.guard), and on the cuda backend with
        the real registers of the close candidates (guard.refine)."""
        if self.backend != "cuda":
            return compile_pipeline(self.program, self.name, self.compile_options())
        from fusec.runtime.backends.cuda import ptxas_observations
        observed = guard.remembered(self.program, self.name, self.arch)
        options = self.compile_options(observed=observed)
        compiled = compile_pipeline(self.program, self.name, options)
        # Close candidates compiled, and the choice made again on their real registers.
        return guard.refine(compiled, options,
                            lambda **changes: compile_pipeline(self.program, self.name, replace(options, **changes)),
                            lambda candidate: ptxas_observations(candidate, self.arch, self.options.fast_math))

    @functools.cached_property
    def unfused(self) -> "JitPipeline":
        """The same pipeline, one kernel per stage."""
        if self.options.fuse == "none":
            return self
        return JitPipeline(self.program, self.name, replace(self.options, fuse="none"))

    @property
    def cuda_source(self) -> str:
        return self.compiled.cuda

    def report(self) -> list[dict]:
        from fusec.report import report
        runners = self.__dict__.get("_runners") or {}
        backend = getattr(next(iter(runners.values()), None), "backend", None)
        return report(self.compiled.interface, backend)

    @property
    def _runner(self):
        """The runner for the current device (cuda), else the backend's one runner."""
        if self.backend != "cuda":
            return self._host_runner
        from fusec.runtime.backends.cuda import current_device
        return self._runner_on(current_device())

    @functools.cached_property
    def _host_runner(self):
        if self.backend == "numpy":
            from fusec.reference import Interpreter
            return functools.partial(Interpreter(self.program).run, self.name)
        from fusec.runtime.backends.sim import SimBackend
        from fusec.runtime.executor import Executor
        interface = self.compiled.interface
        return Executor(interface, SimBackend(self.compiled.cuda, interface))

    @functools.cached_property
    def _runners(self) -> dict:
        """device -> its runner: the module loaded there, its calls recorded there (cuda)."""
        return {}

    def _runner_on(self, device: int):
        runner = self._runners.get(device)
        if runner is None:
            from fusec.runtime.backends.cuda import on_device
            with on_device(device):
                runner = self._runners[device] = self._cuda_runner()
        return runner

    def _cuda_runner(self):
        """An executor on the current device (its module loaded there). A device of
        another architecture than the first one's (a host of mixed GPUs), where no
        arch was given, gets the pipeline compiled for its own."""
        from fusec.runtime.backends.cuda import CudaBackend
        from fusec.runtime.cuda_graphs import GraphExecutor
        from fusec.runtime.executor import Executor
        executor = GraphExecutor if self.options.graph else Executor
        arch, compiled = self._for_current_device(lambda: self.compiled)
        backend = CudaBackend(compiled.cuda, compiled.interface, arch=arch)
        # The guard: where ptxas's real registers break the plan, plan again with them.
        checked = guard.replan(compiled, guard.observe(compiled, backend.attributes),
                               lambda observed: compile_pipeline(self.program, self.name,
                                                                 self.compile_options(arch=arch, observed=observed)))
        if checked is not compiled:
            if arch == self.arch:
                self.__dict__["compiled"] = checked
            backend = CudaBackend(checked.cuda, checked.interface, arch=arch)
        return executor(checked.interface, backend)

    def _for_current_device(self, first: Callable[[], Compiled], **changes) -> tuple[str, Compiled]:
        """The current device's arch, and the pipeline for it: `first()`, compiled for the
        first device's arch, or on a device of another architecture (a host of mixed GPUs,
        no arch given) the pipeline compiled for that one."""
        from fusec.runtime.backends.cuda import device_arch
        arch = self.options.arch or device_arch()
        if arch == self.arch:
            return arch, first()
        return arch, compile_pipeline(self.program, self.name, self.compile_options(arch=arch, **changes))

    def _on_device(self, device: int, fn: Callable, *args, **kwargs):
        """fn(*args, **kwargs) with `device` current (entered only where it is not)."""
        _, current_device, on_device = self._devices
        if device == current_device():
            return fn(*args, **kwargs)
        with on_device(device):
            return fn(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        # The common call, replayed where it can be (a small call's time is its host time): by
        # the generated replay of the runner last called, which checks that the current device
        # and every array's are its own.
        if not kwargs:
            missed = self._replay(args)
        elif len(kwargs) == 1 and "out" in kwargs:
            missed = self._replay_out(args, kwargs["out"])
        else:
            return self._checked(args, kwargs, None)
        return missed if type(missed) is not Missed else self._checked(args, kwargs, missed)

    def _checked(self, args: tuple, kwargs: dict, missed: Missed | None):
        """A call the replay did not run (`missed`: its answer, with the call's key where
        it worked that out), or one with other options."""
        if self.backend != "cuda":
            return self._host_runner(*args, **kwargs)
        # Arrays on device k run on device k: the first array's device decides.
        call_device, current_device, _ = self._devices
        device = call_device(args, kwargs)
        if device == current_device():
            runner = self._runners.get(device)
            if runner is not None and (not self.options.tune or "_tuned" in self.__dict__):
                if missed is not None and runner is self._replaying:  # its replay ran nothing: the key it worked out
                    result = runner.call_missed(args, kwargs, missed.key)
                else:
                    result = runner(*args, **kwargs)
                self._may_replay(runner)
                return result
        return self._on_device(device, self._call_on, device, args, kwargs)

    def _call_on(self, device: int, args: tuple, kwargs: dict):
        """The call on `device`, which is current (tuned there first with tune=True)."""
        if self.options.tune and "_tuned" not in self.__dict__:
            self._tune_for(args, kwargs)
        runner = self._runners.get(device) or self._runner_on(device)
        result = runner(*args, **kwargs)
        self._may_replay(runner)
        return result

    def _may_replay(self, runner) -> None:
        """Plain calls try `runner`'s recorded replays first from now on (not a graph
        runner's: its replay is its own); installed after a call of it, which may have
        generated them again."""
        if not isinstance(runner, GraphExecutor):
            self._replaying, self._replay, self._replay_out = runner, runner.replay, runner.replay_out

    @functools.cached_property
    def _devices(self):
        """The cuda backend's device functions, imported once (not at every call)."""
        from fusec.runtime.backends.cuda import call_device, current_device, on_device
        return call_device, current_device, on_device

    def _tune_for(self, args: tuple, kwargs: dict) -> None:
        """Tuning at the first call (its arguments give the shape class): the
        cached winner for this GPU, else the candidates timed on copies of the
        arguments; the pipeline is compiled again with the winner."""
        from fusec.runtime import tuning
        from fusec.runtime.backends.cuda import device_name
        call = self._runner.binder.bind(args, dict(kwargs))
        shapes, device, options = tuning.shape_class(call.dims), device_name(), self.compile_options()
        winner = tuning.cached_partition(self.program, self.name, shapes, device, options)
        if winner is None:
            timings = tuning.tune(self.compiled, options, tuning.device_measure(call.values, self.arch))
            tuning.remember(self.program, self.name, shapes, device, options, timings)
            self.timings = timings
            winner = next((t.groups for t in timings if t.measured_us is not None), None)
        if winner is not None:
            self.__dict__["_tuned_partition"] = winner
            if winner != self.compiled.partition.groups:
                self.__dict__["compiled"] = compile_pipeline(self.program, self.name, self.compile_options())
                self.__dict__.pop("_runners", None)
                self._replaying, self._replay, self._replay_out = None, _no_replay, _no_replay
        self.__dict__["_tuned"] = True

    def foreach(self, sets, *scalars, **named_scalars) -> list:
        """The pipeline over many sets of arrays in one launch (multi-tensor apply):
        `sets` holds one tuple of array arguments per set, in declaration order;
        the scalars are given once. Returns each set's outputs."""
        if self.backend != "cuda":
            return self._foreach_runners[None].foreach(sets, *scalars, **named_scalars)
        first = next((s for s in sets if isinstance(s, (tuple, list)) and s), ())
        device = self._devices[0](tuple(first), {})
        runner = self._foreach_runners.get(device) or self._foreach_runner_on(device)
        return self._on_device(device, runner.foreach, sets, *scalars, **named_scalars)

    @functools.cached_property
    def _foreach_compiled(self) -> Compiled:
        from fusec.passes.plan import PlanError
        try:
            return compile_pipeline(self.program, self.name, self.compile_options(multi_tensor=True, partition=None))
        except PlanError as exc:
            raise ValueError(str(exc)) from None

    @functools.cached_property
    def _foreach_runners(self) -> dict:
        """device -> its foreach runner (None: the host backends' one)."""
        compiled = self._foreach_compiled
        if self.backend == "numpy":
            from fusec.reference import Interpreter
            return {None: SimpleNamespace(foreach=functools.partial(Interpreter(self.program).foreach, self.name))}
        if self.backend == "sim":
            from fusec.runtime.backends.sim import SimBackend
            from fusec.runtime.foreach import MultiTensorExecutor
            return {None: MultiTensorExecutor(compiled.interface, SimBackend(compiled.cuda, compiled.interface))}
        return {}

    @property
    def _foreach_runner(self):
        """The foreach runner for the current device (cuda), else the backend's one."""
        if self.backend != "cuda":
            return self._foreach_runners[None]
        from fusec.runtime.backends.cuda import current_device
        device = current_device()
        return self._foreach_runners.get(device) or self._foreach_runner_on(device)

    def _foreach_runner_on(self, device: int):
        from fusec.runtime.backends.cuda import CudaBackend, on_device
        from fusec.runtime.foreach import MultiTensorExecutor
        with on_device(device):
            arch, compiled = self._for_current_device(lambda: self._foreach_compiled, multi_tensor=True,
                                                      partition=None)
            runner = MultiTensorExecutor(compiled.interface, CudaBackend(compiled.cuda, compiled.interface, arch=arch))
        self._foreach_runners[device] = runner
        return runner


def _no_replay(args: tuple, out=None) -> Missed:
    """The replay of a pipeline no runner of which has recorded calls yet: none."""
    return MISS


def resolve_backend(backend: str) -> str:
    from fusec.runtime.backends.cuda import available
    if backend == "cuda" and not available():
        raise RuntimeError("backend='cuda' needs CuPy, NVIDIA's cuda-bindings and a CUDA device, and one was not found "
                           "(pip install 'fusec[cuda12]' or '[cuda13]'; or use backend='sim' or 'numpy')")
    if backend != "auto":
        return backend
    if available():
        return "cuda"
    warnings.warn("fusec: no CUDA device (or no CuPy); backend='auto' runs the NumPy reference",
                  RuntimeWarning, stacklevel=_caller_level())
    return "numpy"


def _caller_level() -> int:
    """The stacklevel of the first frame outside fusec: where a warning belongs."""
    package = Path(__file__).parent
    frame, level = sys._getframe(1), 1
    while frame is not None and Path(frame.f_code.co_filename).is_relative_to(package):
        frame, level = frame.f_back, level + 1
    return level
