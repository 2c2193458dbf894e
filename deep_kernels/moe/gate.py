"""Top-k expert gating of router logits.

topk_gate (DeepSeek-V3 semantics, bit-exact with deep_kernels.reference.moe):
    score  = softmax | sigmoid | sqrt(softplus) of the logits, in fp32; key = score + bias (optional)
    groups: a group's key is the sum of its two largest expert keys; only the topk_groups best groups
            stay eligible
    the k largest eligible keys in descending order, ties to the lower index (groups likewise); NaN keys
    rank as -inf, so NaN/Inf logits still give distinct in-range indices
    weight = the chosen expert's unbiased score, / (sum of the k scores + 1e-20) when renormalizing,
             times routed_scaling_factor
    Sums run in a fixed order (see the reference), so results are deterministic.
"""

import functools
from typing import NamedTuple

import torch

from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, get_kernel, remember_launch
from deep_kernels.jit.source import KernelSpec
from deep_kernels.validation import (
    INT32_LIMIT, ceil_div, check_bool, check_cuda_device, check_dtype, check_fp32_number, check_int_range, check_rank,
    is_traced,
)

MAX_EXPERTS = 512  # csrc/kernels/smxx_moe_slots.cuh: kMaxMoeExperts
MAX_TOP_K = 16
MAX_GROUPS = 32
RENORMALIZE_EPSILON = 1e-20
SOFTPLUS_THRESHOLD = 20.0


# The scoring functions by name, and their GateScoring enumerator (csrc/kernels/smxx_topk_gate.cuh).
SCORINGS = {"softmax": "Softmax", "sigmoid": "Sigmoid", "sqrtsoftplus": "SqrtSoftplus"}


_GATE_WARPS = 4


def _check_scoring(scoring) -> None:
    if not isinstance(scoring, str) or scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {list(SCORINGS)}, got {scoring!r}")


def _check_groups(num_experts: int, k: int, num_groups, topk_groups) -> None:
    check_int_range(num_groups, "num_groups", 0, MAX_GROUPS)
    if num_groups == 0:
        if isinstance(topk_groups, bool) or not isinstance(topk_groups, int) or topk_groups != 0:
            raise ValueError(f"topk_groups must be 0 without groups (num_groups=0), got {topk_groups!r}")
        return
    if num_experts % num_groups != 0 or num_experts // num_groups < 2:
        raise ValueError(f"num_groups ({num_groups}) must divide the {num_experts} experts into groups of "
                         f"at least 2")
    check_int_range(topk_groups, "topk_groups", 1, num_groups)
    eligible = topk_groups * (num_experts // num_groups)
    if k > eligible:
        raise ValueError(f"k ({k}) must not exceed the {eligible} experts of the topk_groups={topk_groups} groups")


def scoring_cpp(scoring: str) -> str:
    """The GateScoring enumerator of a scoring name."""
    return "deep_kernels::GateScoring::" + SCORINGS[scoring]


TOPK_GATE = KernelDef(
    "kernels/smxx_topk_gate.cuh", "smxx_topk_gate_impl",
    template=("InT", "NUM_EXPERTS", "NUM_GROUPS", "kScoring", "kNumWarps"),
    params=(Param("logits", PTR), Param("bias", PTR), Param("weights", PTR), Param("indices", PTR),
            Param("num_tokens", U32), Param("logits_row_stride", U32), Param("top_k", U32), Param("topk_groups", U32),
            Param("renormalize", U32), Param("scaling_factor", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _gate_spec(dtype: torch.dtype, num_experts: int, num_groups: int, scoring: str) -> KernelSpec:
    return TOPK_GATE.spec(InT=dtype, NUM_EXPERTS=num_experts, NUM_GROUPS=num_groups, kScoring=scoring_cpp(scoring),
                          kNumWarps=_GATE_WARPS)


@functools.lru_cache(maxsize=None)
def _gate_kernel(dtype: torch.dtype, num_experts: int, num_groups: int, scoring: str):
    return get_kernel(_gate_spec(dtype, num_experts, num_groups, scoring))


def check_gate_args(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor) -> None:
    """topk_gate's validation (every check but the device's), shared with the fused gate + layout."""
    check_dtype(logits, "logits", (torch.float32, torch.bfloat16))
    check_rank(logits, "logits", 2)
    num_tokens, num_experts = logits.shape
    check_int_range(num_experts, "logits.shape[1] (the expert count)", 1, MAX_EXPERTS)
    check_int_range(k, "k", 1, min(MAX_TOP_K, num_experts))
    _check_scoring(scoring)
    _check_groups(num_experts, k, num_groups, topk_groups)
    _check_logits_strides(logits)
    if bias is not None:
        check_dtype(bias, "bias", (torch.float32,))
        if tuple(bias.shape) != (num_experts,) or not bias.is_contiguous():
            raise ValueError(f"bias must be a contiguous tensor of shape ({num_experts},), got shape "
                             f"{tuple(bias.shape)} strides {tuple(bias.stride())}")
    _check_weight_args(renormalize, routed_scaling_factor)


def _check_logits_strides(logits: torch.Tensor) -> None:
    num_tokens, num_experts = logits.shape
    if num_experts > 1 and logits.stride(1) != 1:
        raise ValueError(f"logits must have a contiguous last dimension, got strides {tuple(logits.stride())}")
    if num_tokens > 1 and not 0 <= logits.stride(0) <= INT32_LIMIT:
        raise ValueError(f"logits row stride must be in [0, 2^31), got {logits.stride(0)}")


def _check_weight_args(renormalize, routed_scaling_factor) -> None:
    check_bool(renormalize, "renormalize")
    check_fp32_number(routed_scaling_factor, "routed_scaling_factor")  # the kernel multiplies by it in FP32


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
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.topk_gate(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor)
    try:
        signature = gate_signature(logits, k, scoring, bias, num_groups, topk_groups, renormalize,
                                   routed_scaling_factor)
        plan = _plans.get(signature)
    except (AttributeError, TypeError):  # not tensors, or unhashable arguments: the full check below says which
        signature = plan = None
    if plan is None:
        plan = _plan(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor)
        if signature is not None:
            _plans[signature] = plan

    weights = torch.empty(plan.shape, dtype=torch.float32, device=plan.device)
    indices = torch.empty(plan.shape, dtype=torch.int32, device=plan.device)
    if plan.kernel is None:  # no tokens
        return weights, indices
    key = (logits.data_ptr(), 0 if bias is None else bias.data_ptr(), weights.data_ptr(), indices.data_ptr())
    launch = plan.launches.get(key)
    if launch is None:
        encoded = plan.kernel.encode(
            logits=key[0], bias=key[1], weights=key[2], indices=key[3], num_tokens=plan.shape[0],
            logits_row_stride=logits.stride(0), top_k=k, topk_groups=topk_groups, renormalize=int(renormalize),
            scaling_factor=float(routed_scaling_factor))
        launch = remember_launch(plan.launches, key, plan.kernel.prepare(plan.grid, plan.device.index, encoded))
    launch.launch(current_raw_stream(plan.device.index))
    return weights, indices


def gate_signature(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor) -> tuple:
    """What topk_gate's validation depends on, bar data addresses: the tensors' dtypes, shapes, strides and devices,
    the other arguments with their types (8 == 8.0 == True for a dict, not for the checks). Raises AttributeError
    for non-tensors; hashing it raises TypeError for unhashable arguments."""
    return (logits.dtype, logits.shape, logits.stride(), logits.get_device(),
            None if bias is None else (bias.dtype, bias.shape, bias.stride(), bias.get_device()),
            k, scoring, num_groups, topk_groups, renormalize, routed_scaling_factor,
            type(k), type(scoring), type(num_groups), type(topk_groups), type(renormalize), type(routed_scaling_factor))


class _Plan(NamedTuple):
    """What a valid call's signature fixes: the outputs' shape and device, the kernel and its grid (None without
    tokens), and the prepared launches by the call's addresses."""

    shape: tuple
    device: torch.device
    kernel: object = None
    grid: tuple = None
    launches: dict = None


# Signatures of valid calls (gate_signature) -> their _Plan: a repeated call runs no check but the look-up.
_plans = {}


def _plan(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor) -> _Plan:
    """Every check of a call (raising its error), and its _Plan."""
    check_gate_args(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor)
    check_cuda_device(logits, "logits")
    if bias is not None:
        check_cuda_device(bias, "bias", like=logits)
    num_tokens, num_experts = logits.shape
    if num_tokens == 0:
        return _Plan((num_tokens, k), logits.device)
    kernel = _gate_kernel(logits.dtype, num_experts, kernel_groups(num_groups), scoring)
    return _Plan((num_tokens, k), logits.device, kernel, (ceil_div(num_tokens, _GATE_WARPS), 1, 1), {})


def kernel_groups(num_groups: int) -> int:
    """The NUM_GROUPS a kernel is specialized for: one group with topk_groups = 1 keeps every expert
    eligible, which the ungrouped kernel does the same."""
    return num_groups if num_groups > 1 else 0


TOPK_GATE_BACKWARD = KernelDef(
    "kernels/smxx_topk_gate_backward.cuh", "smxx_topk_gate_backward_impl",
    template=("InT", "NUM_EXPERTS", "kScoring", "kNumWarps"),
    params=(Param("grad_weights", PTR), Param("logits", PTR), Param("indices", PTR), Param("grad_logits", PTR),
            Param("num_tokens", U32), Param("logits_row_stride", U32), Param("top_k", U32), Param("renormalize", U32),
            Param("scaling_factor", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _backward_spec(dtype: torch.dtype, num_experts: int, scoring: str) -> KernelSpec:
    return TOPK_GATE_BACKWARD.spec(InT=dtype, NUM_EXPERTS=num_experts, kScoring=scoring_cpp(scoring),
                                   kNumWarps=_GATE_WARPS)


@functools.lru_cache(maxsize=None)
def _backward_kernel(dtype: torch.dtype, num_experts: int, scoring: str):
    return get_kernel(_backward_spec(dtype, num_experts, scoring))


def topk_gate_backward(grad_weights: torch.Tensor, logits: torch.Tensor, indices: torch.Tensor,
                       scoring: str = "softmax", renormalize: bool = True, routed_scaling_factor: float = 1.0,
                       out: torch.Tensor = None) -> torch.Tensor:
    """The gradient of topk_gate's weights with respect to the logits.

    Args:
        grad_weights: [T, k] float32 CUDA tensor, contiguous: the gradient of the loss by the weights.
        logits: the forward's [T, E] float32 or bfloat16 logits, last dimension contiguous.
        indices: the forward's [T, k] int32 indices, contiguous (distinct per token, as topk_gate returns;
            an index outside [0, E) counts as a score of 0 and receives no gradient).
        scoring, renormalize, routed_scaling_factor: the forward's.
        out: optional contiguous float32 [T, E] to write into.

    Returns:
        grad_logits: float32 [T, E], contiguous (float32 whatever the logits' dtype; cast it if needed).

    Notes:
        The gradient flows through the scores -> the chosen scores -> the renormalization -> the scaling;
        the bias and the selection are not differentiated. Softmax's gradient reaches all E logits;
        sigmoid's and sqrtsoftplus's only the chosen ones (0 elsewhere, and 0 where sqrt(softplus)
        underflowed to 0). Deterministic; bit-exact with deep_kernels.reference.moe.topk_gate_backward,
        whose docstring gives the operation order.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.topk_gate_backward(grad_weights, logits, indices, scoring, renormalize, routed_scaling_factor, out)
    check_dtype(grad_weights, "grad_weights", (torch.float32,))
    check_rank(grad_weights, "grad_weights", 2)
    check_dtype(logits, "logits", (torch.float32, torch.bfloat16))
    check_rank(logits, "logits", 2)
    check_dtype(indices, "indices", (torch.int32,))
    num_tokens, num_experts = logits.shape
    check_int_range(num_experts, "logits.shape[1] (the expert count)", 1, MAX_EXPERTS)
    k = grad_weights.shape[1]
    check_int_range(k, "grad_weights.shape[1] (k)", 1, min(MAX_TOP_K, num_experts))
    if tuple(grad_weights.shape) != (num_tokens, k) or tuple(indices.shape) != (num_tokens, k):
        raise ValueError(f"grad_weights and indices must both be [{num_tokens}, k] like the logits' rows, got "
                         f"{tuple(grad_weights.shape)} and {tuple(indices.shape)}")
    if not grad_weights.is_contiguous() or not indices.is_contiguous():
        raise ValueError("grad_weights and indices must be contiguous")
    _check_logits_strides(logits)
    _check_scoring(scoring)
    _check_weight_args(renormalize, routed_scaling_factor)
    if out is not None:
        check_dtype(out, "out", (torch.float32,))
        if tuple(out.shape) != (num_tokens, num_experts) or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous [{num_tokens}, {num_experts}] tensor, got shape "
                             f"{tuple(out.shape)} strides {tuple(out.stride())}")
    check_cuda_device(logits, "logits")
    check_cuda_device(grad_weights, "grad_weights", like=logits)
    check_cuda_device(indices, "indices", like=logits)
    if out is not None:
        check_cuda_device(out, "out", like=logits)

    grad_logits = logits.new_empty((num_tokens, num_experts), dtype=torch.float32) if out is None else out
    if num_tokens == 0:
        return grad_logits
    kernel = _backward_kernel(logits.dtype, num_experts, scoring)
    kernel.launch((ceil_div(num_tokens, _GATE_WARPS), 1, 1), logits.get_device(),
                  grad_weights=grad_weights.data_ptr(), logits=logits.data_ptr(), indices=indices.data_ptr(),
                  grad_logits=grad_logits.data_ptr(), num_tokens=num_tokens, logits_row_stride=logits.stride(0),
                  top_k=k, renormalize=int(renormalize), scaling_factor=float(routed_scaling_factor))
    return grad_logits


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    gates = [
        (256, 8, "sigmoid"),        # DeepSeek-V3
        (384, 0, "sigmoid"),        # Kimi-K2
        (512, 8, "softmax"),        # the largest: 64 experts per group
        (72, 0, "sqrtsoftplus"),    # experts not a multiple of 32
        (64, 32, "softmax"),        # the most groups, smaller than a warp
        (8, 0, "sigmoid"),          # fewer experts than lanes
    ]
    specs = []
    for dtype in (torch.float32, torch.bfloat16):
        specs.extend(_gate_spec(dtype, e, g, scoring) for e, g, scoring in gates)
        specs.extend(_backward_spec(dtype, e, scoring) for e, _, scoring in gates)
    return specs
