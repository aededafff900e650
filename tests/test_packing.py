"""A kernel's arguments as the driver takes them (fusec.runtime.packing): every
parameter at its C offset in one buffer, one pointer per parameter into it.
The sim reads them back as the kernel declares them, so every sim test also
checks the packing of its launches; this holds the layout to C's (ctypes)."""
import ctypes

import pytest

from fusec.ir.launch import ArrayArg, KernelParam, NumElements, ScalarArg
from fusec.runtime.packing import ArgumentBuffer
from fusec.types import BOOL, F32, F64, I8, I16, I64, U8, U64

CTYPES = {None: ctypes.c_void_p, BOOL: ctypes.c_bool, I8: ctypes.c_int8, U8: ctypes.c_uint8, I16: ctypes.c_int16,
          F32: ctypes.c_float, F64: ctypes.c_double, I64: ctypes.c_int64, U64: ctypes.c_uint64}
VALUES = {None: 0x7F00_0000_1230, BOOL: True, I8: -5, U8: 250, I16: -30000, F32: 1.5, F64: -2.25,
          I64: -(1 << 40), U64: (1 << 63) + 7}


def param(pack, j):
    if pack is None:
        return KernelParam("float*", f"p{j}", ArrayArg(j))
    return KernelParam(f"const {pack.c}", f"s{j}", ScalarArg(j) if pack is not I64 else NumElements(), pack)


ORDERS = [
    [None, None, F32, F32, I64],  # an elementwise kernel: arrays, scalars, the element count
    [BOOL, F64, I8, None, F32, I64, U8, I16, U64],  # every alignment, each after a smaller one
    [F32],
    [],
]


@pytest.mark.parametrize("packs", ORDERS, ids=["elementwise", "mixed", "one", "none"])
def test_every_parameter_sits_where_c_puts_it_and_reads_back(packs):
    arguments = ArgumentBuffer([param(p, j) for j, p in enumerate(packs)])
    fields = [(f"f{j}", CTYPES[p]) for j, p in enumerate(packs)]
    struct_type = type("Params", (ctypes.Structure,), {"_fields_": fields})
    assert arguments.offsets == [getattr(struct_type, name).offset for name, _ in fields]
    params = arguments.fill([VALUES[p] for p in packs])
    pointers = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
    for j, p in enumerate(packs):  # as the sim launcher and the driver read them: *(T*)params[j]
        value = ctypes.cast(pointers[j], ctypes.POINTER(CTYPES[p]))[0]
        assert value == pytest.approx(VALUES[p]) if p in (F32, F64) else value == VALUES[p], (j, p)


def test_refilling_rewrites_every_value():
    arguments = ArgumentBuffer([param(None, 0), param(F32, 1), param(I64, 2)])
    arguments.fill([1, 2.0, 3])
    params = arguments.fill([4096, -0.5, 7])
    pointers = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
    assert ctypes.cast(pointers[0], ctypes.POINTER(ctypes.c_void_p))[0] == 4096
    assert ctypes.cast(pointers[1], ctypes.POINTER(ctypes.c_float))[0] == -0.5
    assert ctypes.cast(pointers[2], ctypes.POINTER(ctypes.c_int64))[0] == 7
