"""Mixture-of-experts routing: top-k expert gating and the grouped-GEMM layouts of the routed tokens.

topk_gate (DeepSeek-V3 semantics, bit-exact with deep_kernels.reference.moe):
    score  = softmax | sigmoid | sqrt(softplus) of the logits, in fp32; key = score + bias (optional)
    groups: a group's key is the sum of its two largest expert keys; only the topk_groups best groups
            stay eligible
    the k largest eligible keys in descending order, ties to the lower index (groups likewise); NaN keys
    rank as -inf, so NaN/Inf logits still give distinct in-range indices
    weight = the chosen expert's unbiased score, / (sum of the k scores + 1e-20) when renormalizing,
             times routed_scaling_factor
    Sums run in a fixed order (see the reference), so results are deterministic.
moe_layout: slot s = t * k + j of topk_idx [T, k]; -1 (or any index outside [0, E)) drops a slot.
    contiguous layout: expert segments in expert order, each padded to CONTIGUOUS_ALIGNMENT rows,
    slots in ascending order within a segment; sized for the worst case so that no host sync is needed
    masked layout: [E, max_tokens] slots per expert and the per-expert valid count
    Positions never depend on atomics: counts, an exclusive scan, then ranks by counting earlier slots.
"""

import functools
from dataclasses import dataclass

import torch

from deep_kernels.jit.runtime import get_kernel
from deep_kernels.jit.source import CPP_TYPES, KernelSpec
from deep_kernels.validation import ceil_div, check_cuda_device, check_dtype, check_rank

MAX_EXPERTS = 512  # csrc/kernels/smxx_moe_slots.cuh: kMaxMoeExperts
MAX_TOP_K = 16
MAX_GROUPS = 32
CONTIGUOUS_ALIGNMENT = 128
RENORMALIZE_EPSILON = 1e-20
SOFTPLUS_THRESHOLD = 20.0


# The scoring functions by name, and their GateScoring enumerator (csrc/kernels/smxx_topk_gate.cuh).
SCORINGS = {"softmax": "Softmax", "sigmoid": "Sigmoid", "sqrtsoftplus": "SqrtSoftplus"}


_GATE_WARPS = 4
_LAYOUT_WARPS = 16
_COUNT_THREADS = 512
_CHUNK_SLOTS = 4096
_INT32_LIMIT = 2**31 - 1


def _check_scoring(scoring) -> None:
    if not isinstance(scoring, str) or scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {list(SCORINGS)}, got {scoring!r}")


def _check_int(value, name: str, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def _check_groups(num_experts: int, k: int, num_groups, topk_groups) -> None:
    _check_int(num_groups, "num_groups", 0, MAX_GROUPS)
    if num_groups == 0:
        if topk_groups != 0:
            raise ValueError(f"topk_groups must be 0 without groups (num_groups=0), got {topk_groups!r}")
        return
    if num_experts % num_groups != 0 or num_experts // num_groups < 2:
        raise ValueError(f"num_groups ({num_groups}) must divide the {num_experts} experts into groups of "
                         f"at least 2")
    _check_int(topk_groups, "topk_groups", 1, num_groups)
    eligible = topk_groups * (num_experts // num_groups)
    if k > eligible:
        raise ValueError(f"k ({k}) must not exceed the {eligible} experts of the topk_groups={topk_groups} groups")


def _gate_spec(dtype: torch.dtype, num_experts: int, num_groups: int, scoring: str) -> KernelSpec:
    return KernelSpec("kernels/smxx_topk_gate.cuh", "smxx_topk_gate_impl",
                      (CPP_TYPES[dtype], num_experts, num_groups, "deep_kernels::GateScoring::" + SCORINGS[scoring],
                       _GATE_WARPS))


@functools.lru_cache(maxsize=None)
def _gate_kernel(dtype: torch.dtype, num_experts: int, num_groups: int, scoring: str):
    return get_kernel(_gate_spec(dtype, num_experts, num_groups, scoring), param_kinds="PPPPIIIIIf",
                      block_threads=_GATE_WARPS * 32)


def topk_gate(logits: torch.Tensor, k: int, scoring: str = "softmax", bias: torch.Tensor = None,
              num_groups: int = 0, topk_groups: int = 0, renormalize: bool = True,
              routed_scaling_factor: float = 1.0):
    """Choose k experts per token from router logits.

    Args:
        logits: [T, E] float32 or bfloat16 CUDA tensor, last dimension contiguous; 1 <= E <= 512.
        k: experts per token, 1 <= k <= min(16, E).
        scoring: "softmax", "sigmoid" or "sqrtsoftplus" (sqrt(softplus(x)), softplus(x) = x above 20).
        bias: optional contiguous float32 [E] added to the scores for selection only.
        num_groups: 0 (no group limit) or the number of equal expert groups (<= 32, >= 2 experts each).
        topk_groups: groups kept eligible (1..num_groups); 0 without groups.
        renormalize: divide the k weights by their sum + 1e-20.
        routed_scaling_factor: multiplies the weights last.

    Returns:
        (weights, indices): float32 [T, k] and int32 [T, k], contiguous; indices in descending key order.

    Notes:
        Deterministic; bit-exact with deep_kernels.reference.moe.topk_gate (see the module docstring).
    """
    check_dtype(logits, "logits", (torch.float32, torch.bfloat16))
    check_rank(logits, "logits", 2)
    num_tokens, num_experts = logits.shape
    _check_int(num_experts, "logits.shape[1] (the expert count)", 1, MAX_EXPERTS)
    _check_int(k, "k", 1, min(MAX_TOP_K, num_experts))
    _check_scoring(scoring)
    _check_groups(num_experts, k, num_groups, topk_groups)
    if num_experts > 1 and logits.stride(1) != 1:
        raise ValueError(f"logits must have a contiguous last dimension, got strides {tuple(logits.stride())}")
    if num_tokens > 1 and not 0 <= logits.stride(0) <= _INT32_LIMIT:
        raise ValueError(f"logits row stride must be in [0, 2^31), got {logits.stride(0)}")
    if bias is not None:
        check_dtype(bias, "bias", (torch.float32,))
        if tuple(bias.shape) != (num_experts,) or not bias.is_contiguous():
            raise ValueError(f"bias must be a contiguous tensor of shape ({num_experts},), got shape "
                             f"{tuple(bias.shape)} strides {tuple(bias.stride())}")
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize must be a bool, got {type(renormalize).__name__}")
    if not (isinstance(routed_scaling_factor, (int, float)) and abs(routed_scaling_factor) < float("inf")):
        raise ValueError(f"routed_scaling_factor must be a finite number, got {routed_scaling_factor!r}")
    check_cuda_device(logits, "logits")
    if bias is not None:
        check_cuda_device(bias, "bias", like=logits)

    weights = logits.new_empty((num_tokens, k), dtype=torch.float32)
    indices = logits.new_empty((num_tokens, k), dtype=torch.int32)
    if num_tokens == 0:
        return weights, indices
    # One group with topk_groups = 1 keeps every expert eligible: the ungrouped kernel does the same.
    kernel = _gate_kernel(logits.dtype, num_experts, num_groups if num_groups > 1 else 0, scoring)
    kernel.launch((ceil_div(num_tokens, _GATE_WARPS), 1, 1),
                  (logits.data_ptr(), 0 if bias is None else bias.data_ptr(), weights.data_ptr(),
                   indices.data_ptr(), num_tokens, logits.stride(0), k, topk_groups, int(renormalize),
                   float(routed_scaling_factor)), logits.get_device())
    return weights, indices


@dataclass(frozen=True)
class MoeLayout:
    """Where each routed slot (s = t * k + j of topk_idx [T, k]) goes; every tensor int32 on the device.

    counts [E]: slots routed to each expert.
    num_rows [1]: rows the contiguous layout uses (each expert's count rounded up to CONTIGUOUS_ALIGNMENT).
    m_indices [max_rows]: each row's expert, -1 for padding rows and rows from num_rows on.
    row_to_slot [max_rows]: each row's slot, -1 where m_indices is -1.
    slot_to_row [T, k]: each slot's row, -1 for dropped slots.
    masked_slots [E, max_tokens] or None: expert e's first max_tokens slots in ascending order, then -1.
    masked_m [E] or None: min(counts, max_tokens), the valid length of each row of masked_slots.
    """

    counts: torch.Tensor
    num_rows: torch.Tensor
    m_indices: torch.Tensor
    row_to_slot: torch.Tensor
    slot_to_row: torch.Tensor
    masked_slots: torch.Tensor = None
    masked_m: torch.Tensor = None


def contiguous_max_rows(num_slots: int, num_experts: int) -> int:
    """Rows of the contiguous layout in the worst case: every slot, plus up to alignment - 1 padding rows
    for each expert that received any slot."""
    padding = (CONTIGUOUS_ALIGNMENT - 1) * min(num_experts, num_slots)
    return ceil_div(num_slots + padding, CONTIGUOUS_ALIGNMENT) * CONTIGUOUS_ALIGNMENT


def _count_spec(dtype: torch.dtype) -> KernelSpec:
    return KernelSpec("kernels/smxx_moe_count.cuh", "smxx_moe_count_impl",
                      (CPP_TYPES[dtype], _CHUNK_SLOTS, _COUNT_THREADS))


def _layout_spec(dtype: torch.dtype) -> KernelSpec:
    return KernelSpec("kernels/smxx_moe_layout.cuh", "smxx_moe_layout_impl",
                      (CPP_TYPES[dtype], _CHUNK_SLOTS, CONTIGUOUS_ALIGNMENT, _LAYOUT_WARPS))


@functools.lru_cache(maxsize=None)
def _layout_kernels(dtype: torch.dtype):
    count = get_kernel(_count_spec(dtype), param_kinds="PPII", block_threads=_COUNT_THREADS)
    layout = get_kernel(_layout_spec(dtype), param_kinds="PPPPPPPPPIIIII", block_threads=_LAYOUT_WARPS * 32)
    return count, layout


def moe_layout(topk_idx: torch.Tensor, num_experts: int, max_tokens: int = None) -> MoeLayout:
    """The contiguous (and optionally masked) grouped-GEMM layouts of routed slots.

    Args:
        topk_idx: [T, k] int32 or int64 CUDA tensor, contiguous; -1 (or any index outside [0, E)) drops
            a slot.
        num_experts: E, 1 <= E <= 512.
        max_tokens: with a value, also build the masked layout [E, max_tokens]; slots of an expert
            beyond the first max_tokens are left out of it (compare masked_m with counts to detect it).

    Returns:
        MoeLayout (see its docstring); the contiguous tensors have contiguous_max_rows(T * k, E) rows.

    Notes:
        Two launches (per-chunk counts, then offsets, ranks and scatter), no host synchronization, so
        it can be captured in a CUDA graph. Deterministic.
    """
    check_dtype(topk_idx, "topk_idx", (torch.int32, torch.int64))
    check_rank(topk_idx, "topk_idx", 2)
    _check_int(num_experts, "num_experts", 1, MAX_EXPERTS)
    num_tokens, k = topk_idx.shape
    num_slots = num_tokens * k
    max_rows = contiguous_max_rows(num_slots, num_experts)
    if max_rows > _INT32_LIMIT:
        raise ValueError(f"topk_idx has too many slots ({num_slots}) for int32 row indices: split it")
    if not topk_idx.is_contiguous():
        raise ValueError(f"topk_idx must be contiguous, got strides {tuple(topk_idx.stride())}")
    if max_tokens is not None:
        _check_int(max_tokens, "max_tokens", 1, _INT32_LIMIT // num_experts)
    check_cuda_device(topk_idx, "topk_idx")

    new_int32 = functools.partial(topk_idx.new_empty, dtype=torch.int32)
    layout = MoeLayout(
        counts=new_int32((num_experts,)), num_rows=new_int32((1,)), m_indices=new_int32((max_rows,)),
        row_to_slot=new_int32((max_rows,)), slot_to_row=new_int32((num_tokens, k)),
        masked_slots=None if max_tokens is None else new_int32((num_experts, max_tokens)),
        masked_m=None if max_tokens is None else new_int32((num_experts,)),
    )
    if num_slots == 0:
        for t in (layout.counts, layout.num_rows, layout.masked_m):
            if t is not None:
                t.zero_()
        if layout.masked_slots is not None:
            layout.masked_slots.fill_(-1)
        return layout

    count_kernel, layout_kernel = _layout_kernels(topk_idx.dtype)
    num_chunks = ceil_div(num_slots, _CHUNK_SLOTS)
    chunk_counts = new_int32((num_chunks, num_experts))
    device_index = topk_idx.get_device()
    count_kernel.launch((num_chunks, 1, 1), (topk_idx.data_ptr(), chunk_counts.data_ptr(), num_slots, num_experts),
                        device_index)
    masked = max_tokens is not None
    layout_kernel.launch((num_chunks, 1, 1), (
        topk_idx.data_ptr(), chunk_counts.data_ptr(), layout.counts.data_ptr(), layout.num_rows.data_ptr(),
        layout.m_indices.data_ptr(), layout.row_to_slot.data_ptr(), layout.slot_to_row.data_ptr(),
        layout.masked_slots.data_ptr() if masked else 0, layout.masked_m.data_ptr() if masked else 0,
        num_slots, num_experts, num_chunks, max_rows, max_tokens if masked else 0), device_index)
    return layout


def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this family."""
    gates = [
        (256, 8, "sigmoid"),        # DeepSeek-V3
        (384, 0, "sigmoid"),        # Kimi-K2
        (512, 8, "softmax"),        # the largest: 64 experts per group
        (72, 0, "sqrtsoftplus"),    # experts not a multiple of 32
        (64, 32, "softmax"),        # the most groups, smaller than a warp
    ]
    specs = []
    for dtype in (torch.float32, torch.bfloat16):
        specs.extend(_gate_spec(dtype, e, g, scoring) for e, g, scoring in gates)
    for dtype in (torch.int32, torch.int64):
        specs.extend((_count_spec(dtype), _layout_spec(dtype)))
    return specs
