"""Recomputing a producer in its readers instead of storing it (passes.recompute):
the cost model's choice on a cheap and an expensive broadcast producer and on a
temporary shared across a split, and the cases it must leave alone."""
import pytest

from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import Source
from fusec.frontend import check_source
from fusec.passes.fusion import Best, best_partition
from fusec.passes.lower import lower
from fusec.passes.recompute import recompute, substitute


def compiled(text: str, **options):
    program = check_source(Source("<test>", text))
    return compile_pipeline(program, program.pipelines[0].name, CompileOptions(**options))


def notes(c) -> dict[str, str]:
    return {d.stage: d.reason for d in c.partition.decisions if d.kernel < 0}


COLUMN = "pipeline p(x: f32[rows, cols], w: f32[cols], b: f32[cols]) -> (y: f32[rows, cols]) {{\n" \
         "    s = {s};\n    y = x * s + s;\n}}\n"
CHEAP = "w * 2.0 + b"
COSTLY = "exp(sin(w) * tanh(b)) / (1.0 + pow(w, b) + atan2(w, b) + erf(w) * log1p(b * b) + cosh(w))"


def test_a_cheap_broadcast_producer_is_recomputed_in_its_reader():
    c = compiled(COLUMN.format(s=CHEAP))
    (launch,) = c.interface.kernels
    assert launch.kernel.stages == ("y",) and {a.buffer for a in launch.kernel.loads} == {"x", "w", "b"}
    assert notes(c)["s"].startswith("recomputed in y (2 ops an element) instead of stored")
    assert len(compiled(COLUMN.format(s=CHEAP), fuse="none").interface.kernels) == 2  # the unfused form keeps it


def test_an_expensive_broadcast_producer_is_stored():
    c = compiled(COLUMN.format(s=COSTLY))
    assert [k.kernel.stages for k in c.interface.kernels] == [("s",), ("y",)]
    assert notes(c)["s"].startswith("stored, not recomputed in y")


def test_the_choice_follows_the_prediction():
    """Recomputing wins by the launch it saves, and loses by the arithmetic it repeats per element."""
    for s, recomputed in ((CHEAP, True), (COSTLY, False)):
        program = check_source(Source("<test>", COLUMN.format(s=s)))
        graph = lower(program, program.pipelines[0])
        kept, rewritten = best_partition(graph).us, best_partition(substitute(graph, 0)).us
        assert (rewritten < kept) == recomputed, (s, kept, rewritten)
        assert len(compiled(COLUMN.format(s=s)).interface.kernels) == (1 if recomputed else 2)


SHARED = """pipeline wide(a: f32[n], b: f32[n], x0: f32[n], x1: f32[n], x2: f32[n], x3: f32[n], x4: f32[n], x5: f32[n])
    -> ({outs}) {{
    t = a * b;
{body}
}}
"""


def shared_temporary(outputs: int, fn: str = "sin") -> str:
    outs = ", ".join(f"y{j}: f32[n]" for j in range(outputs))
    body = "\n".join(f"    y{j} = tanh(" + " + ".join(f"{fn}(x{i} * t * {0.1 + 0.01 * (i + j):.2f})" for i in range(6))
                     + ");" for j in range(outputs))
    return SHARED.format(outs=outs, body=body)


def test_a_temporary_read_across_a_split_is_recomputed_not_stored():
    """Memory-bound kernels: storing t and reading it back costs more than its multiply."""
    c = compiled(shared_temporary(48, fn=""))
    assert len(c.interface.kernels) > 1  # wide enough that the model splits it
    assert "t" not in {a.buffer for k in c.interface.kernels for a, _ in k.kernel.stores}
    assert notes(c)["t"].startswith("recomputed in y0, y1,")


def test_a_temporary_beside_compute_bound_kernels_is_stored():
    """Compute-bound kernels hide its store and load under their arithmetic: recomputing
    it would only add arithmetic."""
    c = compiled(shared_temporary(24))
    assert len(c.interface.kernels) > 1 and all(k.prediction.bound == "compute" for k in c.interface.kernels)
    assert notes(c)["t"].startswith("stored, not recomputed in y0, y1,")


def test_one_kernel_needs_no_recompute():
    c = compiled(shared_temporary(2))
    assert len(c.interface.kernels) == 1 and "t" not in notes(c)


UNSAFE = [
    ("pipeline p(x: f32[rows, cols], w: f32[cols]) -> (y: f32[rows, cols], s: f32[cols]) {\n"
     "    s = w * 2.0;\n    y = x * s;\n}\n", "a result is stored anyway"),
    ("pipeline p(x: f32[rows, cols], inout w: f32[cols]) -> (y: f32[rows, cols]) {\n"
     "    s = w * 2.0;\n    w = w + 1.0;\n    y = x * s;\n}\n", "w is overwritten before y reads s"),
    ("pipeline p(x: f32[rows, cols], w: f32[cols], k: i32) -> (y: f32[rows, cols]) {\n"
     "    s = w * 2.0;\n    y = x;\n    repeat k {\n        y = y * s;\n    }\n}\n", "read inside a loop"),
    ("pipeline p(x: f32[n], k: i32) -> (y: f32[n]) {\n"
     "    y = x;\n    repeat k {\n        s = y * 2.0;\n        y = s + y;\n    }\n}\n", "inside a loop"),
]


@pytest.mark.parametrize("text, why", UNSAFE, ids=[w for _, w in UNSAFE])
def test_what_may_not_be_recomputed_is_left_alone(text, why):
    """Even where the model would always prefer recomputing (fewer stages: faster)."""
    program = check_source(Source("<test>", text))
    graph = lower(program, program.pipelines[0])
    everything = frozenset(v.name for v in graph.values)
    rewritten, decisions = recompute(graph, lambda g: Best(float(len(g.stages)), everything, frozenset()))
    assert [s.name for s in rewritten.stages] == [s.name for s in graph.stages], why
    assert not any(d.merged for d in decisions), why


def test_with_a_model_that_always_recomputes_every_safe_producer_goes():
    program = check_source(Source("<test>", "pipeline p(a: f32[n], w: f32[m, n]) -> (y: f32[m, n]) {\n"
                                            "    s = a * 2.0;\n    t = s + a;\n    y = w * t + s;\n}\n"))
    graph = lower(program, program.pipelines[0])
    everything = frozenset(v.name for v in graph.values)
    rewritten, decisions = recompute(graph, lambda g: Best(float(len(g.stages)), everything, frozenset()))
    assert [s.name for s in rewritten.stages] == ["y"]
    assert [(d.stage, d.merged) for d in decisions] == [("s", True), ("t", True)]


def test_fuse_all_and_none_do_not_recompute():
    for fuse in ("all", "none"):
        c = compiled(COLUMN.format(s=CHEAP), fuse=fuse)
        assert any(k.kernel.stages == ("s",) for k in c.interface.kernels) and not notes(c), fuse
