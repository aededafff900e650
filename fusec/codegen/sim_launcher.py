"""The sim backend's launchers: one host C++ function per variant that runs the
emitted kernel, unchanged, for every thread of its grid (`fz_sim_grid` in the
shim header). Rendered from the launch interface alone, like the CUDA module."""
from __future__ import annotations

from fusec.codegen.emit import environment
from fusec.ir.launch import LaunchInterface


def emit_sim_launcher(interface: LaunchInterface, module_file: str) -> str:
    launchers = []
    for launch in interface.kernels:
        params, args = [], []
        for j, p in enumerate(launch.params):
            if p.pack is None:  # an address, passed from Python as a void*
                params.append(f"void* a{j}")
                args.append(f"({p.c_type})a{j}")
            else:
                params.append(f"{p.pack.c} a{j}")
                args.append(f"a{j}")
        launchers += [{"name": v.name, "params": params, "args": args} for v in launch.variants]
    return environment().get_template("sim_launcher.cpp.j2").render(module=module_file, kernels=launchers)
