"""The expert-parallel MoE layer as a differentiable function, for training: moe_autograd.moe_layer's contiguous
forward and backward with the experts spread over the ranks of a process group (rank r of W holding experts
[r n, (r + 1) n), n = E / W, as master weights and their FP8 copies) and the rows moved between them as
expert_parallel.py's contiguous exchange moves them.

Forward: the gate where the tokens are; each token goes in bf16 to every rank that holds one of its experts (the
weight gradient reads it in bf16; the expert's rank casts it, the same FP8 rows as the single-GPU layer's expand and
cast); the expert steps there; each slot's row back to its token's rank, summed in slot order.

Backward, from dout [T, H] of this rank's tokens (moe_autograd.py's steps, each on the rank that holds its inputs):
    dispatch  dout goes where its token went, in the same order
    experts   on the received tokens: the input-gradient GEMMs and SwiGLU backward (each slot's dX row and its
              routing weight's gradient), and the local experts' weight gradients over every rank's tokens
    combine   each slot's dX row and weight gradient back to its token's rank, which sums a token's rows in slot
              order in FP32 and runs the gate's and the router's backward

Each rank's x gradient and its experts' weight gradients are bitwise moe_layer's over the ranks' tokens
concatenated in rank order: every row is computed from the same inputs, an expert's rows come in the same order
(by source rank, then token) in the same 128-row blocks, and every sum runs in the same order. That holds where a
GEMM's rows do not depend on how many rows it has; torch's router GEMMs (cuBLAS) may pick another kernel for another
token count. router_weight's gradient is this rank's tokens' share: the ranks' shares sum to it, as data
parallelism sums the gradients of replicated weights.

One host synchronization: the forward's count exchange (the backward reuses its counts).
"""

import torch
import torch.distributed as dist

from deep_kernels.moe.expand import moe_reduce
from deep_kernels.moe.expert_parallel import map_global_to_local_experts
from deep_kernels.moe.gate import topk_gate, topk_gate_backward
from deep_kernels.moe.layout import MoeLayout, moe_layout
from deep_kernels.nn import expert_parallel as exchange
from deep_kernels.nn import moe_autograd

def _empty_weight_grad(ctx, index: int, fp8_weight: torch.Tensor):
    """A rank that received no token: zeros for an asked weight gradient."""
    if not ctx.needs_input_grad[index]:
        return None
    return torch.zeros(fp8_weight.shape, dtype=ctx.weight_dtypes[index - 2], device=fp8_weight.device)


class _ExpertParallelMoELayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, router_weight, gate_up_weight, down_weight, correction_bias, gate_up, down, config, group):
        top_k, num_groups, topk_groups, scoring, renormalize, routed_scaling_factor = config
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        logits = moe_autograd.router_logits(x, router_weight)
        weights, indices = topk_gate(logits, top_k, scoring, correction_bias, num_groups, topk_groups, renormalize,
                                     routed_scaling_factor)
        routes = exchange.contiguous_routes(indices, world, gate_up[0].shape[0], group)
        x_in = exchange.dispatch(x, routes, group)
        ids_in, weights_in, _ = exchange.received_routing(
            exchange.dispatch(exchange.routing_metadata(indices, weights), routes, group), top_k)
        rows_out, saved = x.new_empty((0, x.shape[1])), ()
        if x_in.shape[0] > 0:
            num_local = gate_up[0].shape[0]
            layout = moe_layout(map_global_to_local_experts(ids_in, num_local, rank), num_local)
            projected, expert_out = moe_autograd.expert_steps(x_in, weights_in, layout, gate_up, down)
            kept = exchange.kept_slot_rows(layout, sum(routes.got_slots))
            rows_out = expert_out.index_select(0, kept)
            saved = (x_in, weights_in, projected, kept, *moe_autograd.saved_layout(layout))
        out = exchange.reduce_slots(moe_reduce, exchange.combine(rows_out, routes, group), routes.slot_to_row,
                                     weights)
        ctx.save_for_backward(x, router_weight, logits, weights, indices, *gate_up, *down, *saved)
        ctx.config, ctx.group, ctx.routes = config, group, routes
        ctx.weight_dtypes = tuple(None if w is None else w.dtype for w in (gate_up_weight, down_weight))
        return out

    @staticmethod
    def backward(ctx, dout):
        (x, router_weight, logits, weights, indices, gate_up_q, gate_up_s, down_q, down_s,
         *saved) = ctx.saved_tensors
        top_k, num_groups, topk_groups, scoring, renormalize, routed_scaling_factor = ctx.config
        routes, group = ctx.routes, ctx.group
        dout_in = exchange.dispatch(dout.to(torch.bfloat16).contiguous(), routes, group)
        if saved:
            x_in, weights_in, projected, kept, *layout_tensors = saved
            grad_tokens, row_weight_grads, grad_gate_up, grad_down = moe_autograd.expert_steps_backward(
                ctx, dout_in, x_in, weights_in, projected, MoeLayout(*layout_tensors), (gate_up_q, gate_up_s),
                (down_q, down_s))
            grad_rows, grad_row_weights = grad_tokens.index_select(0, kept), row_weight_grads.index_select(0, kept)
        else:
            grad_rows = x.new_empty((0, x.shape[1]))
            grad_row_weights = torch.empty(0, dtype=torch.float32, device=x.device)
            grad_gate_up, grad_down = _empty_weight_grad(ctx, 2, gate_up_q), _empty_weight_grad(ctx, 3, down_q)
        grad_x = exchange.reduce_slots(moe_reduce, exchange.combine(grad_rows, routes, group), routes.slot_to_row,
                                       weights, out_dtype=torch.float32)
        num_slots = routes.slot_to_row.numel()
        grad_weights = exchange.combine(grad_row_weights, routes, group)[:num_slots]
        grad_weights = grad_weights.index_select(0, routes.slot_to_row.view(-1)).view_as(weights)
        grad_logits = topk_gate_backward(grad_weights, logits, indices, scoring, renormalize, routed_scaling_factor)
        grad_logits = grad_logits.to(torch.bfloat16)
        grad_x += moe_autograd.router_gradient_gemm(grad_logits, router_weight)
        grad_router = (moe_autograd.router_gradient_gemm(grad_logits.t(), x).to(router_weight.dtype)
                       if ctx.needs_input_grad[1] else None)
        return grad_x.to(x.dtype), grad_router, grad_gate_up, grad_down, None, None, None, None, None


def expert_parallel_moe_layer(x, router_weight, correction_bias, gate_up_weight, down_weight, gate_up: tuple,
                              down: tuple, config: tuple, group) -> torch.Tensor:
    """moe_autograd.moe_layer over a process group (the module docstring): gate_up_weight, down_weight, gate_up and
    down are this rank's n experts (moe_layer checks that they are E / W); config is (top_k, num_groups,
    topk_groups, scoring, renormalize, routed_scaling_factor)."""
    return _ExpertParallelMoELayer.apply(x, router_weight, gate_up_weight, down_weight, correction_bias, gate_up,
                                         down, config, group)
