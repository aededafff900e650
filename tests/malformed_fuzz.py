"""A malformed-input fuzzer for the front end: token-level mutations of the
example and test programs.

Every input must either check (and then lower, compile fused and unfused, and
run on the reference) or fail with an `FzError` whose every diagnostic is
located (`FILE:LINE:COL: error: ...`) and whose text holds nothing of Python's
insides. `tests/test_malformed_fuzz.py` runs a CI-sized sample; for a long run:

    python tests/malformed_fuzz.py 20000 [SEED]
"""
from __future__ import annotations

import random
import re
import sys

import numpy as np
from helpers import PROGRAMS

from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import ArgumentError, FzError, Source
from fusec.frontend.check import check_program
from fusec.frontend.parser import parse
from fusec.ir.program import Repeat
from fusec.reference import run

TOKEN = re.compile(r"\s+|#[^\n]*|//[^\n]*|0[xX][0-9a-fA-F]+|\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?"
                   r"|\d+(?:[eE][+-]?\d+)?|[A-Za-z_]\w*|\*\*|&&|\|\||[<>=!]=|->|.", re.S)

# What a mutation may put in: the language's own tokens, what C and Python users
# write that it lacks, and literals at the edges of every type.
VOCABULARY = (
    "stage pipeline let return repeat inout true false pi e inf nan".split()
    + "bool i8 i16 i32 i64 u8 u16 u32 u64 f16 bf16 f32 f64".split()
    + "abs min max clamp sqrt exp tanh sigmoid where isnan pow fma round".split()
    + "sum mean rand if else for while float int const".split()
    + list("(){}[];:,=+-*/%<>!?") + ["->", "**", "&&", "||", "==", "!=", "<=", ">="]
    + [">>", "<<", "^", "&", "|", "~", "+=", "*=", "++", "=>", ":=", "@", "$", "\\", "\"", "'", "`"]
    + ["0", "1", "-1", "2", "255", "256", "-129", "65504.0", "65520.0", "70000.0", "3.4028235e38", "1e39",
       "1e308", "1e309", "1e-400", "0.1", "-0.0", "0x7fffffffffffffff", "0x8000000000000000",
       "18446744073709551616", "9223372036854775807", "00", "010", "1.", ".5", "1e", "1" * 60]
    + ["\n", "\t", "\u00e9", "\u00d7", "\x00", "\ufeff"]
)
MUTATIONS = ("delete", "duplicate", "swap", "replace", "insert", "insert", "replace_same_kind",
             "replace_same_kind", "replace_same_kind")

# Text that would show Python's insides in a message.
INTERNALS = ("Traceback", 'File "', "Error(", "Exception", "<class", "NoneType", "object has no attribute",
             "KeyError", "IndexError", "TypeError", "ValueError", "AttributeError", "lark", ".py", "Token(")
MAX_RUN_REPEAT = 1000  # iterations the reference runs: a literal count of 2^63 - 1 is legal
HEAD = re.compile(r"^fuzz\.fz:\d+:\d+: error: \S")


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def mutate(text: str, rng: random.Random) -> str:
    toks = tokens(text)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        significant = [i for i, t in enumerate(toks) if not t.isspace()] or [0]
        i = rng.choice(significant)
        kind = rng.choice(MUTATIONS)
        if kind == "delete" and toks:
            del toks[i]
        elif kind == "duplicate" and toks:
            toks.insert(i, toks[i])
        elif kind == "swap" and i + 2 < len(toks):
            j = next((k for k in range(i + 1, len(toks)) if not toks[k].isspace()), i)
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "replace_same_kind" and toks:  # keeps the syntax more often: reaches the checker
            pool = [t for t in toks + VOCABULARY if _kind(t) == _kind(toks[i]) and not t.isspace()]
            toks[i] = rng.choice(pool or VOCABULARY)
        elif kind == "replace" and toks:
            toks[i] = rng.choice(VOCABULARY)
        else:
            toks.insert(i, rng.choice(VOCABULARY) + rng.choice(["", " "]))
    return "".join(toks)


def _kind(token: str) -> str:
    if token[:1].isdigit() or token[:1] == ".":
        return "number"
    if token[:1].isalpha() or token[:1] == "_":
        return "name"
    return "punctuation"


def classify(text: str) -> tuple[str, str | None]:
    """("accepted" | "parse error" | "check error", None) where the input behaves
    as documented; ("failure", what went wrong) otherwise."""
    source = Source("fuzz.fz", text)
    for stage in ("parse", "check"):
        try:
            if stage == "parse":
                module = parse(source)
            else:
                program = check_program(module, source)
        except FzError as err:
            found = _bad_error(err)
            return ("failure", found) if found else (f"{stage} error", None)
        except Exception as exc:  # noqa: BLE001 (what the fuzzer looks for)
            return "failure", f"{stage}: {type(exc).__name__}: {exc}"
    for pipeline in program.pipelines:
        for fuse in (True, False):
            try:
                compile_pipeline(program, pipeline.name, CompileOptions(fuse=fuse))
            except FzError as err:  # what the checker accepts but code generation lacks (nested repeat)
                found = _bad_error(err)
                if found:
                    return "failure", found
            except Exception as exc:  # noqa: BLE001
                return "failure", f"compile {pipeline.name} fuse={fuse}: {type(exc).__name__}: {exc}"
        if _longest_repeat(pipeline.body) > MAX_RUN_REPEAT:
            continue  # checked and compiled; too long to interpret
        try:
            run(program, pipeline.name, *_arguments(pipeline))
        except ArgumentError:
            pass  # a count of 0 where a loop must run, a literal dim the arguments miss: the call's fault
        except Exception as exc:  # noqa: BLE001
            return "failure", f"reference {pipeline.name}: {type(exc).__name__}: {exc}"
    return "accepted", None


def _longest_repeat(stmts) -> int:
    """The largest literal repeat count, nested counts multiplied."""
    longest = 0
    for stmt in stmts:
        if isinstance(stmt, Repeat):
            count = stmt.count if isinstance(stmt.count, int) else 2
            longest = max(longest, count * max(1, _longest_repeat(stmt.body)))
    return longest


def _bad_error(err: FzError) -> str | None:
    text = str(err)
    if any(not d.loc for d in err.diagnostics):
        return f"unlocated: {text}"
    heads = [line for line in text.splitlines() if line.startswith("fuzz.fz")]
    if len(heads) != len(err.diagnostics) or not all(HEAD.match(h) for h in heads):
        return f"badly formatted: {text}"
    leaked = [s for s in INTERNALS if any(s in d.message for d in err.diagnostics)]
    return f"internals {leaked}: {text}" if leaked else None


def _arguments(pipeline) -> list:
    """Small arguments: every named dim 3 (a literal dim its value), scalars 2."""
    rng = np.random.default_rng(0)
    args = []
    for p in pipeline.params:
        if p.shape is None:
            args.append(True if p.type.is_bool else 2 if p.type.is_int else 0.5)
            continue
        shape = tuple(d if isinstance(d, int) else 3 for d in p.shape)
        if np.prod(shape, dtype=np.float64) > 1e4:
            shape = tuple(min(d, 2) for d in shape)  # an odd literal dim: the binder will say so
        args.append((rng.standard_normal(shape) * 3).astype(p.type.numpy_dtype))
    return args


def campaign(count: int, seed: int = 0) -> dict:
    """Mutates `count` inputs; returns the figures and the failing inputs."""
    rng = random.Random(seed)
    texts = [path.read_text() for path in PROGRAMS]
    figures = {"inputs": 0, "accepted": 0, "parse error": 0, "check error": 0, "failures": []}
    for _ in range(count):
        text = mutate(rng.choice(texts), rng)
        figures["inputs"] += 1
        status, found = classify(text)
        if status == "failure":
            figures["failures"].append((text, found))
        else:
            figures[status] += 1
    return figures


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    result = campaign(n, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(f"inputs {result['inputs']}: accepted {result['accepted']}, rejected with a located error "
          f"{result['parse error'] + result['check error']} ({result['parse error']} by the parser, "
          f"{result['check error']} by the checker), failures {len(result['failures'])}")
    for text, found in result["failures"][:20]:
        print("----", found[:500], "\n", text[:2000])
