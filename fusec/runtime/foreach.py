"""foreach (multi-tensor apply): one launch over many sets of arrays."""
from __future__ import annotations

import numpy as np

from ..codegen.emit import CHUNK
from ..errors import ArgumentError
from .executor import BLOCK_SIZE, Executor


class MultiTensorExecutor(Executor):
    """Runs a pipeline compiled with `multi_tensor=True` (its one kernel reads
    per-set pointer tables and a table of work items)."""

    def foreach(self, sets, *scalar_args, **scalar_kwargs) -> list:
        """The pipeline over many sets of arrays in one launch (a multi-tensor
        kernel): `sets` is a list with one tuple of array arguments per set, in
        declaration order; the scalars, given once, are shared. Returns each
        set's outputs; inout arrays are updated in place."""
        (kernel, params, _, _), = self.launches
        array_params = [p for p in self.params if p.shape is not None]
        scalar_params = [p for p in self.params if p.shape is None]
        if not isinstance(sets, (list, tuple)) or not sets:
            raise ArgumentError("foreach takes a non-empty list of argument sets, one tuple of arrays each")
        if len(scalar_args) > len(scalar_params) or set(scalar_kwargs) - {p.name for p in scalar_params}:
            raise ArgumentError(f"foreach takes the scalars {', '.join(p.name for p in scalar_params) or '(none)'}")
        scalars = dict(zip((p.name for p in scalar_params), scalar_args)) | scalar_kwargs
        missing = [p.name for p in scalar_params if p.name not in scalars]
        if missing:
            raise ArgumentError(f"foreach is missing scalar{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        per_set, sizes = [], []
        for j, arrays in enumerate(sets):
            if not isinstance(arrays, (list, tuple)) or len(arrays) != len(array_params):
                raise ArgumentError(f"foreach set {j}: expected {len(array_params)} arrays "
                                    f"({', '.join(p.name for p in array_params)}), got {arrays!r:.60}")
            given = iter(arrays)
            args = [next(given) if p.shape is not None else scalars[p.name] for p in self.params]
            try:
                values, _, _, set_sizes = self._bind(args, {})
                self._allocate(values, None, set_sizes)
            except ArgumentError as exc:
                raise ArgumentError(f"foreach set {j}: {exc}") from None
            per_set.append(values)
            sizes.append(set_sizes.kernels[0][0])
        self._check_across_sets(per_set)
        # The work items: every CHUNK elements of every set, as (set, first element).
        items = [(j, start) for j, n in enumerate(sizes) for start in range(0, n, CHUNK)]
        if items:
            table = self.backend.table(np.array(items, np.int64).reshape(-1, 2))
            launch_args = []
            for kind, key in params:
                if kind == "pointers":
                    pointers = [self.backend.pointer(values[key]) for values in per_set]
                    launch_args.append(self.backend.table(np.array(pointers, np.uint64)))
                elif kind == "scalar":
                    launch_args.append(per_set[0][key])
                elif kind == "sizes":
                    launch_args.append(self.backend.table(np.array(sizes, np.int64)))
                elif kind == "table":
                    launch_args.append(table)
                else:
                    launch_args.append(len(items))
            self.backend.launch(kernel, len(items) * BLOCK_SIZE, launch_args, None, False)
        return [self._result(values) for values in per_set]

    def _check_across_sets(self, per_set: list[list]) -> None:
        """No written array may share memory with any other array: one sweep over
        the arrays sorted by address. (Within a set `_allocate` has checked
        already, so an overlap with a written array is always across sets.)"""
        spans = []
        for j, values in enumerate(per_set):
            for role, value in zip(self.roles, values):
                if role != "scalar":
                    start, end = self.backend.span(value)
                    if end > start:
                        spans.append((start, end, role != "in", j))
        spans.sort()
        end_any = end_written = 0
        for start, end, written, j in spans:
            if (written and start < end_any) or start < end_written:
                raise ArgumentError(f"foreach set {j} shares memory with another set, and one of them writes it: "
                                    "pass separate arrays")
            end_any = max(end_any, end)
            if written:
                end_written = max(end_written, end)
