"""K-grouped BF16 GEMMs for mixture-of-experts weight gradients: D[g] = A_g @ B_g^T (+ C[g]) in FP32 for every expert
g, where A_g and B_g are expert g's segment of the tokens along K, on the SM90 GEMM engine's KGrouped kind with
Bf16 operands (HGMMA straight into the FP32 accumulators, no scales).

Layouts (DeepGEMM's names and argument order):
    nt  a [M, sum k] and b [N, sum k] bf16, each K-major (rows 16-byte aligned) or MN-major (a transposed view of a
        token-major [sum k, M] tensor: wgmma reads it transposed, no copy).
    tn  a [sum k, M] and b [sum k, N]: the token-major output gradient and activations as training holds them
        (M- / N-contiguous), or transposed views of K-major tensors; the nt call on a.T and b.T.
    d   [G, M, N] FP32, contiguous; c (optional) FP32 [G, M, N], added to the products; c may be d.
    ks  the experts' token counts k_g, each a multiple of 64 (the kernel's K block; the contiguous layout's padding
        to 128 satisfies it), 0 allowed: a host list (the shapes, validation and tile choice) and the same values as
        an int32 CUDA tensor ks_tensor [G], which the kernel reads (the segments' offsets are their prefix sums,
        computed on the device).
Constraints: N a multiple of 16 (an N-major b: tiles of whole 64-column boxes); M >= 0.
"""

import torch

from deep_kernels.bf16_gemm import is_mn_major, operand_map
from deep_kernels.device import get_num_sms
from deep_kernels.gemm import FP8_GEMM, check_n
from deep_kernels.grouped_gemm import launch_grouped
from deep_kernels.heuristics import k_grouped_bf16_gemm as heuristics
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import get_kernel, tensor_map
from deep_kernels.k_grouped_gemm import (
    check_group_sizes, checked_k_grouped_call, group_size_arguments, write_empty_groups,
)
from deep_kernels.validation import (
    INT32_LIMIT, check_cuda_device, check_deepgemm_options, check_dtype, check_rank, is_traced,
)

BLOCK_K = heuristics.BLOCK_K

_plans = {}


def kernel_spec(config, n: int, accumulate: bool, mn_major_a: bool, mn_major_b: bool):
    return FP8_GEMM.spec(*heuristics.template_args(config, n, accumulate, mn_major_a, mn_major_b))


def _plan(m: int, n: int, total_k: int, num_groups: int, accumulate: bool, mn_major_a: bool, mn_major_b: bool):
    """(kernel, config, grid) of a problem; one dict lookup once seen."""
    num_sms = get_num_sms()
    key = (m, n, total_k, num_groups, accumulate, mn_major_a, mn_major_b, num_sms)
    plan = _plans.get(key)
    if plan is None:
        config = heuristics.get_k_grouped_bf16_gemm_config(m, n, total_k, num_groups, num_sms, accumulate,
                                                           mn_major_b=mn_major_b)
        kernel = get_kernel(kernel_spec(config, n, accumulate, mn_major_a, mn_major_b), smem_bytes=config.smem_bytes)
        plan = _plans[key] = (kernel, config, (heuristics.grid_size(config, m, n, num_groups, num_sms), 1, 1))
    return plan


def _check_call(a, b, d, ks, ks_tensor, c) -> tuple:
    """Full validation; returns (m, n, sum k, G, whether a is M-major, whether b is N-major)."""
    check_rank(a, "a", 2)
    check_rank(b, "b", 2)
    mn_major_a = is_mn_major(a, "a", "M")
    mn_major_b = is_mn_major(b, "b", "N")
    m, total_k = a.shape
    n = b.shape[0]
    if b.shape[1] != total_k:
        raise ValueError(f"a is [M, sum k] = {tuple(a.shape)} but b is [N, sum k] = {tuple(b.shape)}: sum k differs")
    check_n(n)
    if total_k > INT32_LIMIT:
        raise ValueError(f"sum k = {total_k} exceeds the int32 range")
    num_groups = check_group_sizes(ks, ks_tensor, total_k, BLOCK_K)
    check_dtype(d, "d", (torch.float32,))
    if tuple(d.shape) != (num_groups, m, n) or not d.is_contiguous():
        raise ValueError(f"d must be a contiguous FP32 [G, M, N] = {(num_groups, m, n)} tensor, got shape "
                         f"{tuple(d.shape)} strides {tuple(d.stride())}")
    named = [(a, "a"), (b, "b"), (d, "d"), (ks_tensor, "ks_tensor")]
    if c is not None:
        check_dtype(c, "c", (torch.float32,))
        if tuple(c.shape) != (num_groups, m, n):
            raise ValueError(f"c must have shape [G, M, N] = {(num_groups, m, n)}, got {tuple(c.shape)}")
        named.append((c, "c"))
    for tensor, name in named:
        check_cuda_device(tensor, name, like=a)
    return m, n, total_k, num_groups, mn_major_a, mn_major_b


# Signatures of calls that passed validation (with their number of host group sizes) -> (what _check_call returned,
# the prepared launches), as in k_grouped_gemm.
_checked_calls = {}

# What the kernel reads, by name, in launch_grouped's order; it reads a and b by TMA.
K_GROUPED_INPUTS = ("a", "b", "ks_tensor")
_TMA_READ = ("a", "b")


def k_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks=None,
                                      ks_tensor: torch.Tensor = None, c: torch.Tensor = None, *, ks_cpu=None,
                                      grouped_layout: torch.Tensor = None, compiled_dims: str = "nk") -> torch.Tensor:
    """d[g] = a_g @ b_g^T (+ c[g]) for every group g, a_g and b_g the g-th segment of k_g columns (module docstring).

    Args:
        a: [M, sum k] bf16, K-major, or M-major (dy.T of the token-major output gradient dy [sum k, M]).
        b: [N, sum k] bf16, K-major, or N-major (x.T of the token-major activations x [sum k, N]).
        d: [G, M, N] FP32 output.
        ks: host list of the G groups' K (tokens), each a non-negative multiple of 64, summing to sum k.
        ks_tensor: int32 CUDA tensor [G] holding the same values; the kernel reads it (no host synchronisation).
        c: optional FP32 [G, M, N] added to the products; may be d itself (accumulating into the gradients).
        ks_cpu, grouped_layout: DeepGEMM's current keywords for ks and ks_tensor, in their place (not both).
        compiled_dims: DeepGEMM's option, accepted so that its calls run unchanged; it changes nothing here
            (validation.check_deepgemm_options).

    Returns:
        d.

    Notes:
        A group with k_g = 0 gets d[g] = c[g] (zeros without c). ks_tensor must hold ks: it alone places the
        groups' segments on the device, and other values give other sums (never a fault: loads past sum k read
        zeros). FP32 accumulation by the tensor cores over each group's K; deterministic (fixed reduction order).
        A call whose tensors have the dtypes, shapes, strides and devices of an earlier valid call (with as many
        groups) checks only ks again.
    """
    check_deepgemm_options(compiled_dims)
    ks, ks_tensor = group_size_arguments(ks, ks_tensor, ks_cpu, grouped_layout)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.k_grouped_bf16_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c)
    (m, n, total_k, num_groups, mn_major_a, mn_major_b), launches = checked_k_grouped_call(
        _checked_calls, _check_call, (a, b, d, ks, ks_tensor, c), (a, b, d, ks_tensor, c), ks, ks_tensor, BLOCK_K)
    if m == 0:
        return d
    inputs = (a, b, ks_tensor)
    if total_k == 0:
        return write_empty_groups(inputs, K_GROUPED_INPUTS, d, c, _TMA_READ)
    return launch_grouped(launches, _plan(m, n, total_k, num_groups, c is not None, mn_major_a, mn_major_b), _encode,
                          inputs, K_GROUPED_INPUTS, d, m, num_groups, c, _TMA_READ)


def _encode(kernel, config, a, b, ks_tensor, d, m: int, num_groups: int) -> bytes:
    map_a = operand_map(a, config.block_m, is_mn_major(a, "a", "M"))
    # NOTE: the kernel reads no scales with BF16 operands; tmap_sfa and tmap_sfb take A's map so that every parameter
    # is valid.
    return kernel.encode(
        tmap_a=map_a, tmap_b=operand_map(b, config.block_n, is_mn_major(b, "b", "N")), tmap_sfa=map_a,
        tmap_d=tensor_map(d, (1, 64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes),
        sfb=0, shape_m=m, grouped_layout=ks_tensor.data_ptr(), num_groups=num_groups, d=d.data_ptr(),
        split_workspace=0, split_tickets=0, num_unsplit_tiles=0, tmap_sfb=map_a)


def k_grouped_bf16_gemm_tn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks=None,
                                      ks_tensor: torch.Tensor = None, c: torch.Tensor = None, *, ks_cpu=None,
                                      grouped_layout: torch.Tensor = None, compiled_dims: str = "nk") -> torch.Tensor:
    """d[g] = a_g^T @ b_g (+ c[g]): k_grouped_bf16_gemm_nt_contiguous(a.T, b.T, d, ks, ks_tensor, c).

    Args:
        a: [sum k, M] bf16: the token-major output gradient as it is (M-contiguous), or a transposed K-major view.
        b: [sum k, N] bf16: the token-major activations likewise.
        d, ks, ks_tensor, c, ks_cpu, grouped_layout: as for k_grouped_bf16_gemm_nt_contiguous.
        compiled_dims: DeepGEMM's option, accepted so that its calls run unchanged; it changes nothing here
            (validation.check_deepgemm_options).

    Returns:
        d.
    """
    check_deepgemm_options(compiled_dims)
    check_rank(a, "a", 2)
    check_rank(b, "b", 2)
    return k_grouped_bf16_gemm_nt_contiguous(a.t(), b.t(), d, ks, ks_tensor, c, ks_cpu=ks_cpu,
                                             grouped_layout=grouped_layout)


@precompiled
def precompile_specs() -> list:
    """Every kernel the k-grouped BF16 heuristics pick over the representative shapes."""
    return [FP8_GEMM.spec(*kernel.template_args()) for kernel in heuristics.all_candidate_kernels()]
