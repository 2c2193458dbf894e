"""Expert parallelism: a rank's view of the routed experts.

map_global_to_local_experts: rank r holds experts [r * n, (r + 1) * n) of the global numbering, n =
num_local_experts; a slot routed to one of them gets its local id (global - r * n), every other slot -1,
so moe_layout(local, n) lays out exactly this rank's slots.
"""

import functools

import torch

from deep_kernels.jit.definition import PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import get_kernel
from deep_kernels.jit.source import KernelSpec
from deep_kernels.device import get_num_sms
from deep_kernels.validation import INT32_LIMIT, ceil_div, check_cuda_device, check_dtype, check_int_range, is_traced

_THREADS = 256


MOE_LOCAL_EXPERTS = KernelDef(
    "kernels/smxx_moe_local_experts.cuh", "smxx_moe_local_experts_impl",
    template=("IndexT", "kNumThreads"),
    params=(Param("topk_idx", PTR), Param("local_idx", PTR), Param("num_slots", U32), Param("first_expert", U32),
            Param("num_local_experts", U32)),
    threads=lambda t: t["kNumThreads"])


def _spec(dtype: torch.dtype) -> KernelSpec:
    return MOE_LOCAL_EXPERTS.spec(IndexT=dtype, kNumThreads=_THREADS)


@functools.lru_cache(maxsize=None)
def _kernel(dtype: torch.dtype):
    return get_kernel(_spec(dtype))


def map_global_to_local_experts(topk_idx: torch.Tensor, num_local_experts: int, rank: int,
                                out: torch.Tensor = None) -> torch.Tensor:
    """This rank's local expert ids of routed slots.

    Args:
        topk_idx: int32 or int64 CUDA tensor of global expert ids (any shape, contiguous; -1 or any id
            outside this rank's range is allowed).
        num_local_experts: n >= 1, experts per rank.
        rank: r >= 0; this rank holds global experts [r * n, (r + 1) * n) (r * n + n < 2^31).
        out: optional contiguous int32 tensor of topk_idx's shape.

    Returns:
        int32 tensor of topk_idx's shape: global - r * n inside the range, else -1.

    Notes:
        One launch, no host synchronization (CUDA-graph safe); bit-exact with
        deep_kernels.reference.moe.map_global_to_local_experts.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.map_global_to_local_experts(topk_idx, num_local_experts, rank, out)
    check_dtype(topk_idx, "topk_idx", (torch.int32, torch.int64))
    if not topk_idx.is_contiguous():
        raise ValueError(f"topk_idx must be contiguous, got strides {tuple(topk_idx.stride())}")
    check_int_range(num_local_experts, "num_local_experts", 1, INT32_LIMIT)
    check_int_range(rank, "rank", 0, INT32_LIMIT)
    if (rank + 1) * num_local_experts > INT32_LIMIT:
        raise ValueError(f"rank ({rank}) times num_local_experts ({num_local_experts}) must stay below 2^31")
    if topk_idx.numel() > INT32_LIMIT:
        raise ValueError(f"topk_idx has too many elements ({topk_idx.numel()}): split it")
    if out is not None:
        check_dtype(out, "out", (torch.int32,))
        if out.shape != topk_idx.shape or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous int32 tensor of shape {tuple(topk_idx.shape)}, got shape "
                             f"{tuple(out.shape)} strides {tuple(out.stride())}")
    check_cuda_device(topk_idx, "topk_idx")
    if out is not None:
        check_cuda_device(out, "out", like=topk_idx)

    local_idx = torch.empty_like(topk_idx, dtype=torch.int32) if out is None else out
    num_slots = topk_idx.numel()
    if num_slots == 0:
        return local_idx
    num_blocks = min(ceil_div(num_slots, _THREADS), 4 * get_num_sms())
    _kernel(topk_idx.dtype).launch(
        (num_blocks, 1, 1), topk_idx.get_device(), topk_idx=topk_idx.data_ptr(), local_idx=local_idx.data_ptr(),
        num_slots=num_slots, first_expert=rank * num_local_experts, num_local_experts=num_local_experts)
    return local_idx


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    return [_spec(torch.int32), _spec(torch.int64)]
