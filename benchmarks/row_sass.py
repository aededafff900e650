"""SASS instructions an element of the row kernels that hold their row in registers (no GPU needed).

    PYTHONPATH=. python3 benchmarks/row_sass.py [--examples softmax,log_softmax,...] [--dtypes f32,bf16]
        [--variants r16,r128,c4_r256,...] [--compiler nvrtc|nvcc] [--arch sm_90]

For each example (examples/NAME.fz's pipelines NAME and NAME_bf16) the fused
module is compiled as the device compiles it (NVRTC with fusec's options, or
`nvcc -cubin -O3` where NVRTC is not installed) and read with nvdisasm. For
each variant that holds its row in registers (`_r8` ... `_r1024`, and the
clusters' `_c*_r*`) it prints the static count of the kernel's main path (its
instructions up to its last EXIT: the cold code after it, such as a division's
slow path or a diverged shuffle's fallback, left out; NOPs left out), divided
by the elements a thread holds, by opcode class:

- fp: FADD FMUL FFMA FMNMX HADD2/HFMA2 arithmetic (not HFMA2.MMA, a move);
- mufu: MUFU (exp2, log2, rcp, rsqrt);
- cmp/sel: FSETP FSEL ISETP SEL FSET PLOP3 FCHK;
- cvt: F2F F2FP I2F F2I PRMT (bf16/f16 <-> f32 conversions and packing);
- int: IMAD IADD3 LEA SHF LOP3 (addresses, shifts, moves by IMAD);
- mov: MOV HFMA2.MMA CS2R S2R (register moves and special registers);
- mem: LDG STG LDS STS LDC ULDC ...;
- sync: SHFL BAR, cluster barriers and the like;
- ctl: BRA BSSY BSYNC EXIT CALL ...;
- uni: the uniform datapath's U* instructions (issued once a warp, as the others).

`passes` is the same count with every block, warp and cluster combine of the
kernel replaced by its thread's own value (the module's source edited before
compiling): the element passes alone, without the combines' shuffles and
barriers, which a thread runs once whatever its elements. At the copy's rate a
bf16 element has about 33 thread-instructions on the H200 (132 SMs x 4
schedulers x 32 lanes x 1.98 GHz over 4 bytes at 4.2 TB/s), an f32 one 66. A
static count: a branch's both sides count, loops once.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.dirname(__file__))
from fast_math import nvdisasm  # noqa: E402

from fusec.compiler import compile_pipeline  # noqa: E402
from fusec.frontend import load  # noqa: E402

EXAMPLES = ["softmax", "log_softmax", "layernorm", "rmsnorm", "add_rmsnorm", "cross_entropy"]
CLASSES = ["fp", "mufu", "cmp/sel", "cvt", "int", "mov", "mem", "sync", "ctl", "uni", "other"]
_CLASS_OF = {
    "fp": "FADD FMUL FFMA FMNMX HADD2 HMUL2 HFMA2 FRND DADD DMUL DFMA".split(),
    "mufu": ["MUFU"],
    "cmp/sel": "FSETP FSEL ISETP SEL FSET PLOP3 FCHK DSETP P2R R2P".split(),
    "cvt": "F2F F2FP I2F F2I PRMT I2FP F2IP".split(),
    "int": "IMAD IADD3 LEA SHF LOP3 IABS IMNMX POPC FLO BMSK IADD VIADD".split(),
    "mov": "MOV CS2R S2R".split(),
    "mem": "LDG STG LDS STS LDC LD ST ATOM ATOMS RED LDSM".split(),
    "sync": "SHFL BAR UCGABAR MEMBAR WARPSYNC VOTE CCTL ERRBAR".split(),
    "ctl": "BRA BSSY BSYNC EXIT CALL RET BREAK JMP BRX YIELD".split(),
}


def option(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def opclass(mnemonic: str) -> str:
    base = mnemonic.split(".")[0]
    if mnemonic.startswith("HFMA2.MMA"):
        return "mov"  # a 32-bit constant into a register
    if mnemonic.startswith("IMAD.MOV"):
        return "mov"
    if base.startswith("U") and base not in ("UCGABAR",):
        return "uni"
    for name, ops in _CLASS_OF.items():
        if base in ops:
            return name
    return "other"


_STUB = """
// row_sass.py: each combine replaced by the thread's own value (the passes alone)
template <typename T, typename Op, typename... Rest>
__device__ __forceinline__ T fz_stub_combine(T v, Op, Rest...) { return v; }
"""
_COMBINES = re.compile(r"\bfz_(?:block|group|warp|cluster)_combine(?:_push|_pull|_warps)?(?:<[^>(]*>)?\(")


def stubbed(source: str) -> str:
    """The module with every combine in a kernel's body (after the prelude) the identity."""
    at = source.index('extern "C"')
    head, kernels = source[:at], source[at:]
    return head + _STUB + _COMBINES.sub("fz_stub_combine(", kernels)


def cubin_of(source: str, compiler: str, arch: str) -> bytes:
    if compiler == "nvrtc":
        from fusec.runtime.backends.cuda import compile_module
        return compile_module(source, arch, native=True)
    with tempfile.TemporaryDirectory() as d:
        cu, out = os.path.join(d, "k.cu"), os.path.join(d, "k.cubin")
        with open(cu, "w") as f:
            f.write(source)
        subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-O3", "-w", "-o", out, cu], check=True)
        with open(out, "rb") as f:
            return f.read()


def sass_functions(cubin: bytes, tool: str) -> dict[str, list[str]]:
    """Each function's main path: its mnemonics (with modifiers) up to its last EXIT."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    functions: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if m := re.match(r"\.text\.(\w+):", line):
            name = m.group(1)
            functions[name] = []
        elif name and (m := re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)):
            functions[name].append(m.group(1))
    out = {}
    for name, ops in functions.items():
        last = max((i for i, op in enumerate(ops) if op == "EXIT"), default=len(ops) - 1)
        out[name] = [op for op in ops[:last + 1] if op != "NOP"]
    return out


def held_variants(compiled) -> dict[str, int]:
    """Each row variant holding its row in registers: its elements a thread."""
    return {v.name: v.row_resident * v.elements_per_thread
            for k in compiled.interface.kernels for v in k.variants if v.row_resident}


def main() -> None:
    examples = option("--examples", ",".join(EXAMPLES)).split(",")
    dtypes = option("--dtypes", "f32,bf16").split(",")
    arch = option("--arch", "sm_90")
    wanted = option("--variants", "")
    wanted = set(wanted.split(",")) if wanted else None
    compiler = option("--compiler", "")
    if not compiler:
        try:
            import cuda.bindings.nvrtc  # noqa: F401
            compiler = "nvrtc"
        except ImportError:
            compiler = "nvcc"
    tool = nvdisasm()
    if tool is None:
        sys.exit("row_sass.py: no nvdisasm (PATH, CUDA_HOME or NVIDIA's pip package)")
    print(f"SASS ({compiler}, {arch}): the main path's instructions an element a thread holds; "
          "`passes`: without the combines\n")
    print("| kernel | elements a thread | instructions | an element | passes an element | "
          + " | ".join(CLASSES) + " |")
    print("|---|---|---|---|---|" + "---|" * len(CLASSES))
    for example in examples:
        program = load(f"examples/{example}.fz")
        for dtype in dtypes:
            name = example if dtype == "f32" else f"{example}_{dtype}"
            compiled = compile_pipeline(program, name)
            variants = held_variants(compiled)
            main_path = sass_functions(cubin_of(compiled.cuda, compiler, arch), tool)
            passes = sass_functions(cubin_of(stubbed(compiled.cuda), compiler, arch), tool)
            for variant, elements in variants.items():
                short = variant.split("_k", 1)[-1].split("_", 1)[-1]
                if wanted and short.rsplit("_v", 1)[0] not in wanted and short not in wanted:
                    continue
                ops = main_path[variant]
                classes = Counter(opclass(op) for op in ops)
                print(f"| {variant} | {elements} | {len(ops)} | {len(ops) / elements:.1f} | "
                      f"{len(passes[variant]) / elements:.1f} | "
                      + " | ".join(f"{classes[c] / elements:.1f}" for c in CLASSES) + " |", flush=True)


if __name__ == "__main__":
    main()
