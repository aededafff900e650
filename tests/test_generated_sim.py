"""Generated programs (`generator.py`) on the sim: every form against the others and the reference.

Each valid program is compiled fused, unfused and persistent, run with the same arguments at each
size profile (every dim its own size; the innermost beyond one 256-thread block, or a multiple of
the vector width; size-1 dims), every array placed between guard zones. The three forms must agree
bit for bit (the same arithmetic in the same order), and with the reference: integers and bools
exactly, floats within each output's tolerance in ulps (`generator.py`: 0 where no math function
is involved), ill-conditioned elements excused by the program's shadows (`helpers.py`).

The programs run in worker processes, one per core (a g++ build costs about half a second a form,
and two build at once), with glibc's heap checks on: a stray write that the guard zones miss (into
a buffer the runtime allocated) kills its worker, and fails its seed, rather than the test session.
FUSEC_GEN_SEED and FUSEC_GEN_SIM_COUNT (default 50) pick the seeds, disjoint from the unit tier's;
`python -c "import helpers; print(helpers.check_seed(SEED, ('front end', 'sim'), valid_only=True))"`
from tests/ runs one in-process.
"""
import os

import pytest
from helpers import check_seeds_isolated

pytestmark = pytest.mark.sim

SEED = int(os.environ.get("FUSEC_GEN_SEED", "0")) + 1_000_000
COUNT = int(os.environ.get("FUSEC_GEN_SIM_COUNT", "50"))
SEEDS = range(SEED, SEED + COUNT)


@pytest.fixture(scope="module")
def records(request) -> dict:
    """The checks of every selected seed, run once for the module."""
    selected = [item.callspec.params["seed"] for item in request.session.items
                if item.originalname == "test_generated_program_on_the_sim"]
    seeds = SEEDS if len(selected) == len(SEEDS) else selected
    found = check_seeds_isolated(seeds, jobs=min(os.cpu_count() or 2, len(seeds)), valid_only=True)
    return {record["seed"]: record for record in found}


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_program_on_the_sim(seed, records):
    failures = records[seed]["failures"]
    assert not failures, "\n".join(f"seed {seed}, {check}: {message}" for check, message in failures.items())
