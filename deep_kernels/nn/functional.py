"""Differentiable forms of the reusable MoE pieces (torch.autograd.Function over the kernels):

    topk_gate(logits, ...) -> (weights, indices)   weights differentiable in the logits: topk_gate_backward (the
        scores -> the chosen scores -> the renormalization -> the scaling; the bias and the selection are not
        differentiated, as in DeepSeek-V3); indices are not differentiable.
    swiglu(x, weights=None, pos=None, clamp=None) -> y   y = silu(gate) * up * w (swiglu_forward), differentiable in
        x and in the weights: swiglu_backward. With pos (a row's weight is weights.view(-1)[pos[row]]), each weight
        receives the gradient of the one row that reads it; rows at pos -1 are skipped (y 0 there, no gradient).

The forwards are the public functions (under torch.compile their custom ops, so that dynamo traces forward and
backward with no graph break); the backwards call the backward kernels. Deterministic: no atomics.
"""

import torch

from deep_kernels.moe.gate import topk_gate as _topk_gate_kernel
from deep_kernels.moe.gate import topk_gate_backward
from deep_kernels.quant.swiglu import swiglu_backward, swiglu_forward


class _TopkGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor):
        weights, indices = _topk_gate_kernel(logits, k, scoring, bias, num_groups, topk_groups, renormalize,
                                             routed_scaling_factor)
        ctx.save_for_backward(logits, indices)
        ctx.options = (scoring, renormalize, routed_scaling_factor)
        ctx.mark_non_differentiable(indices)
        return weights, indices

    @staticmethod
    def backward(ctx, grad_weights, grad_indices):
        logits, indices = ctx.saved_tensors
        grad_logits = topk_gate_backward(grad_weights.float().contiguous(), logits, indices, *ctx.options)
        return grad_logits.to(logits.dtype), None, None, None, None, None, None, None


def topk_gate(logits: torch.Tensor, k: int, scoring: str = "softmax", bias: torch.Tensor = None, num_groups: int = 0,
              topk_groups: int = 0, renormalize: bool = True, routed_scaling_factor: float = 1.0):
    """deep_kernels.topk_gate, differentiable in the logits (the module docstring). Same arguments and outputs; the
    logits' gradient has their dtype (computed in FP32)."""
    return _TopkGate.apply(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor)


def scatter_row_gradients(row_gradients: torch.Tensor, pos: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The gradient of weights (any shape) from each row's weight gradient [N] (FP32), row r's weight being
    weights.view(-1)[pos[r]]: every position one row reads gets that row's gradient, the others 0. Positions must
    be distinct where not -1 (each slot of a MoeLayout has one row), so no value depends on an order."""
    dump = weights.numel()  # rows at pos -1 write here, past the weights
    grad = torch.zeros(dump + 1, dtype=torch.float32, device=weights.device)
    grad.index_put_((torch.where(pos >= 0, pos.long(), dump),), row_gradients)
    return grad[:dump].view(weights.shape).to(weights.dtype)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weights, pos, clamp):
        y = swiglu_forward(x, clamp, weights, pos, check_pos=True)
        if pos is not None:
            y.masked_fill_((pos < 0).unsqueeze(1), 0)  # skipped rows: not written by the kernel
        ctx.save_for_backward(x, weights, pos)
        ctx.clamp = clamp
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weights, pos = ctx.saved_tensors
        dx = torch.zeros_like(x)  # skipped rows get no gradient (the kernel leaves them)
        dweights = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
        swiglu_backward(x, dy.to(x.dtype).contiguous(), ctx.clamp, weights, pos, check_pos=False, out=(dx, dweights))
        grad_weights = None
        if weights is not None and ctx.needs_input_grad[1]:
            grad_weights = (dweights.to(weights.dtype).view(weights.shape) if pos is None
                            else scatter_row_gradients(dweights, pos, weights))
        return dx, grad_weights, None, None


def swiglu(x: torch.Tensor, weights: torch.Tensor = None, pos: torch.Tensor = None, clamp: float = None):
    """y = silu(min(gate, c)) * clamp(up, -c, c) * w of x = [gate | up] [N, 2H] bf16 (deep_kernels.swiglu_forward),
    differentiable in x and in the FP32 weights (the module docstring). Rows at pos -1 give 0."""
    return _SwiGLU.apply(x, weights, pos, clamp)
