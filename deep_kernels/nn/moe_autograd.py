"""The DeepSeek-V3 MoE layer (deep_kernels.nn.MoE's contiguous forward) as a differentiable function, for training:
moe_layer(x, router_weight, correction_bias, gate_up_weight, down_weight, ...) with float (master) weights.

Forward: the module's contiguous forward (deep_kernels/nn/moe.py's docstring) on the weights quantized by
per_block_cast_to_fp8 (or on given FP8 weights, their quantization), keeping what the backward reads: x, the logits,
the routing, the layout and the up-projection h (bf16 [R, 2I]).

Backward, from dout [T, H] (R: the layout's rows; rows no slot takes are zeros wherever a sum over rows reads them):
    dO   = expand(dout) as rows, cast to FP8 1 x 128 (moe_expand_cast_to_fp8)                       e4m3 [R, H]
    dY   = m_grouped_fp8_gemm_nt_contiguous(dO, down^T)     down^T: the FP8 weights transposed (batched_transpose),
           their 128 x 128 scale blocks transposed with them: exact                                  bf16 [R, I]
    dh, dw_row = swiglu_backward(h, dY, weights, pos=row_to_slot): dh bf16 [R, 2I], each row's weight gradient
    dX   = m_grouped_fp8_gemm_nt_contiguous(cast(dh), gate_up^T)                                     bf16 [R, H]
    dx   = moe_reduce(dX, ones): each token's rows summed in FP32                                    bf16 [T, H]
    dweights [T, k] = dw_row of each slot's row; dlogits = topk_gate_backward(dweights, logits, indices)  FP32 [T, E]
    dx  += dlogits @ router_weight; drouter = dlogits^T @ x: torch's bf16 GEMMs (dlogits rounded to bf16) with FP32
           outputs; dx rounded once to bf16
    weight gradients (the expert segments along the rows are the K groups, padded to 128 rows as the k-grouped GEMM
    needs, their sizes on the device; the GEMM's K is all R rows, an upper bound: the rows the layout leaves unused
    are never written, and not read), both operands cast per 1 x 128 along the rows
    (per_channel_cast_transpose_to_fp8):
        ddown[e]    = dO_e^T @ y_e       y = swiglu_forward(h, weights, pos) recomputed in bf16      FP32 [E, H, I]
        dgate_up[e] = dh_e^T @ x_e       x_e: the expert's token rows (moe_expand, bf16)            FP32 [E, 2I, H]
    by weight_gradient_gemm (k_grouped_fp8_gemm_nt_contiguous), then cast to the weights' dtype.
The FP8 weights are differentiated straight through (the gradient of a master weight is that of its quantized value,
as FP8 training does); the correction bias and the selection get none.

No host synchronization, forward or backward: every shape follows from T, k, E, H and I (R is the layout's
worst-case rows), so torch.compile(fullgraph=True) traces the layer's forward and backward to the kernels' ops.

Deterministic: every reduction has a fixed order (no atomics in any kernel used, torch's GEMMs deterministic for
fixed shapes).
"""

import torch

from deep_kernels.grouped_gemm import m_grouped_fp8_gemm_nt_contiguous
from deep_kernels.k_grouped_gemm import k_grouped_fp8_gemm_nt_contiguous
from deep_kernels.moe.expand import moe_expand, moe_expand_cast_to_fp8, moe_reduce
from deep_kernels.moe.gate import topk_gate_backward
from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT, MoeLayout
from deep_kernels.moe.routing import topk_gate_with_layout
from deep_kernels.nn.expert_parallel import check_local_experts, exchanging_group
from deep_kernels.quant.fp8 import per_block_cast_to_fp8, per_token_cast_to_fp8
from deep_kernels.quant.swiglu import swiglu_backward, swiglu_cast_to_fp8, swiglu_forward
from deep_kernels.quant.transpose import batched_transpose, per_channel_cast_transpose_to_fp8

BLOCK = 128
_LAYOUT_FIELDS = ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row")


def router_logits(x: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """FP32 [T, E] = x @ router_weight^T (torch's bf16 GEMM with an FP32 output), as MoE.router_logits."""
    return torch.mm(x, router_weight.t(), out_dtype=torch.float32)


def router_gradient_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """FP32 a @ b of bf16 a and b (the router GEMM's backward: torch's bf16 GEMM with an FP32 output)."""
    return torch.mm(a, b, out_dtype=torch.float32)


def quantize_experts(weight: torch.Tensor) -> tuple:
    """[E, N, K] float weights to the grouped GEMMs' (e4m3 [E, N, K], FP32 [E, N / 128, K / 128]) in one
    per_block_cast_to_fp8 over the E * N rows (each 128-row block within one expert)."""
    num_experts, n, k = weight.shape
    q, scales = per_block_cast_to_fp8(weight.contiguous().view(num_experts * n, k))
    return q.view(num_experts, n, k), scales.view(num_experts, n // BLOCK, k // BLOCK)


def transposed_experts(fp8_weight: tuple) -> tuple:
    """(W^T e4m3 [E, K, N], its scales [E, K / 128, N / 128]) of block-scaled FP8 expert weights (e4m3 [E, N, K],
    FP32 [E, N / 128, K / 128]): the input-gradient GEMMs' b. Exact: a 128 x 128 block keeps its scale."""
    q, scales = fp8_weight
    return batched_transpose(q), scales.transpose(1, 2).contiguous()


def weight_gradient_gemm(rows_a: torch.Tensor, rows_b: torch.Tensor, segment_rows: torch.Tensor) -> torch.Tensor:
    """FP32 [E, M, N]: out[e] = rows_a_e^T @ rows_b_e over expert e's segment of rows (segment_rows[e] rows, back to
    back from row 0; the rows after the last segment are not read), of bf16 rows_a [R, M] and rows_b [R, N], both
    cast per 1 x 128 along the rows (the weight-gradient recipe)."""
    a = per_channel_cast_transpose_to_fp8(rows_a)
    b = per_channel_cast_transpose_to_fp8(rows_b)
    out = torch.empty((segment_rows.shape[0], rows_a.shape[1], rows_b.shape[1]), dtype=torch.float32,
                      device=rows_a.device)
    return k_grouped_fp8_gemm_nt_contiguous(a, b, out, None, segment_rows)


def segment_rows(layout: MoeLayout) -> torch.Tensor:
    """int32 [E] on the device: each expert's rows in the contiguous layout, its count rounded up to 128. They sum to
    the rows the layout uses (num_rows); the rows after them are never written (moe_expand leaves them)."""
    sizes = (layout.counts + (CONTIGUOUS_ALIGNMENT - 1)).div(CONTIGUOUS_ALIGNMENT, rounding_mode="floor")
    return (sizes * CONTIGUOUS_ALIGNMENT).int()


def saved_layout(layout: MoeLayout) -> tuple:
    """The contiguous layout's tensors as a backward saves them (MoeLayout(*them) rebuilds it)."""
    return tuple(getattr(layout, name) for name in _LAYOUT_FIELDS)


def expert_steps(x: torch.Tensor, weights: torch.Tensor, layout: MoeLayout, gate_up: tuple, down: tuple) -> tuple:
    """(h bf16 [R, 2I], the experts' rows bf16 [R, H]) of tokens x [T, H] routed by layout with routing weights
    [T, k]: the forward's steps from the expand to the down-projection."""
    num_rows, hidden = layout.m_indices.shape[0], x.shape[1]
    tokens = moe_expand_cast_to_fp8(x, layout, zero_padding=False)
    projected = m_grouped_fp8_gemm_nt_contiguous(tokens, gate_up, x.new_empty((num_rows, gate_up[0].shape[1])),
                                                 layout.m_indices)
    activated = swiglu_cast_to_fp8(projected, weights=weights, pos=layout.row_to_slot, check_pos=False)
    expert_out = m_grouped_fp8_gemm_nt_contiguous(activated, down, x.new_empty((num_rows, hidden)), layout.m_indices)
    return projected, expert_out


def expert_steps_backward(ctx, dout: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, projected: torch.Tensor,
                          layout: MoeLayout, gate_up: tuple, down: tuple) -> tuple:
    """(dX rows bf16 [R, H], each row's routing-weight gradient FP32 [R], dgate_up, ddown) of expert_steps, from
    dout [T, H] bf16 (the module docstring's steps; a weight gradient None where ctx does not ask for it: inputs 2
    and 3 of the autograd function, in the dtypes of ctx.weight_dtypes)."""
    num_rows, intermediate, hidden = projected.shape[0], projected.shape[1] // 2, x.shape[1]
    grad_rows = moe_expand_cast_to_fp8(dout, layout, zero_padding=True)
    grad_activated = m_grouped_fp8_gemm_nt_contiguous(grad_rows, transposed_experts(down),
                                                      x.new_empty((num_rows, intermediate)), layout.m_indices)
    grad_projected = torch.zeros_like(projected)  # rows no slot takes stay 0 (the weight gradients sum them)
    row_weight_grads = torch.zeros(num_rows, dtype=torch.float32, device=x.device)
    swiglu_backward(projected, grad_activated, weights=weights, pos=layout.row_to_slot, check_pos=False,
                    out=(grad_projected, row_weight_grads))
    grad_tokens = m_grouped_fp8_gemm_nt_contiguous(per_token_cast_to_fp8(grad_projected), transposed_experts(gate_up),
                                                   x.new_empty((num_rows, hidden)), layout.m_indices)

    # Weight gradients: K-grouped over the experts' row segments.
    grad_gate_up = grad_down = None
    if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
        segments = segment_rows(layout)
        if ctx.needs_input_grad[3]:
            activated = torch.zeros((num_rows, intermediate), dtype=torch.bfloat16, device=x.device)
            swiglu_forward(projected, weights=weights, pos=layout.row_to_slot, check_pos=False, out=activated)
            grad_down = weight_gradient_gemm(moe_expand(dout, layout, zero_padding=True), activated,
                                             segments).to(ctx.weight_dtypes[1])
        if ctx.needs_input_grad[2]:
            token_rows = moe_expand(x, layout, zero_padding=True)
            grad_gate_up = weight_gradient_gemm(grad_projected, token_rows, segments).to(ctx.weight_dtypes[0])
    return grad_tokens, row_weight_grads, grad_gate_up, grad_down


class _MoELayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, router_weight, gate_up_weight, down_weight, correction_bias, gate_up, down, config):
        (top_k, num_groups, topk_groups, scoring, renormalize, routed_scaling_factor) = config
        logits = router_logits(x, router_weight)
        weights, indices, layout = topk_gate_with_layout(logits, top_k, scoring, correction_bias, num_groups,
                                                         topk_groups, renormalize, routed_scaling_factor)
        projected, expert_out = expert_steps(x, weights, layout, gate_up, down)
        out = moe_reduce(expert_out, layout, torch.ones_like(weights))
        ctx.save_for_backward(x, router_weight, logits, weights, indices, projected, *gate_up, *down,
                              *saved_layout(layout))
        ctx.config = config
        ctx.weight_dtypes = tuple(None if w is None else w.dtype for w in (gate_up_weight, down_weight))
        return out

    @staticmethod
    def backward(ctx, dout):
        (x, router_weight, logits, weights, indices, projected, gate_up_q, gate_up_s, down_q, down_s,
         *layout_tensors) = ctx.saved_tensors
        layout = MoeLayout(*layout_tensors)
        top_k, num_groups, topk_groups, scoring, renormalize, routed_scaling_factor = ctx.config
        dout = dout.to(torch.bfloat16).contiguous()
        grad_tokens, row_weight_grads, grad_gate_up, grad_down = expert_steps_backward(
            ctx, dout, x, weights, projected, layout, (gate_up_q, gate_up_s), (down_q, down_s))
        grad_x = moe_reduce(grad_tokens, layout, torch.ones_like(weights), out_dtype=torch.float32)

        # The routing: each slot's weight gradient is its row's; then the gate and the router GEMM.
        slot_rows = layout.slot_to_row.long()
        grad_weights = torch.where(slot_rows >= 0, row_weight_grads[slot_rows.clamp(min=0)], 0.0)
        grad_logits = topk_gate_backward(grad_weights, logits, indices, scoring, renormalize, routed_scaling_factor)
        grad_logits = grad_logits.to(torch.bfloat16)
        grad_x += router_gradient_gemm(grad_logits, router_weight)
        grad_router = (router_gradient_gemm(grad_logits.t(), x).to(router_weight.dtype) if ctx.needs_input_grad[1]
                       else None)
        return grad_x.to(x.dtype), grad_router, grad_gate_up, grad_down, None, None, None, None


def moe_layer(x: torch.Tensor, router_weight: torch.Tensor, correction_bias: torch.Tensor,
              gate_up_weight: torch.Tensor, down_weight: torch.Tensor, top_k: int = 8, num_groups: int = 8,
              topk_groups: int = 4, scoring: str = "sigmoid", renormalize: bool = True,
              routed_scaling_factor: float = 2.5, gate_up: tuple = None, down: tuple = None,
              process_group=None) -> torch.Tensor:
    """The routed experts of a DeepSeek-V3 MoE layer, differentiable (the module docstring).

    Args:
        x: [T, H] bfloat16 CUDA tensor, contiguous.
        router_weight: [E, H] bfloat16.
        correction_bias: [E] FP32 (selection only: no gradient).
        gate_up_weight: [E, 2I, H] float master weights (rows [0, I) the gate projection, [I, 2I) the up projection),
            or None with gate_up given: frozen experts, no weight gradient.
        down_weight: [E, H, I] float master weights, or None with down given.
        top_k, num_groups, topk_groups, scoring, renormalize, routed_scaling_factor: the gate's (MoE's).
        gate_up, down: optional (e4m3, FP32 128 x 128 scales) of the master weights as per_block_cast_to_fp8 gives
            them (quantize_experts): the GEMMs run on them. None: quantized here, on every call.
        process_group: a torch.distributed group of W ranks over which the E experts are spread: then
            gate_up_weight, down_weight, gate_up and down are this rank's E / W experts (rank r's are
            [r E / W, (r + 1) E / W)), and x this rank's tokens (nn/expert_parallel_autograd.py). A group of one
            rank runs as None does (the same bits, no exchange).

    Returns:
        [T, H] bfloat16: the layer's output, MoE's contiguous forward on the quantized weights.

    Gradients reach x, router_weight, gate_up_weight and down_weight (FP8 weights straight through), in their
    dtypes.
    """
    if (gate_up_weight is None and gate_up is None) or (down_weight is None and down is None):
        raise ValueError("moe_layer needs each expert projection as float weights, FP8 weights, or both")
    if process_group is not None:
        check_local_experts(router_weight.shape[0], (gate_up_weight if gate_up is None else gate_up[0]).shape[0],
                            process_group)
    process_group = exchanging_group(process_group)
    gate_up = quantize_experts(gate_up_weight.detach()) if gate_up is None else gate_up
    down = quantize_experts(down_weight.detach()) if down is None else down
    config = (top_k, num_groups, topk_groups, scoring, renormalize, routed_scaling_factor)
    if process_group is not None:
        # NOTE: imported here: the expert-parallel function is built on this module's steps.
        from deep_kernels.nn.expert_parallel_autograd import expert_parallel_moe_layer
        return expert_parallel_moe_layer(x, router_weight, correction_bias, gate_up_weight, down_weight, gate_up, down,
                                         config, process_group)
    return _MoELayer.apply(x, router_weight, gate_up_weight, down_weight, correction_bias, gate_up, down, config)
