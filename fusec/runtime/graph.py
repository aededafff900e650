"""CUDA graphs: a pipeline's launches captured once per argument signature and replayed."""
from __future__ import annotations

from collections import OrderedDict

from ..compiler import Compiled
from .executor import Backend, Executor


class GraphExecutor(Executor):
    """Launches a pipeline's kernels as one CUDA graph (`fusec.jit(..., graph=True)`).

    The launch sequence is captured once per argument signature: the shapes,
    the address of every array argument, the scalar values and the out=
    arrays. A call that matches replays the graph; any other captures a new
    one. Each graph holds on to the arrays it was captured with (so none can be
    freed and its memory reused under it) and to its own output and
    intermediate buffers: a replay returns the same output arrays, overwritten,
    as a torch CUDA graph does. At most MAX_GRAPHS signatures are kept, the
    least recently used dropped first.
    """

    MAX_GRAPHS = 16

    def __init__(self, compiled: Compiled, backend: Backend):
        super().__init__(compiled, backend)
        self._graphs: OrderedDict[tuple, tuple] = OrderedDict()
        self._is_array = [p.shape is not None for p in self.params]

    def __call__(self, *args, **kwargs):
        values, out, stream, sizes = self._bind(args, kwargs)
        pointer = self.backend.pointer
        outs = () if out is None else tuple(map(pointer, out if isinstance(out, (tuple, list)) else (out,)))
        key = (tuple(pointer(v) if is_array else v for v, is_array in zip(values, self._is_array)),
               tuple(values[i].shape for i in self.array_positions), outs)
        entry = self._graphs.get(key)
        if entry is None:
            self._allocate(values, out, sizes)
            graph = self.backend.capture(lambda capture_stream: self._launch_all(values, sizes, capture_stream))
            entry = self._graphs[key] = (graph, values)
            if len(self._graphs) > self.MAX_GRAPHS:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        self.backend.replay(entry[0], stream)
        return self._result(entry[1])
