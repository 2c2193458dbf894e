"""Plain-torch reference of deep_kernels.nn.MoE's forward: a DeepSeek-V3 mixture-of-experts layer (routed
experts), from float expert weights (the module's FP8 weights dequantized, or any others). Runs on any device.

    logits  = x @ router_weight^T                               FP32 (or the router's logits, given)
    weights, indices = the gate (scores, the correction bias for selection only, group limit, top k,
                       renormalized weights times routed_scaling_factor)
    for each kept slot (token t, expert e, weight w):
        [gate | up] = x[t] @ gate_up_weight[e]^T                gate: columns [0, I), up: [I, 2I)
        y = silu(gate) * up * w
        out[t] += y @ down_weight[e]^T
in float64; the output is float64.

The gate is the routing reference's FP32 topk_gate (deep_kernels.reference.moe), not a float64 one: selection is
discrete, and float64 keys would order some near-ties differently from the FP32 keys the layer compares, which
puts one whole expert's output on the wrong token, far beyond any bound. That reference matches the gate kernel
bit for bit on the GPU; the test of this module checks it against an independent per-token loop.

quantize=True passes every activation through the format the kernel pipeline stores it in, so that what remains
between the module and this reference is accumulation order and precision only (the bound can then be tight):
x cast to e4m3 per 1 x 128 group (FP32 scale amax / 448), the up-projection rounded to bf16 (from FP32, as the
GEMM rounds its accumulator), y (the routing weight included: the module applies it in the SwiGLU cast) cast to
e4m3 per 1 x 128 group, each expert's down-projection rounded to bf16. Sums and products stay float64.

max_tokens: the masked layout's capacity: expert e keeps its first max_tokens slots in slot order (s = t * k + j),
the others are dropped (they add nothing; the other weights are not renormalized).
"""

import torch

from deep_kernels.reference.moe.gate import topk_gate
from deep_kernels.reference.quant.fp8 import per_token_cast_to_fp8

GROUP_SIZE = 128


def router_logits(x: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """FP32 [T, E]: x @ router_weight^T in float64, rounded once to FP32."""
    return (x.double() @ router_weight.double().T).float()


def kept_slots(indices: torch.Tensor, num_experts: int, max_tokens: int = None) -> torch.Tensor:
    """bool [T, k]: the slots an expert of capacity max_tokens keeps (its first max_tokens in slot order); every
    slot without a capacity."""
    if max_tokens is None:
        return torch.ones_like(indices, dtype=torch.bool)
    flat = indices.reshape(-1).long()
    one_hot = torch.nn.functional.one_hot(flat, num_experts)
    earlier = (one_hot.cumsum(0) - one_hot).gather(1, flat.unsqueeze(1)).squeeze(1)
    return (earlier < max_tokens).view(indices.shape)


def _fp8_round_trip(values: torch.Tensor) -> torch.Tensor:
    """float64 rows cast to e4m3 per 1 x 128 group from their FP32 values, and dequantized."""
    q, scales = per_token_cast_to_fp8(values.float(), GROUP_SIZE, scale_layout="row_major")
    return q.double() * scales.double().repeat_interleave(GROUP_SIZE, dim=1)


def _bf16_round_trip(values: torch.Tensor) -> torch.Tensor:
    """float64 values rounded to bf16 from FP32 (as a GEMM rounds its FP32 accumulator)."""
    return values.float().bfloat16().double()


def moe_forward(x: torch.Tensor, router_weight: torch.Tensor, correction_bias: torch.Tensor,
                gate_up_weight: torch.Tensor, down_weight: torch.Tensor, top_k: int = 8, num_groups: int = 8,
                topk_groups: int = 4, scoring: str = "sigmoid", renormalize: bool = True,
                routed_scaling_factor: float = 2.5, logits: torch.Tensor = None, max_tokens: int = None,
                quantize: bool = False) -> torch.Tensor:
    """The layer's output, float64 [T, H] (the module docstring).

    Args:
        x: [T, H] tokens (any float dtype).
        router_weight: [E, H]; correction_bias: [E] (added to the scores for selection only).
        gate_up_weight: [E, 2I, H] (rows [0, I) the gate projection, [I, 2I) the up projection).
        down_weight: [E, H, I].
        top_k, num_groups, topk_groups, scoring, renormalize, routed_scaling_factor: the gate's.
        logits: [T, E] router logits to route with instead of router_logits(x, router_weight) (a test passes
            the module's own: the router GEMM is torch's, and selection must see the same FP32 values).
        max_tokens: the capacity of each expert (None: no slot is dropped).
        quantize: the kernels' activation formats (the module docstring); False: float64 throughout.
    """
    num_tokens, hidden = x.shape
    num_experts, intermediate = gate_up_weight.shape[0], gate_up_weight.shape[1] // 2
    if logits is None:
        logits = router_logits(x, router_weight)
    weights, indices = topk_gate(logits.float(), top_k, scoring, correction_bias.float(), num_groups, topk_groups,
                                 renormalize, routed_scaling_factor)
    kept = kept_slots(indices, num_experts, max_tokens)
    tokens = x.double()
    if quantize:
        tokens = _fp8_round_trip(tokens)
    out = torch.zeros((num_tokens, hidden), dtype=torch.float64, device=x.device)
    for expert in range(num_experts):
        token, slot = ((indices == expert) & kept).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        projected = tokens[token] @ gate_up_weight[expert].double().T
        if quantize:
            projected = _bf16_round_trip(projected)
        gate, up = projected[:, :intermediate], projected[:, intermediate:]
        y = gate / (1 + torch.exp(-gate)) * up * weights[token, slot].double().unsqueeze(1)
        if quantize:
            y = _fp8_round_trip(y)
        expert_out = y @ down_weight[expert].double().T
        if quantize:
            expert_out = _bf16_round_trip(expert_out)
        out.index_add_(0, token, expert_out)
    return out
