"""`fusec.torch_op`: a pipeline as a torch.library custom op.

    bias_gelu = fusec.torch_op("examples/bias_gelu.fz", name="mylib::bias_gelu")
    y = bias_gelu(x, b)          # eager, or inside torch.compile(model, fullgraph=True)

The op's schema comes from the pipeline's call signature: arrays are Tensors
(`inout` arrays are mutated arguments), integer scalars `SymInt`, bools
`bool`, float scalars `Scalar`; outputs are Tensors. Its fake implementation
computes the outputs' shapes from the inputs' dims and their dtypes from the
declared types, so torch.compile traces through it without running it. Its
implementation runs fusec on the tensors' device: CUDA tensors on the cuda
backend, on torch's current stream, with outputs and temporaries from torch's
caching allocator (so CUDA graphs capture it); CPU tensors on the sim backend
(or the numpy one).

Float scalars are `Scalar`, not `float` (Dynamo guards on the value of a
custom op's `float` argument). A float that changes, Dynamo makes symbolic,
but AOTAutograd (aot_eager, Inductor) still specializes one that reaches a
custom op, so each new value (a learning rate) would compile the model again:
under torch.compile the op is called as `NAME_tensor_scalars`, taking its
float scalars as 0-d float64 tensors, which pass through as graph inputs. On
CPU tensors their values are read on the host (`.item()`); on CUDA tensors
they are tensors on the device, which the kernels read (the pipeline compiled
with scalars_in_memory: no synchronization, and CUDA graphs see the memory,
not a value). See `TorchOp._tensor_scalars` and torch_op's scalars_in_memory.

An op whose pipeline cannot be differentiated (repeat, inout, no float output)
raises the located FzError that says why when a gradient reaches it (its
backward), or, for an op mutating its arguments (for which torch keeps no
autograd formula), when it is called on a tensor that requires grad.
"""
from __future__ import annotations

import functools
import inspect
import sys
import typing
from dataclasses import dataclass, replace

from fusec.errors import ArgumentError, FzError
from fusec.ir.launch import CallSignature, SignatureParam, call_signature
from fusec.jit import JitOptions, JitPipeline, jit
from fusec.runtime.binder import bind_dims, concrete

# The schema type of a scalar parameter, by its kind.
SCALAR_SCHEMA = {"float": "Scalar", "int": "SymInt", "uint": "SymInt", "bool": "bool"}
# The Python type a scalar of a schema type is passed as.
SCALAR_PYTHON = {"Scalar": float, "SymInt": int, "bool": bool}
# The most arguments an op's schema may have (c10's limit: "this PyTorch build only supports 64"):
# the backward op's forms that take more saved outputs are left out of the choice.
TORCH_MAX_ARGUMENTS = 64
JIT_OPTIONS = ("fuse", "backend", "max_regs", "arch", "persistent")


def torch_op(source, /, *, name: str, pipeline: str | None = None, scalars_in_memory: bool | str = "auto",
             **jit_options) -> "TorchOp":
    """Registers a pipeline as the torch.library custom op `name` ("namespace::op").

    source: a path to a .fz file, .fz source text, or a Python function as
    `@fusec.jit` takes one, annotated as torch.library.custom_op requires
    (`x: torch.Tensor, s: float -> torch.Tensor`, or a tuple of Tensors).
    pipeline: which pipeline of a file with several. jit_options: fuse,
    max_regs, arch and persistent, as fusec.jit takes them, and backend: where
    CPU tensors run ("sim", the default, or "numpy"; "cuda": CUDA tensors
    only). CUDA tensors run on the cuda backend.
    scalars_in_memory: how a call under torch.compile passes its float scalars
    (as 0-d float64 tensors, `op.op_tensor_scalars`, so a new value does not
    recompile): "auto" (the default), on CUDA tensors a tensor on their device
    that the kernels read (no synchronization, CUDA graphs see its memory), on
    CPU tensors a CPU tensor whose value is read (`.item()`); True: on CPU
    tensors too, a tensor the sim backend's kernels read (as on CUDA; for tests
    of that path without a GPU); False: CUDA tensors keep the `Scalar` (each new
    value compiles again). A .fz pipeline's op only: a traced function's op
    keeps its Scalar on CUDA tensors.
    """
    import torch

    unknown = set(jit_options) - set(JIT_OPTIONS)
    if scalars_in_memory not in (True, False, "auto"):
        raise ValueError(f"fusec.torch_op(): scalars_in_memory= takes 'auto', True or False; got {scalars_in_memory!r}")
    if unknown:
        raise TypeError(f"fusec.torch_op() has no option {', '.join(sorted(unknown))} (options: name, pipeline, "
                        f"{', '.join(JIT_OPTIONS)})")
    options = JitOptions(**jit_options)
    if callable(source):
        if pipeline is not None:
            raise TypeError("fusec.torch_op(): pipeline= names a pipeline of a .fz file; it does not apply to a "
                            "function")
        definition = _TracedDefinition(source, options, torch)
    else:
        compiled = jit(source, backend="numpy", pipeline=pipeline)
        if not isinstance(compiled, JitPipeline):
            raise ValueError(f"fusec.torch_op(): the program has several pipelines "
                             f"({', '.join(p.name for p in compiled.program.pipelines)}): name one with pipeline=")
        definition = _FzDefinition(compiled.program, compiled.name, options)
    return TorchOp(torch, name, definition, scalars_in_memory=scalars_in_memory)


class TorchOp:
    """A fusec pipeline registered as a torch custom op: call it as the op.

    `op` is the torch.library CustomOpDef (`op.register_autograd`, ...), and
    `schema` its schema."""

    def __init__(self, torch, name: str, definition: "_Definition", differentiable: bool = True,
                 scalars_in_memory: bool | str = "auto"):
        self.name, self.definition, self.torch = name, definition, torch
        # Where a call of op_tensor_scalars passes its 0-d tensors to kernels that read them (device
        # types; see torch_op's scalars_in_memory): a .fz pipeline's op, on CUDA, and with True on the
        # CPU where the sim backend runs it.
        self._in_memory: frozenset[str] = frozenset()
        if definition.reads_scalars_from_memory and scalars_in_memory is not False:
            cpu = scalars_in_memory is True and definition.options.backend in ("sim", "auto")
            self._in_memory = frozenset({"cuda", "cpu"} if cpu else {"cuda"})
        self.schema = definition.schema()
        mutated = [p.name for p in definition.params if p.mutated]
        self.op = torch.library.custom_op(name, self._run, mutates_args=mutated, schema=self.schema)
        self.op.register_fake(self._fake)
        # The same op taking its float scalars as 0-d float64 tensors (`NAME_tensor_scalars`): what
        # torch.compile calls (see _tensor_scalars), and the backward of such a call (see __call__).
        self._floats = tuple(i for i, p in enumerate(definition.params) if p.type == "Scalar")
        self.op_tensor_scalars = None
        if self._floats:
            self.op_tensor_scalars = torch.library.custom_op(
                f"{name}_tensor_scalars", self._run_tensor_scalars, mutates_args=mutated,
                schema=definition.schema(tensor_scalars=True))
            self.op_tensor_scalars.register_fake(self._fake)
        ops = [op for op in (self.op, self.op_tensor_scalars) if op is not None]
        self._runners: dict[tuple, object] = {}
        # The backward op (None: a backward op itself, no double backward yet), or why there is none:
        # the located FzError of what cannot be differentiated (repeat, inout, no float output).
        self.backward, self.not_differentiable = None, None
        if differentiable:
            try:
                self.backward = definition.backward(torch, name, scalars_in_memory)
            except FzError as exc:
                self.not_differentiable = exc
        for op in ops:
            if self.backward is not None:
                op.register_autograd(self._backward, setup_context=self._setup_context)
            elif self.not_differentiable is not None and not mutated:
                # torch refuses autograd for an op that mutates its arguments (see __call__)
                op.register_autograd(self._refuse_backward, setup_context=_no_context)

    def __call__(self, *args, **kwargs):
        torch = self.torch
        if self.not_differentiable is not None and self.definition.mutates and torch.is_grad_enabled():
            # An op mutating a tensor that autograd records would leave a silently wrong gradient
            # (torch keeps no autograd formula for such an op): refused, with the located reason.
            if any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values())):
                raise self._not_differentiable()
        if self._floats and not kwargs and self._tensor_scalars(args):
            # Made in the traced code (Inductor makes it from the SymFloat, no host synchronization):
            # on the tensors' device where the kernels read it, else on the CPU (read by `.item()`).
            device = self._tensor_device(args)
            device = device if device is not None and device.type in self._in_memory else None
            args = tuple(torch.zeros((), dtype=torch.float64, device=device) + a if i in self._floats and
                         not isinstance(a, torch.Tensor) else a for i, a in enumerate(args))
            return self.op_tensor_scalars(*args)
        return self.op(*args, **kwargs)

    def _tensor_scalars(self, args: tuple) -> bool:
        """Whether a call takes its float scalars as tensors: under torch.compile on CPU tensors, and
        on CUDA tensors where the kernels read them from memory (`_in_memory`), or where one already
        is a tensor (the backward of such a call).

        Dynamo makes a float argument that changes symbolic, but a custom op's `Scalar` is then
        specialized (AOTAutograd's pass turning float arithmetic into tensor arithmetic cannot reach
        into the op), so each new value would compile again; as a 0-d tensor made by an addition
        (which that pass does turn), it is an input of the graph. On CUDA tensors a CPU tensor would
        keep Inductor's CUDA graphs (mode="reduce-overhead") from capturing the op, and reading a
        CUDA one on the host (`.item()`) needs a synchronization: the op takes a CUDA tensor there
        only where its kernels read it from device memory (compiled with scalars_in_memory), and
        keeps its Scalar otherwise (an op of a traced function, or scalars_in_memory=False)."""
        torch = self.torch
        if any(isinstance(args[i], torch.Tensor) for i in self._floats if i < len(args)):
            return True
        if not torch.compiler.is_compiling():
            return False
        device = self._tensor_device(args)
        return device is not None and (device.type == "cpu" or device.type in self._in_memory)

    def _tensor_device(self, args: tuple):
        """The device of the call's first tensor parameter (None: none given)."""
        return next((a.device for a, p in zip(args, self.definition.params)
                     if p.is_tensor and isinstance(a, self.torch.Tensor)), None)

    def _run_tensor_scalars(self, *args):
        """op_tensor_scalars: its 0-d float64 tensors read by the kernels where they run on a device
        that reads them from memory (`_in_memory`) and every one is on the tensors' device; else
        (the CPU, a scalar tensor made elsewhere) their values read on the host."""
        torch = self.torch
        device = self._device(args)
        if device.type in self._in_memory and all(
                args[i].device == device and args[i].dtype == torch.float64 and args[i].dim() == 0
                for i in self._floats):
            return self._execute(args, in_memory=True)
        return self._run(*(float(a) if i in self._floats else a for i, a in enumerate(args)))

    def _not_differentiable(self) -> FzError:
        """The located reason, for a call whose gradient fusec cannot give."""
        return self.not_differentiable.with_source(self.not_differentiable.source)

    def _refuse_backward(self, ctx, *grads):
        raise self._not_differentiable()

    def __repr__(self) -> str:
        return f"<fusec torch op {self.name}{self.schema}>"

    # ---- autograd: the backward pipeline derived from the source (fusec.frontend.grad), itself an op
    def _setup_context(self, ctx, inputs, output):
        ctx.inputs = inputs
        ctx.outputs = output if isinstance(output, tuple) else (output,)
        # The outputs the backward takes saved (the cost model's choice: fusec.frontend.grad.choose_backward).
        taken = [out for out, saved in zip(ctx.outputs, self.definition.saved_outputs()) if saved]
        ctx.save_for_backward(*[a for a in inputs if isinstance(a, self.torch.Tensor)], *taken)

    def _backward(self, ctx, *grads):
        torch = self.torch
        saved = iter(ctx.saved_tensors)
        inputs = [next(saved) if isinstance(a, torch.Tensor) else a for a in ctx.inputs]
        taken = list(saved)
        seeded, returned, kept = self.definition.gradient_layout(inputs, ctx.outputs)
        # Autograd's gradients may be broadcast views (y.sum()'s is ones expanded): made contiguous.
        seeds = [g.contiguous() if g is not None else torch.zeros_like(out)
                 for g, out, wanted in zip(grads, ctx.outputs, seeded) if wanted]
        found = iter(_op_results(self.backward(*inputs, *taken, *seeds)))
        gradients = [next(found) if r else None for r in returned]
        return tuple(g if keep else None for g, keep in zip(gradients, kept))

    # ---- the fake (meta) implementation: shapes and dtypes only
    def _fake(self, *args):
        device = self._device(args)
        return self._new_outputs(self.definition.signature(args, fake=True), args, device)

    def _new_outputs(self, signature: CallSignature, args: tuple, device):
        """New output tensors for a call, their shapes bound from the inputs' dims."""
        torch = self.torch
        shapes = {}
        for p, a in zip(signature.params, args):
            if p.is_array:
                if a.dtype != getattr(torch, p.type.torch):
                    raise ArgumentError(f"parameter '{p.name}': expected dtype {p.type} "
                                        f"(torch.{p.type.torch}), got {a.dtype}")
                shapes[p.name] = tuple(a.shape)
        dims = bind_dims(signature, shapes)
        self.definition.check_outputs(len(signature.outputs))
        outputs = [torch.empty(concrete(o.shape, dims), dtype=getattr(torch, o.type.torch), device=device)
                   for o in signature.outputs]
        return _as_op_result(outputs)

    def _device(self, args: tuple):
        """The device of the call's tensors (one for all)."""
        first = None
        for p, a in zip(self.definition.params, args):
            if p.is_tensor:
                if first is None:
                    first = (p.name, a.device)
                elif a.device != first[1]:
                    raise ArgumentError(f"parameter '{p.name}' is on {a.device}, but '{first[0]}' is on {first[1]}: "
                                        "pass tensors on one device")
        return first[1]

    # ---- the implementation
    def _run(self, *args):
        return self._execute(args)

    def _execute(self, args: tuple, in_memory: bool = False):
        """The op on its tensors' device; `in_memory`: the float scalars are 0-d float64 tensors
        there, which the kernels read (the pipeline compiled with scalars_in_memory)."""
        device = self._device(args)
        args = self.definition.scalars_as_declared(args)
        if device.type == "cuda":
            result = self._run_cuda(device.index, args, in_memory)
        elif device.type == "cpu":
            result = self._run_cpu(device, args, in_memory)
        else:
            raise ArgumentError(f"fusec runs tensors on the CPU or a CUDA device, not on {device}")
        self.definition.check_outputs(0 if result is None else len(result) if isinstance(result, tuple) else 1)
        return result

    def _run_cpu(self, device, args: tuple, in_memory: bool = False):
        backend = self.definition.options.backend
        if backend == "cuda":
            raise ArgumentError(f"{self.name} was registered with backend='cuda': it takes CUDA tensors")
        backend = "sim" if backend == "auto" else backend
        runner = self._runner(backend, 0, in_memory)
        if backend == "numpy":
            # The NumPy reference allocates NumPy outputs itself: it writes into torch's instead.
            outputs = self._new_outputs(self.definition.signature(args), args, device)
            runner(*args, out=outputs)
            return outputs
        return runner(*args)

    def _run_cuda(self, index: int, args: tuple, in_memory: bool = False):
        from fusec.runtime.backends.cuda import cupy
        cp = cupy()
        if cp.cuda.runtime.getDevice() == index:
            return self._runner("cuda", index, in_memory)(*args)
        with cp.cuda.Device(index):  # a pipeline's module is loaded on its device and launched there
            return self._runner("cuda", index, in_memory)(*args)

    def _runner(self, backend: str, device: int = 0, in_memory: bool = False):
        """What runs the op on `backend` (and CUDA device), made at its first call; `in_memory`:
        the pipeline compiled to read its float scalars from memory."""
        runner = self._runners.get((backend, device, in_memory))
        if runner is None:
            runner = self._runners[backend, device, in_memory] = self.definition.runner(backend, in_memory)
        return runner


def _no_context(ctx, inputs, output) -> None:
    pass


def _as_op_result(outputs: list):
    return None if not outputs else outputs[0] if len(outputs) == 1 else tuple(outputs)


def _op_results(result) -> tuple:
    """An op's result as a tuple of its outputs (`_as_op_result` undone)."""
    return () if result is None else result if isinstance(result, tuple) else (result,)


# ---- what an op is defined from


@dataclass(frozen=True, slots=True)
class OpParam:
    """A parameter of the op: its name, schema type and whether the op writes it."""

    name: str
    type: str  # "Tensor", "Scalar", "SymInt" or "bool"
    mutated: bool = False

    @property
    def is_tensor(self) -> bool:
        return self.type == "Tensor"


class GradientLayout(typing.NamedTuple):
    """How a backward op is called, per forward output or parameter: the output gradients it
    takes (`seeded`), the parameters it returns a gradient for (`returned`), and which of those
    autograd gets (`kept`; the others None)."""

    seeded: list[bool]
    returned: list[bool]
    kept: list[bool]


class _Definition:
    """A pipeline as an op sees it: its parameters and number of outputs (the
    schema), the call signature of given arguments, and a runner per backend."""

    params: list[OpParam]
    n_outputs: int
    options: JitOptions
    # Whether `runner(backend, in_memory=True)` reads the float scalars from memory (0-d float64 arrays)
    reads_scalars_from_memory = False

    def backward(self, torch, name: str, scalars_in_memory: bool | str = "auto") -> "TorchOp":
        """The op computing the gradients; FzError where the pipeline cannot be differentiated."""
        raise NotImplementedError

    @property
    def mutates(self) -> bool:
        return any(p.mutated for p in self.params)

    def gradient_layout(self, inputs: list, outputs: tuple) -> "GradientLayout":
        """How the backward op is called for these inputs and outputs."""
        raise NotImplementedError

    def saved_outputs(self) -> list[bool]:
        """Which outputs the backward op takes (after the parameters, before the output
        gradients), saved by autograd from the forward."""
        return [False] * self.n_outputs

    def schema(self, tensor_scalars: bool = False) -> str:
        """The op's schema (tensor_scalars: float scalars as Tensors, 0-d float64)."""
        aliases = iter("abcdefghijklmnopqrstuvwxyz")
        params = [f"Tensor({next(aliases)}!) {p.name}" if p.mutated else
                  f"{'Tensor' if tensor_scalars and p.type == 'Scalar' else p.type} {p.name}" for p in self.params]
        returns = "Tensor" if self.n_outputs == 1 else "(" + ", ".join(["Tensor"] * self.n_outputs) + ")"
        return f"({', '.join(params)}) -> {returns}"

    def signature(self, args: tuple, fake: bool = False) -> CallSignature:
        raise NotImplementedError

    def runner(self, backend: str, in_memory: bool = False):
        raise NotImplementedError

    def scalars_as_declared(self, args: tuple) -> tuple:
        return args

    def check_outputs(self, n: int) -> None:
        pass


class _FzDefinition(_Definition):
    """A pipeline of a .fz program."""

    def __init__(self, program, name: str, options: JitOptions):
        self.program, self.name, self.options = program, name, options
        self._saved: tuple[str, ...] = ()  # the outputs the chosen backward takes
        self._signature = call_signature(program.pipeline(name))
        self.params = [OpParam(p.name, "Tensor" if p.is_array else SCALAR_SCHEMA[p.type.kind], p.role == "inout")
                       for p in self._signature.params]
        if not any(p.is_tensor for p in self.params):
            raise ValueError(f"fusec.torch_op(): pipeline '{name}' has no array parameter; an op runs on its "
                             "tensors' device")
        self.n_outputs = len(self._signature.outputs)

    def signature(self, args: tuple, fake: bool = False) -> CallSignature:
        return self._signature

    reads_scalars_from_memory = True

    def runner(self, backend: str, in_memory: bool = False):
        return JitPipeline(self.program, self.name, replace(self.options, backend=backend, scalars_in_memory=in_memory))

    def gradient_layout(self, inputs: list, outputs: tuple) -> "GradientLayout":
        """The derived pipeline takes the float outputs' gradients and returns the float arrays'."""
        float_inputs = [p.is_array and p.type.is_float for p in self._signature.params]
        return GradientLayout([o.type.is_float for o in self._signature.outputs], float_inputs, float_inputs)

    def saved_outputs(self) -> list[bool]:
        return [o.name in self._saved for o in self._signature.outputs]

    def backward(self, torch, name: str, scalars_in_memory: bool | str = "auto") -> "TorchOp":
        """The backward pipeline as the op `name`_backward, in the form the cost model
        chose (the outputs it takes saved, if any); FzError, located, where it cannot be
        derived (repeat, inout, no float output: the op's backward, or a call of a
        mutating op that autograd would record, raises it)."""
        from fusec.compiler import CompileOptions
        from fusec.frontend.grad import backward_program, choose_backward
        options = CompileOptions(fuse=self.options.fuse, max_regs=self.options.max_regs,
                                 fast_math=self.options.fast_math,
                                 **({"arch": self.options.arch} if self.options.arch else {}))
        self._saved = choose_backward(self.program, self.name, options, max_params=TORCH_MAX_ARGUMENTS).saved
        program = backward_program(self.program, self.name, saved={self.name: self._saved})
        return TorchOp(torch, f"{name}_backward", _FzDefinition(program, f"{self.name}_grad", self.options),
                       differentiable=False, scalars_in_memory=scalars_in_memory)


class _TracedDefinition(_Definition):
    """A Python function, traced as `@fusec.jit` traces it, once per signature;
    the op's schema comes from its annotations."""

    def __init__(self, fn, options: JitOptions, torch):
        self.fn, self.options = fn, options
        self.params = [OpParam(name, _schema_type(fn, name, hint, torch)) for name, hint in _hints(fn).items()]
        if not any(p.is_tensor for p in self.params):
            raise ValueError(f"fusec.torch_op(): {fn.__name__} has no Tensor parameter; an op runs on its "
                             "tensors' device")
        self.n_outputs = _annotated_outputs(fn, torch)
        self._python = [SCALAR_PYTHON.get(p.type) for p in self.params]

    def runner(self, backend: str, in_memory: bool = False):
        from fusec.traced import TracedFunction
        return TracedFunction(self.fn, replace(self.options, backend=backend))

    @functools.cached_property
    def _tracer(self):
        """Traces for the fake implementation: the pipeline of a signature, never run."""
        return self.runner("numpy")

    def scalars_as_declared(self, args: tuple) -> tuple:
        """Scalars as their annotated type (a `Scalar` may come as an int), so that
        the real call traces the signature the fake one did."""
        return tuple(a if python is None else python(a) for python, a in zip(self._python, args))

    def signature(self, args: tuple, fake: bool = False) -> CallSignature:
        if fake:  # symbolic scalars: their annotated type is all that tracing reads
            args = tuple(a if python is None else python() for python, a in zip(self._python, args))
        pipeline = self._tracer.compile_for(*args)
        return call_signature(pipeline.program.pipeline(pipeline.name))

    def backward(self, torch, name: str, scalars_in_memory: bool | str = "auto") -> "TorchOp":
        """The op `name`_backward: for each traced signature, the backward derived from
        the traced pipeline, as for a .fz pipeline (an error at backward time where a
        traced pipeline cannot be differentiated)."""
        return TorchOp(torch, f"{name}_backward", _TracedBackward(self), differentiable=False)

    def gradient_layout(self, inputs: list, outputs: tuple) -> "GradientLayout":
        """The traced backward's schema is fixed before any signature is traced: it takes
        every output's gradient and returns one for every tensor, kept for the float ones."""
        return GradientLayout([True] * len(outputs), [p.is_tensor for p in self.params],
                              [p.is_tensor and a.is_floating_point() for p, a in zip(self.params, inputs)])

    def check_outputs(self, n: int) -> None:
        if n != self.n_outputs:
            raise TypeError(f"{self.fn.__name__} returns {n} array{'s' if n != 1 else ''}, but its annotation "
                            f"says {self.n_outputs}")


def _hints(fn) -> dict:
    """Each parameter's annotation, in order."""
    try:
        parameters = inspect.signature(fn).parameters
        hints = typing.get_type_hints(fn)
    except (TypeError, ValueError, NameError) as exc:
        raise TypeError(f"fusec.torch_op(): cannot read the annotations of {fn!r} ({exc})") from None
    for name, p in parameters.items():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise TypeError(f"fusec.torch_op(): {fn.__name__}'s parameter '{name}' must be positional (an op's "
                            "schema has a fixed list of parameters)")
        if name not in hints:
            raise TypeError(f"fusec.torch_op(): annotate {fn.__name__}'s parameter '{name}' (torch.Tensor, float, "
                            "int or bool), as torch.library.custom_op requires")
    return {name: hints[name] for name in parameters}


def _schema_type(fn, name: str, hint, torch) -> str:
    found = {torch.Tensor: "Tensor", float: "Scalar", int: "SymInt", bool: "bool"}.get(hint)
    if found is None:
        raise TypeError(f"fusec.torch_op(): {fn.__name__}'s parameter '{name}' is annotated {hint!r}; an op takes "
                        "torch.Tensor, float, int or bool")
    return found


def _annotated_outputs(fn, torch) -> int:
    hint = typing.get_type_hints(fn).get("return")
    if hint is torch.Tensor:
        return 1
    if typing.get_origin(hint) is tuple:
        items = typing.get_args(hint)
        if items and all(item is torch.Tensor for item in items):
            return len(items)
    raise TypeError(f"fusec.torch_op(): annotate what {fn.__name__} returns: torch.Tensor, or "
                    "tuple[torch.Tensor, ...] with one Tensor per returned array")


class _TracedBackward(_Definition):
    """The backward op of a traced function: the forward's parameters, then one
    gradient per forward output; returns one gradient per tensor parameter, each
    of that tensor's shape and dtype (an integer tensor's is zeros: autograd gets
    None for it). Run by deriving the backward of the pipeline traced for the
    call's signature (fusec.frontend.grad), compiled once per signature."""

    def __init__(self, forward: _TracedDefinition):
        self.forward, self.options = forward, forward.options
        self.params = [OpParam(p.name, p.type) for p in forward.params] + \
            [OpParam(f"grad_{j}", "Tensor") for j in range(forward.n_outputs)]
        self.n_outputs = sum(p.is_tensor for p in forward.params)
        # (backend, the traced program's text, name) -> (its backward, the traced call signature)
        self._backwards: dict[tuple, tuple[JitPipeline, CallSignature]] = {}

    def scalars_as_declared(self, args: tuple) -> tuple:
        n = len(self.forward.params)
        return self.forward.scalars_as_declared(args[:n]) + tuple(args[n:])

    def signature(self, args: tuple, fake: bool = False) -> CallSignature:
        forward = self.forward.signature(args[:len(self.forward.params)], fake)
        seeds = tuple(SignatureParam(f"grad_{o.name}", o.type, o.shape, "in") for o in forward.outputs)
        grads = tuple(SignatureParam(f"grad_{p.name}", p.type, p.shape, "out") for p in forward.params if p.is_array)
        return CallSignature(f"{forward.name}_backward", forward.params + seeds, grads, forward.dim_equations)

    def runner(self, backend: str, in_memory: bool = False):
        tracer = self.forward.runner(backend)
        n = len(self.forward.params)

        def run(*args, out=None):
            inputs, seeds = args[:n], args[n:]
            backward, signature = self._backward_of(tracer.compile_for(*inputs), backend)
            wanted = [s for s, o in zip(seeds, signature.outputs) if o.type.is_float]
            found = iter(_op_results(backward(*inputs, *wanted)))
            grads = [next(found) if p.type.is_float else _zeros_like(a)
                     for p, a in zip(signature.params, inputs) if p.is_array]
            if out is not None:  # the numpy backend: written into the op's outputs
                for o, g in zip(_op_results(out), grads):
                    o.copy_(g)
                return out
            return _as_op_result(grads)
        return run

    def _backward_of(self, traced: JitPipeline, backend: str) -> tuple[JitPipeline, CallSignature]:
        """The backward of a traced pipeline, and the traced pipeline's call signature."""
        key = (backend, traced.program.source.text, traced.name)
        found = self._backwards.get(key)
        if found is None:
            from fusec.frontend.grad import backward_program
            # Recomputing every forward value: the op's schema (fixed before tracing) takes no saved output.
            # FzError: what cannot be differentiated.
            program = backward_program(traced.program, traced.name, saved={})
            found = self._backwards[key] = (
                JitPipeline(program, f"{traced.name}_grad", replace(self.options, backend=backend)),
                call_signature(traced.program.pipeline(traced.name)))
        return found


def _zeros_like(tensor):
    return sys.modules["torch"].zeros_like(tensor)
