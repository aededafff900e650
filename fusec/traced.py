"""`@fusec.jit` on a Python function: a callable that traces the function into
a .fz pipeline once per argument signature (`fusec.frontend.trace`), compiles
it, and calls it like any pipeline (`out=`, `stream=`, `.cuda_source`,
`.report()`, `.unfused`).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import replace

from fusec.errors import Source
from fusec.frontend import check_source
from fusec.frontend.trace import Traced, TraceError, quick_key, signature_of, trace_source
from fusec.jit import JitOptions, JitPipeline, resolve_backend

# A pipeline's call options, unless the function has a parameter of that name.
CALL_OPTIONS = ("out", "stream")


class TracedFunction:
    """A Python function (`@fusec.jit`), traced and compiled once per argument signature.

    `pipelines` maps each signature traced so far to its pipeline;
    `.cuda_source`, `.report()` and `.unfused` are those of the latest one
    compiled (`compile_for(*args)` compiles one without running it).
    """

    def __init__(self, fn, options: JitOptions = JitOptions(), pipeline: str | None = None):
        if pipeline is not None:
            raise TypeError("pipeline= names a pipeline of a .fz file; it does not apply to a function")
        functools.update_wrapper(self, fn)  # __name__, __qualname__, __doc__, __module__, __wrapped__
        self.fn = fn
        self.options = replace(options, backend=resolve_backend(options.backend))  # "auto" warns here, once
        try:
            self.signature = inspect.signature(fn)
        except ValueError:
            raise TypeError(f"fusec.jit() traces a Python function; {fn!r} has no Python signature") from None
        self.call_options = tuple(o for o in CALL_OPTIONS if o not in self.signature.parameters)
        self.pipelines: dict[tuple, JitPipeline] = {}
        self._by_position: dict[tuple, JitPipeline] = {}
        self._latest: JitPipeline | None = None

    def __repr__(self) -> str:
        form = {"none": "unfused", "all": "all fused"}.get(self.options.fuse, "fused")
        count = len(self.pipelines)
        return (f"<fusec traced function {self.__qualname__} ({form}, {self.backend}): "
                f"{count} signature{'s' if count != 1 else ''} compiled>")

    def __call__(self, *args, **kwargs):
        options = {o: kwargs.pop(o) for o in self.call_options if o in kwargs} if kwargs else {}
        # A positional call binds by position: its pipeline is found by each argument's quick key.
        quick = tuple(map(quick_key, args)) if not kwargs else None
        pipeline = self._by_position.get(quick)
        if pipeline is not None:
            return pipeline(*args, **options)
        if any(isinstance(v, Traced) for v in (*args, *kwargs.values())):
            if options:
                raise TraceError(f"{self.__name__}() called inside a traced function takes no "
                                 f"{' or '.join(o + '=' for o in options)}")
            return self.fn(*args, **kwargs)  # called while tracing another function: traced inline
        bound = self._bind(args, kwargs)
        items = argument_items(bound)
        key = signature_key(items)
        pipeline = self.pipelines.get(key)
        if pipeline is None:
            pipeline = self._compile(bound, key)
        if quick is not None:
            self._by_position[quick] = pipeline
        return pipeline(*[value for _, value in items], **options)

    def compile_for(self, *args, **kwargs) -> JitPipeline:
        """The pipeline for arguments like these (traced and compiled if new), without running it."""
        bound = self._bind(args, self._without_options(kwargs))
        key = signature_key(argument_items(bound))
        found = self.pipelines.get(key)
        if found is not None:
            self._latest = found
            return found
        return self._compile(bound, key)

    def source(self, *args, **kwargs) -> str:
        """The .fz source traced for arguments like these."""
        bound = self._bind(args, self._without_options(kwargs))
        return self._trace(bound, signature_key(argument_items(bound)))

    @property
    def backend(self) -> str:
        return self.options.backend

    @property
    def cuda_source(self) -> str:
        return self.latest.cuda_source

    @property
    def unfused(self) -> JitPipeline:
        """The latest signature's pipeline, one kernel per traced operation."""
        return self.latest.unfused

    def report(self) -> list[dict]:
        return self.latest.report()

    @property
    def latest(self) -> JitPipeline:
        """The pipeline of the signature compiled last."""
        if self._latest is None:
            raise RuntimeError(f"{self.__name__} has not been compiled yet: call it once or use "
                               f".compile_for(*args)")
        return self._latest

    def _without_options(self, kwargs: dict) -> dict:
        return {k: v for k, v in kwargs.items() if k not in self.call_options}

    def _bind(self, args, kwargs) -> inspect.BoundArguments:
        try:
            return self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.__name__}(): {e}") from None

    def _trace(self, bound: inspect.BoundArguments, key: tuple) -> str:
        def run(values):
            traced = rebound(bound, values)
            return self.fn(*traced.args, **traced.kwargs)
        return trace_source(self.__name__, key, run)

    def _compile(self, bound: inspect.BoundArguments, key: tuple) -> JitPipeline:
        text = self._trace(bound, key)
        program = check_source(Source(f"<traced {self.__name__}>", text))
        pipeline = self.pipelines[key] = JitPipeline(program, program.pipelines[0].name, self.options)
        self._latest = pipeline
        return pipeline


def argument_items(bound: inspect.BoundArguments) -> list[tuple[str, object]]:
    """Each argument as (name, value), a *args tuple and a **kwargs dict spread out."""
    items = []
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            items += [(f"{name}_{i}", v) for i, v in enumerate(value)]
        elif kind is inspect.Parameter.VAR_KEYWORD:
            items += list(value.items())
        else:
            items.append((name, value))
    return items


def rebound(bound: inspect.BoundArguments, values: list) -> inspect.BoundArguments:
    """`bound` with its arguments replaced by `values`, in the order of `argument_items`."""
    given = iter(values)
    arguments = {}
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            arguments[name] = tuple(next(given) for _ in value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            arguments[name] = {k: next(given) for k in value}
        else:
            arguments[name] = next(given)
    return inspect.BoundArguments(bound.signature, arguments)


def signature_key(items: list[tuple[str, object]]) -> tuple:
    """What a traced program depends on: each argument's name and `signature_of`."""
    return tuple((name, signature_of(value)) for name, value in items)
