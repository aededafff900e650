"""Hostile input through the real command line: never a traceback, always
exit 1 with a located error (or a clear message), and quickly."""
import subprocess
import sys
import time

import pytest
from helpers import ROOT

VALID = ("stage scale(x: f32, s: f32) -> f32 { return x * s; }\n"
         "pipeline p(x: f32[n], s: f32) -> (y: f32[n]) { y = scale(x, s); }\n")


def fusec(*args, timeout=30):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fusec", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    return proc, time.monotonic() - start


BAD = {
    "binary_garbage": bytes(range(256)) * 64,
    "empty": b"",
    "not_utf8": b"pipeline p(x: f32[n]) -> (y: f32[n]) {\n    y = x \xff\xfe;\n}\n",
    "nested_3000_calls": b"pipeline p(x: f32[n]) -> (y: f32[n]) { y = " + b"exp(" * 3000 + b"x" + b")" * 3000 + b"; }",
    "sum_20000_terms": b"pipeline p(x: f32[n]) -> (y: f32[n]) { y = " + b" + ".join([b"x"] * 20000) + b"; }",
    "unknown_characters": "pipeline p(x: f32[n]) -> (y: f32[n]) { y = x ∑ 2; }".encode(),
    "nul_in_middle": VALID.encode()[:40] + b"\x00" + VALID.encode()[40:],
    "megabyte_of_garbage_statements": VALID.encode() + b"pipeline q(x: f32[n]) -> (y: f32[n]) {\n"
                                      + b"    y = x * 2.0 $\n" * 60000 + b"}\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_gets_a_located_error(tmp_path, name):
    path = tmp_path / "bad.fz"
    path.write_bytes(BAD[name])
    proc, seconds = fusec("check", str(path))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "fusec/" not in proc.stderr
    assert proc.stderr.startswith(f"{path}:"), proc.stderr[:300]
    assert " error: " in proc.stderr
    assert seconds < 10


def test_3000_nested_parentheses_are_fine(tmp_path):
    """Parentheses add no depth to the tree, so this program is valid."""
    path = tmp_path / "parens.fz"
    path.write_bytes(b"pipeline p(x: f32[n]) -> (y: f32[n]) { y = " + b"(" * 3000 + b"x" + b")" * 3000 + b"; }")
    proc, seconds = fusec("check", str(path))
    assert proc.returncode == 0, proc.stderr
    assert seconds < 10


def test_megabyte_valid_program_is_checked_quickly(tmp_path):
    stages = "".join(f"stage s{i}(x: f32, s: f32) -> f32 {{ let t = x * s + {i}.0; return max(t, 0.0); }}\n"
                     for i in range(12500))
    path = tmp_path / "big.fz"
    path.write_text(stages + "pipeline p(x: f32[n], s: f32) -> (y: f32[n]) { y = s1(s0(x, s), s); }\n")
    assert path.stat().st_size > 1_000_000
    proc, seconds = fusec("check", str(path), timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert seconds < 60


def test_missing_file_is_a_clear_message(tmp_path):
    proc, _ = fusec("check", str(tmp_path / "nope.fz"))
    assert proc.returncode == 1
    assert "cannot read file" in proc.stderr and "Traceback" not in proc.stderr


def test_usage_error_exits_2():
    proc, _ = fusec("frobnicate")
    assert proc.returncode == 2
    proc, _ = fusec("check")
    assert proc.returncode == 2
