"""CUDA graphs: a pipeline's launches captured once per argument signature and replayed."""
from __future__ import annotations

from fusec.ir.launch import LaunchInterface
from fusec.runtime.executor import Backend, Executor


class GraphExecutor(Executor):
    """Launches a pipeline's kernels as one CUDA graph (`fusec.jit(..., graph=True)`).

    The launch sequence is captured once per argument signature: the address,
    shape, strides and dtype of every array argument, the scalar values and
    the out= arrays. A call that matches replays the graph, checking nothing
    more (its arguments were checked at the capture); any other captures a new
    one. Each graph holds on to the arrays it was captured with (so none can be
    freed and its memory reused under it) and to its own output and
    intermediate buffers: a replay returns the same output arrays, overwritten,
    as a torch CUDA graph does. At most MAX_GRAPHS signatures are kept, the
    first captured dropped first (a replay does no bookkeeping).
    """

    MAX_GRAPHS = 16

    def __init__(self, interface: LaunchInterface, backend: Backend):
        super().__init__(interface, backend)
        self._graphs: dict[tuple, tuple] = {}  # key -> (graph, result, the values it holds, the kind's stream)

    def __call__(self, *args, **kwargs):
        key = self._call_key(args, scalars=True) if not kwargs else None
        try:
            entry = self._graphs.get(key)
        except TypeError:  # an unhashable scalar (a 0-d array): the checked path keys its checked value
            key, entry = None, None
        if entry is None:  # a new key (checked, then captured), or a call with out= or stream=
            return self._call_checked(args, kwargs, key)
        # On the stream of the arrays' kind (torch's current stream for tensors), where they were produced.
        self.backend.replay(entry[0], entry[3]())
        return entry[1]

    def _call_checked(self, args: tuple, kwargs: dict, key: tuple | None):
        call = self.binder.bind(args, kwargs)
        if key is None:  # the checked values' key: with out= and stream= too
            pointer = self.backend.pointer
            outs = () if call.outputs is None else tuple(map(pointer, call.outputs))
            key = ("checked", tuple(pointer(v) if is_array else v for v, is_array in zip(call.values, self._is_array)),
                   tuple(call.values[i].shape for i in self.binder.array_positions), outs)
        entry = self._graphs.get(key)
        if entry is None:
            values, sizes = self._allocate(call)
            graph = self.backend.capture(lambda capture_stream: self._launch_all(values, sizes, capture_stream))
            entry = self._graphs[key] = (graph, self._result(values), values, call.kind.stream)
            if len(self._graphs) > self.MAX_GRAPHS:
                del self._graphs[next(iter(self._graphs))]
        self.backend.replay(entry[0], call.stream)
        return entry[1]
