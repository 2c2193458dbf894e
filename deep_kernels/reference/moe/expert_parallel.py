"""Plain-torch reference of deep_kernels.moe.expert_parallel."""

import torch


def map_global_to_local_experts(topk_idx: torch.Tensor, num_local_experts: int, rank: int,
                                out: torch.Tensor = None) -> torch.Tensor:
    local = topk_idx.long() - rank * num_local_experts
    mapped = torch.where((local >= 0) & (local < num_local_experts), local, torch.full_like(local, -1)).int()
    if out is not None:
        out.copy_(mapped)
        return out
    return mapped
