"""Kernel counts and fusion decisions: what fuses, what must not, and why."""
import json

import pytest
from helpers import EXAMPLES, ROOT, load_program, pipelines

from fusec.compiler import CompileOptions, compile_pipeline
from fusec.ir.launch import ColumnReduce, Elementwise, RegisterLoop, block_threads
from fusec.ir.program import walk_applies

PIPELINES = pipelines()


def kernels(c):
    return [launch.kernel for launch in c.interface.kernels]


def compiled(path, name=None, **options):
    program = load_program(ROOT / path)
    return compile_pipeline(program, name or program.pipelines[0].name, CompileOptions(**options))


@pytest.mark.parametrize("ident,program,name", PIPELINES, ids=[p[0] for p in PIPELINES])
def test_unfused_form_has_one_kernel_per_statement(ident, program, name):
    # ... but a scalar-only statement, which lowering inlines into its readers (passes.lower)
    c = compile_pipeline(program, name, CompileOptions(fuse=False))
    statements = list(walk_applies(program.pipeline(name).body))
    assert len(kernels(c)) == len(c.graph.stages) <= len(statements)
    assert len(c.graph.stages) == sum(1 for s in statements if s.shape != ()) + \
        sum(1 for s in c.graph.stages if s.shape == ())
    assert all(len(k.stages) == 1 for k in kernels(c))


def test_seed_chain_fuses_to_one_kernel_keeping_intermediates_in_registers():
    c = compiled("examples/scale_bias_relu.fz")
    (kernel,) = kernels(c)
    assert kernel.stages == ("scale", "bias", "relu")
    assert [a.buffer for a in kernel.loads] == ["x"] and [a.buffer for a, _ in kernel.stores] == ["y"]
    assert " t[" not in c.cuda and " u[" not in c.cuda and "float* __restrict__ t" not in c.cuda


def test_every_example_fuses_to_one_kernel():
    for path in EXAMPLES:
        if path.stem == "fusion_hurts":  # the example where one kernel is slower (test_decisions)
            continue
        c = compiled(path.relative_to(ROOT))
        if path.stem == "cross_entropy":  # the losses in one row kernel; their mean from column sums after it
            row, tail = kernels(c)
            assert row.stages == ("row_logsumexp", "row_pick", "loss")
            assert [a.buffer for a in row.loads] == ["logits", "label"]
            assert "logits" not in [a.buffer for a in tail.loads] and tail.stages[-1] == "mean"
            continue
        assert len(kernels(c)) == 1, path.name


def test_different_iteration_spaces_do_not_fuse():
    # --fuse all: the cost model's choice recomputes the cheap w2 in y instead (test_recompute.py)
    c = compiled("tests/programs/shapes.fz", "colscale", fuse="all")
    assert [k.stages for k in kernels(c)] == [("w2",), ("y",)]
    assert "iteration space [rows, cols] differs from [cols]" in kernels(c)[1].decisions[0].reason
    # w2 crosses kernels, so it is written by one and read (broadcast) by the other.
    assert [a.buffer for a, _ in kernels(c)[0].stores] == ["w2"]
    assert not kernels(c)[1].loads[1].contiguous


def test_sibling_stages_fuse_across_an_independent_kernel():
    c = compiled("tests/programs/shapes.fz", "siblings")
    assert [k.stages for k in kernels(c)] == [("p", "r"), ("q",)]
    assert any("sibling: shares input a" in d.reason for d in kernels(c)[0].decisions)


def test_intermediate_used_by_another_kernel_is_still_written():
    c = compiled("tests/programs/shapes.fz", "reassign")
    (kernel,) = kernels(c)
    # t, t.1 and h.1 stay in registers; the outputs y and the last h are written.
    assert sorted(a.value for a, _ in kernel.stores) == ["h.v2", "y"]


def test_dead_temporary_is_not_computed_when_fused():
    c = compiled("tests/programs/shapes.fz", "dead_temp")
    assert "expf" not in c.cuda
    assert "expf" in compiled("tests/programs/shapes.fz", "dead_temp", fuse=False).cuda


def test_register_budget_splits_a_chain():
    c = compiled("examples/transcendental_chain.fz", max_regs=16)
    assert len(kernels(c)) > 1
    refusals = [d.reason for k in kernels(c) for d in k.decisions if "budget 16" in d.reason]
    assert refusals and all("registers > budget 16" in r for r in refusals)
    for launch in c.interface.kernels:
        assert launch.variants[-1].est_regs <= 16 or len(launch.kernel.stages) == 1


def test_unfused_and_fused_kernel_names_are_deterministic():
    a = compiled("examples/dag.fz").cuda
    assert a == compiled("examples/dag.fz").cuda
    assert "extern \"C\" __global__ void dag_k0(" in a
    assert "dag_k1_sum_sq" in compiled("examples/dag.fz", fuse=False).cuda


def test_names_that_collide_with_c_words_are_mangled():
    cuda = compiled("tests/programs/collisions.fz").cuda
    assert "double_[" in cuda and "fz_div_[" in cuda and "float* __restrict__ double_" in cuda
    assert "const long long i_ =" in cuda  # the user's `i` keeps its name; the index moves aside


def test_cli_compile_writes_file_and_report(tmp_path, run_cli):
    out = tmp_path / "sbr.cu"
    code, stdout, stderr = run_cli("compile", str(ROOT / "examples/scale_bias_relu.fz"), "-o", str(out), "--report")
    assert code == 0 and stdout == ""
    assert "__global__ void scale_bias_relu_k0(" in out.read_text()
    assert "24 B/element unfused (3.00x less)" in stderr and "fused into k0 (vertical" in stderr


def test_cli_emit_report_json_fields(run_cli):
    code, stdout, _ = run_cli("compile", str(ROOT / "examples/scale_bias_relu.fz"), "--emit", "report")
    (kernel,) = json.loads(stdout)
    assert kernel["name"] == "scale_bias_relu_k0" and kernel["stages"] == ["scale", "bias", "relu"]
    assert kernel["bytes_read"] == 4 and kernel["bytes_written"] == 4 and kernel["est_regs"] > 0
    assert len(kernel["fusion"]) == 4 and kernel["fusion"][0].startswith("partition: ")
    code, stdout, _ = run_cli("compile", str(ROOT / "examples/scale_bias_relu.fz"), "--emit", "report", "--unfused")
    assert [k["bytes_read"] + k["bytes_written"] for k in json.loads(stdout)] == [8, 8, 8]


def test_cli_emit_ir_and_pipeline_selection(run_cli):
    code, stdout, _ = run_cli("compile", str(ROOT / "tests/programs/shapes.fz"), "--emit", "ir", "--pipeline",
                              "colscale", "--fuse", "all")
    assert code == 0 and "stage w2 over [cols]" in stdout and "kernel colscale_k1_y: y" in stdout
    assert "scalar_temp" not in stdout


def test_cli_compile_errors(run_cli):
    code, _, err = run_cli("compile", str(ROOT / "examples/dag.fz"), "--pipeline", "nope")
    assert code == 1 and "no pipeline named 'nope'" in err
    code, _, err = run_cli("compile", str(ROOT / "examples/dag.fz"), "--max-regs", "7")
    assert code == 2
    code, _, err = run_cli("compile", str(ROOT / "examples/dag.fz"), "--emit", "ptx")
    assert code == 2


def test_bench_without_a_gpu_says_so(run_cli, monkeypatch):
    import fusec.runtime.backends.cuda as cuda
    monkeypatch.setattr(cuda, "available", lambda: False)
    code, out, err = run_cli("bench", str(ROOT / "examples/scale_bias_relu.fz"))
    assert code == 2 and "needs a CUDA device" in err and "Traceback" not in err
    code, _, err = run_cli("bench", str(ROOT / "examples/scale_bias_relu.fz"), "--sizes", "2^x")
    assert code == 2 and "expected a size" in err


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_dtype_of_a_program_of_two_float_types_is_a_usage_error_before_the_device(run_cli, command):
    # examples/add_rmsnorm.fz reads bf16 and accumulates in f32: one type cannot replace both
    code, _, err = run_cli(command, str(ROOT / "examples/add_rmsnorm.fz"), "--dtype", "f32")
    assert code == 2 and "Traceback" not in err and "internal error" not in err
    assert f"fusec {command}: --dtype f32:" in err and "(bf16, f32)" in err and "leave it out" in err


def test_bench_retypes_a_program():
    from fusec.bench.harness import dims_for, retype
    program = retype((ROOT / "examples/bias_gelu.fz").read_text(), "bf16", "bias_gelu")
    assert {s.type.name for s in program.pipelines[0].slots} == {"bf16"}
    assert dims_for(program.pipelines[0], 2 ** 20) == {"rows": 256, "cols": 4096}



def test_bench_rows_and_minimum_traffic():
    from fusec.bench.harness import dims_for, minimum_bytes
    program = load_program(ROOT / "examples/cross_entropy.fz")
    pipeline = program.pipeline("cross_entropy_bf16")
    dims = dims_for(pipeline, 2 ** 20, row_length=2 ** 15)
    assert dims == {"rows": 32, "vocab": 2 ** 15}
    assert minimum_bytes(pipeline, dims) == 2 ** 20 * 2 + 32 * 8 + 32 * 4 + 4  # logits, labels, losses, mean
    adam = load_program(ROOT / "examples/adam.fz").pipelines[0]
    assert minimum_bytes(adam, {"n": 10}) == 10 * 4 * (2 + 1 + 2 + 2)  # param, m, v in and out; grad in


def test_nested_repeat_is_checked_but_not_yet_compiled(tmp_path, run_cli):
    path = tmp_path / "r.fz"
    path.write_text("pipeline p(x: f32[n], k: i32) -> (y: f32[n]) {\n    y = x;\n"
                    "    repeat k { repeat 2 { y = y * 0.5; } }\n}\n")
    assert run_cli("check", str(path))[0] == 0
    code, _, err = run_cli("compile", str(path))
    assert code == 1 and f"{path}:3:5: error: code generation for a 'repeat' inside a 'repeat'" in err


def test_repeat_fuses_to_one_persistent_kernel_or_repeats_launches():
    c = compiled("examples/time_step.fz")
    (kernel,) = kernels(c)
    assert c.interface.kernels[0].form == RegisterLoop(100) and len(kernel.carried) == 2 and c.interface.steps == (0,)
    assert "for (long long it = 0; it < count; ++it)" in c.cuda and "gridDim.x * blockDim.x" in c.cuda
    unfused = compiled("examples/time_step.fz", fuse=False)
    assert len(kernels(unfused)) == 2 and unfused.interface.steps[0].count == 100
    two = compiled("tests/programs/repeat.fz", "two_spaces")  # [cols] and [rows, cols]: no persistent kernel
    assert [k.form for k in two.interface.kernels] == [Elementwise(), Elementwise()]
    assert two.interface.steps[0].kernels == (0, 1)
    assert any("launched k times" in d.reason for k in kernels(two) for d in k.decisions)


def test_cli_persistent_form(run_cli):
    code, out, _ = run_cli("compile", str(ROOT / "examples/scale_bias_relu.fz"), "--persistent")
    assert code == 0 and "i += (long long)gridDim.x * blockDim.x" in out and "_v4(" not in out


def _program(text):
    from fusec.errors import Source
    from fusec.frontend import check_source
    return check_source(Source("<test>", text))


def test_a_statement_nobody_reads_is_dropped_from_the_fused_form():
    program = _program("pipeline p(x: f32[n]) -> (y: f32[n]) {\n  t = exp(x);\n  d = t * 2.0;\n  y = x + 1.0;\n}")
    fused = compile_pipeline(program, "p")
    assert [k.stages for k in kernels(fused)] == [("y",)]
    assert [d.reason for d in fused.partition.decisions if d.kernel == -1] == \
        ["dropped: nothing the pipeline returns reads it"] * 2
    assert len(kernels(compile_pipeline(program, "p", CompileOptions(fuse=False)))) == 3


def test_a_pipeline_with_no_outputs_compiles_to_no_kernels():
    program = _program("pipeline p(x: f32[n]) {\n  t = x * 2.0;\n}")
    assert kernels(compile_pipeline(program, "p")) == []
    assert "0 kernels" in compile_pipeline(program, "p").cuda


def test_a_loop_whose_values_nobody_reads_is_dropped():
    program = _program("pipeline p(x: f32[n], k: i32) -> (y: f32[n]) {\n  t = x;\n"
                       "  repeat k { t = t * 2.0; }\n  y = x + 1.0;\n}")
    assert [k.stages for k in kernels(compile_pipeline(program, "p"))] == [("y",)]


def test_the_reasons_a_column_sum_stays_apart_say_what_it_is():
    """A column sum's partial sums of per-row values, and each finish over partial sums,
    are kernels of their own: the report says so, not that equal spaces differ."""
    c = compile_pipeline(load_program(ROOT / "examples/cross_entropy.fz"), "cross_entropy")
    reasons = " ".join(d.reason for d in c.partition.decisions)
    assert "col_partial sums values of [rows, 1] over the rows: a row kernel takes column sums only" in reasons
    assert "[128, 1] differs from [128, 1]" not in reasons
    # a finish over partial sums of several columns is still a kernel of its own
    c = compile_pipeline(load_program(ROOT / "tests/programs/columns.fz"), "column_f64")
    reasons = " ".join(d.reason for d in c.partition.decisions)
    assert "col_sum finishes a column sum over its partial sums: a kernel of its own" in reasons


def test_a_total_over_the_rows_is_one_kernel_with_what_reads_it():
    """Cross-entropy's tail: the column sums of one column over the same rows (the
    losses and the count), their finishes and the mean's division: one kernel of
    one block (a thread a run of rows), not a partials kernel, two finishes and a division."""
    c = compile_pipeline(load_program(ROOT / "examples/cross_entropy.fz"), "cross_entropy")
    row, tail = kernels(c)
    assert tail.stages == ("col_partial", "col_sum", "col_partial_2", "col_sum_2", "mean")
    assert [a.buffer for a, _ in tail.stores] == ["mean"]  # no partial sums in memory
    (launch,) = [k for k in c.interface.kernels if k.kernel.name == tail.name]
    assert launch.form == ColumnReduce(128, total=True)
    assert [block_threads(v, 256) for v in launch.variants] == [128]
    # sums of several columns still take a partials kernel and a finish
    wide = compile_pipeline(load_program(ROOT / "tests/programs/columns.fz"), "bias_relu_grads")
    assert [len(k.stages) for k in kernels(wide)][-1:] == [1] and not any(k.total for k in kernels(wide))
