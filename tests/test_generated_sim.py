"""Generated programs (`generator.py`) on the sim: every form against the others and the reference.

Each valid program is compiled fused, unfused and persistent, run with the same arguments at each
size profile (every dim its own size; the innermost beyond one 256-thread block and not a multiple
of the vector width; size-1 dims), every array placed between guard zones. The three forms must
agree bit for bit (the same arithmetic in the same order), and with the reference: integers and
bools exactly, floats within each output's tolerance in ulps (`generator.py`: 0 where no math
function is involved), ill-conditioned elements excused by the program's shadows (`helpers.py`).

A g++ build costs about a second a form (mostly the CUDA fp16 headers), so the modules are built
ahead, two at a time, before the tests run them. FUSEC_GEN_SEED and FUSEC_GEN_SIM_COUNT (default
50) pick the seeds; they are disjoint from the unit tier's.
"""
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from generator import generate
from helpers import SIM_FORMS, check_generated, check_generated_sim

import fusec
from fusec.runtime.backends.sim import SimBackend

pytestmark = pytest.mark.sim

SEED = int(os.environ.get("FUSEC_GEN_SEED", "0")) + 1_000_000
COUNT = int(os.environ.get("FUSEC_GEN_SIM_COUNT", "50"))
SEEDS = range(SEED, SEED + COUNT)


def sim_forms(program) -> dict:
    return {form: fusec.jit(program.source, backend="sim", pipeline=program.pipeline, **options)
            for form, options in SIM_FORMS.items()}


@pytest.fixture(scope="module")
def built() -> dict:
    """Every module of every program built into the disk cache ahead, in parallel (g++ runs in its own
    process; identical modules are built once). Anything that fails here is left for its test to report."""
    forms, modules = {}, {}
    for seed in SEEDS:
        try:
            forms[seed] = sim_forms(generate(seed, invalid=0, nested=0))
            for pipeline in forms[seed].values():
                modules.setdefault(pipeline.cuda_source, pipeline.compiled)
        except Exception:
            continue

    def build(compiled):
        try:
            SimBackend(compiled)
        except Exception:
            pass
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(build, modules.values()))
    return forms


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_program_on_the_sim(seed, built):
    program = generate(seed, invalid=0, nested=0)  # valid, and compilable: no repeat inside a repeat
    checked = check_generated(program)
    check_generated_sim(program, checked, built.get(seed) or sim_forms(program))
