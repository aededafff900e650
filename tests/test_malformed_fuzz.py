"""The malformed-input fuzz (unit tier), CI-sized: a few hundred token-level
mutations of the example and test programs each check (and compile and run on
the reference) or fail with a located FzError that shows nothing of Python's
insides. The long run is `python tests/malformed_fuzz.py 20000`."""
import pytest
from malformed_fuzz import INTERNALS, campaign, classify


@pytest.mark.parametrize("seed", [11, 12])
def test_mutated_programs_succeed_or_fail_with_a_located_error(seed):
    figures = campaign(400, seed)
    assert figures["failures"] == []
    assert figures["accepted"] > 0 and figures["check error"] > 0 and figures["parse error"] > 0


@pytest.mark.parametrize("text,status", [
    ("pipeline p(x: f32[n]) -> (y: f32[n]) { y = x; }", "accepted"),
    ("pipeline p(x: f32[n]) -> (y: f32[n]) { y = x >> 1; }", "parse error"),
    ("pipeline p(x: f32[n]) -> (y: f32[n]) { y = q; }", "check error"),
])
def test_the_classifier_tells_the_outcomes_apart(text, status):
    assert classify(text) == (status, None)


def test_the_classifier_catches_an_unlocated_error_or_one_that_shows_internals(monkeypatch):
    import malformed_fuzz

    from fusec.errors import Diagnostic, FzError, Loc

    def fails(message, loc):
        def check(module, source):
            raise FzError(Diagnostic(loc, message), source)
        return check
    monkeypatch.setattr(malformed_fuzz, "check_program", fails("no location", Loc()))
    assert classify("pipeline p() {}")[0] == "failure"
    monkeypatch.setattr(malformed_fuzz, "check_program", fails("'NoneType' object has no attribute", Loc(1, 1)))
    assert classify("pipeline p() {}")[0] == "failure"
    monkeypatch.setattr(malformed_fuzz, "check_program", lambda module, source: {}["x"])
    assert classify("pipeline p() {}") == ("failure", "check: KeyError: 'x'")
    assert "Traceback" in INTERNALS
