"""Backward pipelines derived from the source, run on the sim (the emitted CUDA C of
the forward and of the derived backward, on the CPU): the checks of tests/test_grad.py
that run a backend, on this one. torch.autograd.gradcheck in f64 of every
differentiable example, of every differentiable builtin and of random differentiable
pipelines (hypothesis, fewer examples: each compiles two modules with g++); PyTorch's
zero gradients; both save-or-recompute forms; traced functions as ops; and the gpu
tier's check of every example's gradients in f32 and bf16 against torch autograd
(tests/grad_compare.py), at small sizes. Sim tier."""
import pytest
from grad_compare import compare_example
from helpers import ROOT
from hypothesis import HealthCheck, given, settings
from test_grad import (
    BUILTIN_CASES,
    COUNTED,
    DIFFERENTIABLE,
    FORMS,
    both_forms_check,
    broadcast_check,
    builtin_gradcheck,
    counted_check,
    differentiable_pipelines,
    differentiable_row_pipelines,
    example_gradcheck,
    gradcheck,
    one_tensor_check,
    row_pick_check,
    summed_loss_check,
    traced_gradcheck,
    zero_gradients_check,
)

import fusec

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.sim


@pytest.mark.parametrize("example", DIFFERENTIABLE)
def test_every_differentiable_example_passes_gradcheck_on_the_sim(example):
    example_gradcheck(example, "sim")


@pytest.mark.parametrize("expression", BUILTIN_CASES)
def test_the_derivative_of_every_builtin_on_the_sim(expression):
    builtin_gradcheck(expression, "sim")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(differentiable_pipelines())
def test_random_differentiable_pipelines_pass_gradcheck_on_the_sim(text):
    gradcheck(text, "p", {"n": 5}, "sim")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(differentiable_row_pipelines())
def test_random_differentiable_row_pipelines_pass_gradcheck_on_the_sim(text):
    gradcheck(text, "p", {"r": 3, "c": 4}, "sim")


def test_pytorchs_zero_gradients_on_the_sim():
    zero_gradients_check("sim")


def test_row_pick_passes_its_gradient_to_the_element_it_picks_on_the_sim():
    row_pick_check("sim")


def test_parameters_broadcast_over_leading_dims_get_column_sums_on_the_sim():
    broadcast_check("sim")


@pytest.mark.parametrize("text", COUNTED)
def test_an_adjoint_constant_along_a_sum_is_counted_on_the_sim(text):
    counted_check(text, "sim")


@pytest.mark.parametrize("pipeline,reference", FORMS)
def test_both_forms_give_torchs_gradients_on_the_sim(pipeline, reference):
    both_forms_check("sim", pipeline, reference)


def test_a_traced_function_op_passes_gradcheck_on_the_sim():
    traced_gradcheck("sim")


def test_a_loss_summed_over_an_ops_output_backpropagates_on_the_sim():
    summed_loss_check("sim")


def test_a_traced_op_of_one_tensor_and_scalars_backpropagates_on_the_sim():
    one_tensor_check("sim")


def test_the_backward_runs_on_the_sim_and_trains_like_torch():
    """f32, the op's default backend (the sim) for CPU tensors."""
    op = fusec.torch_op(str(ROOT / "examples/softmax.fz"), name="grad_sim_test::softmax", pipeline="softmax")
    x = torch.randn(4, 33, requires_grad=True)
    weights = torch.randn(4, 33)
    (op(x) * weights).sum().backward()
    twin = x.detach().clone().requires_grad_()
    (torch.softmax(twin, -1) * weights).sum().backward()
    torch.testing.assert_close(x.grad, twin.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("example", DIFFERENTIABLE)
def test_gradients_match_torch_autograd_in_f32_and_bf16_on_the_sim(example, dtype):
    """tests/test_grad_gpu.py's check on CPU tensors: rows of 67 (no whole 16-byte vectors)."""
    dims = {"n": 1001, "rows": 5, "cols": 67, "tokens": 5, "hidden": 67, "vocab": 67, "cells": 101}
    found = compare_example(torch, example, dtype, "cpu", dims)
    assert found and all(c.ok for c in found), "\n".join(c.line() for c in found if not c.ok)
