"""Plain-torch reference of deep_kernels.moe.gate: the definition the kernels match bit for bit.

Runs on any device. The arithmetic mirrors the gating kernel's, operation for operation, in fp32:
softmax's max and sum run per lane of a warp (lane l holds experts l, l + 32, ... and adds them in that
order), then pairwise over lanes (an xor butterfly); the weight sum adds the k chosen scores in
selection order. Divisions and the epsilon are tensor operations on purpose (torch turns a division by
a Python scalar into a multiplication by its reciprocal). Selection uses stable sorts of keys whose NaN
became -inf and whose -0 became +0, so ties go to the lower index exactly as in the kernel.
"""

import torch

from deep_kernels.reference.common import ceil_div

WARP_SIZE = 32
# Renormalized weights divide by the sum of the chosen scores plus this (README: "sum + 1e-20").
RENORMALIZE_EPSILON = 1e-20
# sqrt(softplus(x)) takes softplus(x) = x above this (where log1p(exp(x)) rounds to x in FP32).
SOFTPLUS_THRESHOLD = 20.0


def warp_lane_sum(values: torch.Tensor) -> torch.Tensor:
    """[T, E] -> [T]: the gating kernel's sum (each lane's slots in order, then the xor butterfly)."""
    num_tokens, num_experts = values.shape
    slots = ceil_div(num_experts, WARP_SIZE)
    padded = values.new_zeros((num_tokens, slots * WARP_SIZE))
    padded[:, :num_experts] = values
    by_slot = padded.view(num_tokens, slots, WARP_SIZE)
    partial = torch.zeros_like(by_slot[:, 0])
    for slot in range(slots):
        partial = partial + by_slot[:, slot]
    width = WARP_SIZE
    while width > 1:
        width //= 2
        partial = partial[:, :width] + partial[:, width:2 * width]
    return partial[:, 0]


def gate_scores(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """fp32 scores [T, E] of the logits, as the kernel computes them."""
    x = logits.float()
    if scoring == "softmax":
        exponentials = torch.exp(x - x.amax(dim=1, keepdim=True))
        return exponentials / warp_lane_sum(exponentials).unsqueeze(1)
    if scoring == "sigmoid":
        return torch.ones_like(x) / (torch.exp(-x) + 1.0)
    if scoring == "sqrtsoftplus":
        return torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x))).sqrt()
    raise ValueError(f"unknown scoring {scoring!r}")


def rank_keys(keys: torch.Tensor) -> torch.Tensor:
    """Keys as the selection compares them: NaN is -inf, -0 is +0."""
    keys = torch.where(torch.isnan(keys), torch.full_like(keys, -torch.inf), keys)
    return torch.where(keys == 0, torch.zeros_like(keys), keys)


def descending_order(keys: torch.Tensor) -> torch.Tensor:
    """Indices along the last dimension by descending key, ties to the lower index."""
    return torch.sort(rank_keys(keys), dim=-1, descending=True, stable=True).indices


def topk_gate(logits: torch.Tensor, k: int, scoring: str = "softmax", bias: torch.Tensor = None,
              num_groups: int = 0, topk_groups: int = 0, renormalize: bool = True,
              routed_scaling_factor: float = 1.0):
    num_tokens, num_experts = logits.shape
    scores = gate_scores(logits, scoring)
    keys = rank_keys(scores if bias is None else scores + bias.float())
    eligible = torch.ones_like(keys, dtype=torch.bool)
    if num_groups > 0:
        grouped = keys.view(num_tokens, num_groups, num_experts // num_groups)
        top2 = grouped.topk(2, dim=2).values
        group_order = descending_order(top2[:, :, 0] + top2[:, :, 1])
        kept = torch.zeros((num_tokens, num_groups), dtype=torch.bool, device=logits.device)
        kept.scatter_(1, group_order[:, :topk_groups], True)
        eligible = kept.repeat_interleave(num_experts // num_groups, dim=1)
    # Lexicographic (eligible, key, -index): stable sort by key, then stably by eligibility.
    by_key = descending_order(keys)
    by_eligibility = torch.sort(eligible.gather(1, by_key).int(), dim=1, descending=True, stable=True).indices
    indices = by_key.gather(1, by_eligibility)[:, :k]

    chosen = scores.gather(1, indices)
    if renormalize:
        total = torch.zeros_like(chosen[:, 0])
        for j in range(k):
            total = total + chosen[:, j]
        chosen = chosen / (total + torch.full_like(total, RENORMALIZE_EPSILON)).unsqueeze(1)
    weights = chosen * torch.full_like(chosen, routed_scaling_factor)
    return weights.contiguous(), indices.int().contiguous()


def topk_gate_backward(grad_weights: torch.Tensor, logits: torch.Tensor, indices: torch.Tensor,
                       scoring: str = "softmax", renormalize: bool = True, routed_scaling_factor: float = 1.0,
                       out: torch.Tensor = None) -> torch.Tensor:
    """The kernel's operation order (csrc/kernels/smxx_topk_gate_backward.cuh), in fp32: c_j the chosen
    scores (0 for an index outside [0, E)); D = (c_0 + ... + c_{k-1}) + eps and dot = sum_j g_j c_j in
    j order; gc_j = ((g_j - dot / D) / D) * f, or g_j * f without renormalizing; then through the scores."""
    num_tokens, num_experts = logits.shape
    scores = gate_scores(logits, scoring)
    index = indices.long()
    valid = (index >= 0) & (index < num_experts)
    safe_index = torch.where(valid, index, torch.zeros_like(index))
    chosen = torch.where(valid, scores.gather(1, safe_index), torch.zeros_like(grad_weights))
    factor = torch.full_like(grad_weights, routed_scaling_factor)
    if renormalize:
        total = torch.zeros_like(chosen[:, 0])
        dot = torch.zeros_like(chosen[:, 0])
        for j in range(indices.shape[1]):
            total = total + chosen[:, j]
            dot = dot + grad_weights[:, j] * chosen[:, j]
        total = (total + torch.full_like(total, RENORMALIZE_EPSILON)).unsqueeze(1)
        chosen_grad = (grad_weights - (dot.unsqueeze(1) / total)) / total * factor
    else:
        chosen_grad = grad_weights * factor
    # Per expert: the sum of its slots' gradients in j order, and whether any slot chose it.
    score_grad = torch.zeros_like(scores)
    times_chosen = torch.zeros_like(scores, dtype=torch.int32)
    for j in range(indices.shape[1]):
        rows = valid[:, j].nonzero().squeeze(1)
        score_grad[rows, safe_index[rows, j]] += chosen_grad[rows, j]
        times_chosen[rows, safe_index[rows, j]] += 1
    is_chosen = times_chosen > 0
    zero = torch.zeros_like(scores)
    if scoring == "softmax":
        chosen_dot = torch.zeros_like(chosen[:, 0])
        for j in range(indices.shape[1]):
            chosen_dot = chosen_dot + chosen_grad[:, j] * chosen[:, j]
        grad = scores * (score_grad - chosen_dot.unsqueeze(1))
    elif scoring == "sigmoid":
        grad = torch.where(is_chosen, score_grad * (scores * (torch.ones_like(scores) - scores)), zero)
    elif scoring == "sqrtsoftplus":
        x = logits.float()
        slope = torch.where(x > SOFTPLUS_THRESHOLD, torch.ones_like(x), gate_scores(x, "sigmoid"))
        grad = (score_grad * slope) / (scores * torch.full_like(scores, 2.0))
        grad = torch.where(is_chosen & (scores != 0), grad, zero)
    else:
        raise ValueError(f"unknown scoring {scoring!r}")
    if out is not None:
        out.copy_(grad)
        return out
    return grad.contiguous()
