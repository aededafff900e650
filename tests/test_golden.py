"""Golden files: the emitted CUDA of every example, fused and unfused, byte for byte.

Regenerate on purpose with `pytest tests/test_golden.py --force-regen`, and
read the diff before committing it."""
import pytest
from helpers import EXAMPLES, ROOT, compiled, load_program

from fusec.compiler import CompileOptions


@pytest.mark.parametrize("form", ["fused", "unfused"])
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_emitted_cuda_matches_golden(file_regression, path, form):
    program = load_program(path)
    text = "\n".join(compiled(program, p.name, CompileOptions(fuse=form == "fused")).cuda
                     for p in program.pipelines)
    file_regression.check(text, fullpath=ROOT / "tests" / "golden" / f"{path.stem}.{form}.cu")
