"""The sim backend's launchers: one host C++ function per variant that runs the
emitted kernel, unchanged, for every thread of its grid (`fz_sim_grid` in the
shim header, or `fz_sim_grid_cooperative` for a kernel whose threads synchronize,
in clusters of blocks where it has them)
and returns what the sim found wrong, if anything. Rendered from the launch
interface alone, like the CUDA module."""
from __future__ import annotations

from fusec.codegen.emit import environment
from fusec.ir.launch import ColumnGrid, Extent, LaunchInterface, NumElements, RowGrid, cluster_blocks


def emit_sim_launcher(interface: LaunchInterface, module_file: str) -> str:
    launchers = []
    for launch in interface.kernels:
        # Each parameter read back from the driver's layout as the kernel declares it.
        params = [f"{p.c_type} a{j} = *({p.c_type}*)params[{j}];" for j, p in enumerate(launch.params)]
        args = [f"a{j}" for j in range(len(launch.params))]
        # A row kernel's threads meet at barriers and shuffles: its blocks run as fibers,
        # with the row's cache in dynamic shared memory (bytes per element times the row's length).
        length = next((f"a{j}" for j, p in reversed(list(enumerate(launch.params)))
                       if isinstance(p.source, (Extent, NumElements))), "0")
        launchers += [{"name": v.name, "params": params, "args": args, "cooperative": isinstance(v.grid, RowGrid) or (isinstance(v.grid, ColumnGrid) and v.grid.total),
                       "shared_bytes": f"{length} * {v.row_cache}u" if v.row_cache else 0,
                       "cluster": cluster_blocks(v)}
                      for v in launch.variants]
    return environment().get_template("sim_launcher.cpp.j2").render(module=module_file, kernels=launchers)
