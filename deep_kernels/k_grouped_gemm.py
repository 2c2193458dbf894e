"""K-grouped FP8 GEMMs for mixture-of-experts weight gradients: D[g] = A_g @ B_g^T (+ C[g]) for every expert g, where
A_g and B_g are expert g's segment of the tokens along K, on the FP8 GEMM kernel's KGrouped kind with 1 x 128
scales on both operands (the weight-gradient recipe (1, 1, 128)).

Layouts (DeepGEMM's names and argument order):
    nt  a [M, sum k] float8_e4m3fn, K-major (rows 16-byte aligned); sfa [M, sum k / 128], one scale per row and 128
        columns: exactly what per_channel_cast_transpose_to_fp8 returns for the [sum k, M] gradient (its MN-major
        FP32 scales are read as they are; row-major FP32 and packed UE8M0 int32 [M, ceil(sum k / 512)] are
        converted first, an extra pass). b [N, sum k] and sfb [N, sum k / 128] likewise.
    tn  the same operands as the transposed views the name implies: a [sum k, M] with a.T K-major (a = q.T of the
        cast's q), sfa [sum k / 128, M] (its scales transposed); b and sfb likewise. A [sum k, M] tensor stored
        M-major (contiguous) is refused: Hopper's FP8 tensor cores read K-major operands only.
    d   [G, M, N] FP32, contiguous; c (optional) FP32 [G, M, N], added to the products; c may be d.
    ks  the experts' token counts k_g, each a multiple of 128 (the contiguous layout pads each expert's segment to
        it), 0 allowed: a host list (the shapes, validation and tile choice) and the same values as an int32 CUDA
        tensor ks_tensor [G], which the kernel reads (the K segments' offsets are their prefix sums, computed on the
        device). ks=None: the sizes are on the device only (no host synchronization, traceable with shapes alone);
        a and b's sum k is then an upper bound of their sum (e.g. a MoE layout's worst-case rows) and the columns
        after the groups' segments are never read.
Constraints: N a multiple of 16; M >= 0.
"""

import torch

from deep_kernels import gemm
from deep_kernels.call_cache import call_signature
from deep_kernels.device import get_num_sms
from deep_kernels.gemm import (
    CHANNEL_SCALED, SCALE_BLOCK, apply_config_override, check_n, get_gemm_kernel, kernel_spec,
    operands_of_recipe, scale_a, scale_b_channels,
)
from deep_kernels.grouped_gemm import check_grouped_addresses, launch_grouped
from deep_kernels.heuristics import k_grouped_fp8_gemm as heuristics
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import tensor_map
from deep_kernels.validation import (
    INT32_LIMIT, check_aligned, check_cuda_device, check_deepgemm_options, check_dtype, check_rank,
    check_row_major_rows, deepgemm_alias, is_traced,
)

# The kernel compiles for any K: the groups' sizes come from the device.
KERNEL_SHAPE_K = 0

_plans = {}


def plan_of(config, m: int, n: int, num_groups: int, accumulate: bool, num_sms: int) -> tuple:
    """(kernel, config, grid) of a config."""
    kernel = get_gemm_kernel(config, n, KERNEL_SHAPE_K, torch.float32, accumulate, heuristics.GEMM_TYPE, CHANNEL_SCALED)
    return kernel, config, (heuristics.grid_size(config, m, n, num_groups, num_sms), 1, 1)


def _plan(m: int, n: int, total_k: int, num_groups: int, accumulate: bool):
    """(kernel, config, grid) of a problem; one dict lookup once seen. DK_FP8_GEMM_CONFIG applies over the model's
    pick (without split-K; the epilogue overlap where the kind has it)."""
    num_sms = get_num_sms()
    key = (m, n, total_k, num_groups, accumulate, num_sms)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = plan_of(chosen_config(m, n, total_k, num_groups, accumulate, num_sms), m, n, num_groups,
                                     accumulate, num_sms)
    return plan


def chosen_config(m: int, n: int, total_k: int, num_groups: int, accumulate: bool, num_sms: int):
    """The model's pick for a problem, with DK_FP8_GEMM_CONFIG's fields over it (_plan's config)."""
    config = heuristics.get_k_grouped_fp8_gemm_config(m, n, total_k, num_groups, num_sms, accumulate)
    override = gemm._config_override()
    if override:
        config = heuristics.with_kind_overlap(apply_config_override(
            config, override, heuristics.OUT_DTYPE_BYTES, max(total_k, SCALE_BLOCK), operands=CHANNEL_SCALED))
        if config.num_splits != 1:
            raise ValueError("DK_FP8_GEMM_CONFIG: the k-grouped GEMM takes no split-K")
    return config


def group_size_arguments(ks, ks_tensor, ks_cpu, grouped_layout) -> tuple:
    """(ks, ks_tensor) of a k-grouped call under either spelling: ks and ks_tensor (ours, and DeepGEMM's first), or
    DeepGEMM's current keywords ks_cpu and grouped_layout; one name of each pair."""
    return (deepgemm_alias(ks, ks_cpu, "ks", "ks_cpu", "the group sizes", required=False),
            deepgemm_alias(ks_tensor, grouped_layout, "ks_tensor", "grouped_layout", "the device group sizes"))


def check_group_sizes(ks, ks_tensor, total_k: int, alignment: int = SCALE_BLOCK) -> int:
    """The host list ks (each a non-negative multiple of `alignment`, the kernel's K block, summing to total_k) and
    ks_tensor (int32 [G]); returns G. ks None: ks_tensor's shape alone (its values stay on the device)."""
    if ks is None:
        check_dtype(ks_tensor, "ks_tensor", (torch.int32,))
        if ks_tensor.dim() != 1 or ks_tensor.numel() == 0 or not ks_tensor.is_contiguous():
            raise ValueError(f"ks_tensor must be a non-empty contiguous int32 tensor [G], got shape "
                             f"{tuple(ks_tensor.shape)} strides {tuple(ks_tensor.stride())}")
        if total_k > INT32_LIMIT:
            raise ValueError(f"sum k = {total_k} exceeds the int32 range")
        return ks_tensor.numel()
    if not isinstance(ks, (list, tuple)) or not ks:
        raise TypeError(f"ks must be a non-empty list of ints (the tokens of each group), got {ks!r}")
    for g, k in enumerate(ks):
        if not isinstance(k, int) or isinstance(k, bool) or k < 0 or k % alignment:
            raise ValueError(f"ks[{g}] = {k!r}: every group's K must be a non-negative multiple of {alignment} "
                             "(pad each expert's tokens to it)")
    if sum(ks) != total_k:
        raise ValueError(f"ks sums to {sum(ks)} but a and b hold sum k = {total_k} columns")
    if total_k > INT32_LIMIT:
        raise ValueError(f"sum k = {total_k} exceeds the int32 range")
    check_dtype(ks_tensor, "ks_tensor", (torch.int32,))
    if tuple(ks_tensor.shape) != (len(ks),) or not ks_tensor.is_contiguous():
        raise ValueError(f"ks_tensor must be a contiguous int32 tensor of shape ({len(ks)},) (one entry per group of "
                         f"ks), got shape {tuple(ks_tensor.shape)} strides {tuple(ks_tensor.stride())}")
    return len(ks)


def _check_operand(t, scales, name: str, scale_name: str) -> tuple:
    """An operand [rows, sum k] K-major with its scales [rows, sum k / 128]; returns (rows, sum k, kernel scales)."""
    check_dtype(t, name, (torch.float8_e4m3fn,))
    check_rank(t, name, 2)
    rows, total_k = t.shape
    check_row_major_rows(t, name)
    if total_k % SCALE_BLOCK:
        raise ValueError(f"{name} has sum k = {total_k} columns: it must be a multiple of {SCALE_BLOCK}")
    kernel_scales = (scale_a(scales, rows, total_k // SCALE_BLOCK) if scale_name == "sfa"
                     else scale_b_channels(scales, rows, total_k // SCALE_BLOCK))
    return rows, total_k, kernel_scales


def _check_call(a, sfa, b, sfb, d, ks, ks_tensor, c) -> tuple:
    """Full validation; returns (m, n, sum k, G, whether sfa and sfb are already in the kernel's layouts)."""
    m, total_k, kernel_sfa = _check_operand(a, sfa, "a", "sfa")
    n, b_k, kernel_sfb = _check_operand(b, sfb, "b", "sfb")
    if b_k != total_k:
        raise ValueError(f"a is [M, sum k] = {tuple(a.shape)} but b is [N, sum k] = {tuple(b.shape)}: sum k differs")
    check_n(n)
    num_groups = check_group_sizes(ks, ks_tensor, total_k)
    check_dtype(d, "d", (torch.float32,))
    if tuple(d.shape) != (num_groups, m, n) or not d.is_contiguous():
        raise ValueError(f"d must be a contiguous FP32 [G, M, N] = {(num_groups, m, n)} tensor, got shape "
                         f"{tuple(d.shape)} strides {tuple(d.stride())}")
    check_aligned(d, "d")
    named = [(a, "a"), (sfa, "sfa"), (b, "b"), (sfb, "sfb"), (d, "d"), (ks_tensor, "ks_tensor")]
    if c is not None:
        check_dtype(c, "c", (torch.float32,))
        if tuple(c.shape) != (num_groups, m, n):
            raise ValueError(f"c must have shape [G, M, N] = {(num_groups, m, n)}, got {tuple(c.shape)}")
        named.append((c, "c"))
    for tensor, name in named:
        check_cuda_device(tensor, name, like=a)
    return m, n, total_k, num_groups, kernel_sfa is sfa and kernel_sfb is sfb


def checked_k_grouped_call(checked_calls: dict, check, args: tuple, signature_tensors: tuple, ks, ks_tensor,
                           block_k: int) -> tuple:
    """(check(*args), the prepared launches) of a k-grouped call, kept in checked_calls: the full check once per
    signature (signature_tensors' call_signature and the number of host group sizes), and the group sizes, which
    change from step to step, on every call (never a cache key)."""
    try:
        signature = (call_signature(*signature_tensors), None if ks is None else len(ks))
    except (AttributeError, TypeError):  # not tensors or not a list: the full check says which
        signature = None
    checked = checked_calls.get(signature)
    if checked is None:
        checked = (check(*args), {})
        if signature is not None:
            checked_calls[signature] = checked
    else:
        check_group_sizes(ks, ks_tensor, checked[0][2], block_k)
    return checked


def write_empty_groups(inputs: tuple, names: tuple, d: torch.Tensor, c: torch.Tensor, tma_read: tuple) -> torch.Tensor:
    """d of a k-grouped call whose groups are all empty: c (or zeros), once the addresses passed, as launch_grouped
    would check them."""
    check_grouped_addresses(inputs, names, d, tma_read)
    if c is None:
        return d.zero_()
    return d if c.data_ptr() == d.data_ptr() else d.copy_(c)


def _check_recipe(recipe) -> None:
    if operands_of_recipe(recipe) != CHANNEL_SCALED:
        raise ValueError(f"the k-grouped FP8 GEMM takes recipe (1, 1, 128) (1 x 128 scales on both operands), got "
                         f"{recipe!r}")


def _split_pairs(a, b) -> tuple:
    if not (isinstance(a, (tuple, list)) and len(a) == 2 and isinstance(b, (tuple, list)) and len(b) == 2):
        raise TypeError("a and b must be (tensor, scales) pairs")
    return (*a, *b)


# Signatures of calls that passed validation (with their number of host group sizes) -> (what _check_call returned,
# the prepared launches by address set and plan, as call_cache.checked_call keeps them). The group sizes are checked
# on every call, so these calls keep a cache of their own.
_checked_calls = {}

# What the kernel reads, by name, in launch_grouped's order; it reads the four operand tensors by TMA.
K_GROUPED_INPUTS = ("a", "sfa", "b", "sfb", "ks_tensor")
_TMA_READ = ("a", "sfa", "b", "sfb")


def k_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, ks=None, ks_tensor: torch.Tensor = None,
                                     c: torch.Tensor = None, recipe=(1, 1, 128), *, ks_cpu=None,
                                     grouped_layout: torch.Tensor = None, compiled_dims: str = "nk") -> torch.Tensor:
    """d[g] = a_g @ b_g^T (+ c[g]) for every group g, a_g and b_g the g-th segment of k_g columns (module docstring).

    Args:
        a: (a [M, sum k] float8_e4m3fn K-major, sfa [M, sum k / 128]) as per_channel_cast_transpose_to_fp8
            returns it for the [sum k, M] output gradient.
        b: (b [N, sum k] float8_e4m3fn K-major, sfb [N, sum k / 128]) likewise for the [sum k, N] activations.
        d: [G, M, N] FP32 output.
        ks: host list of the G groups' K (tokens), each a non-negative multiple of 128, summing to sum k; or None:
            the sizes are ks_tensor's alone, each a non-negative multiple of 128 summing to at most sum k (not
            checked: that would read them on the host).
        ks_tensor: int32 CUDA tensor [G] holding the same values; the kernel reads it (no host synchronisation).
        c: optional FP32 [G, M, N] added to the products; may be d itself (accumulating into the gradients).
        recipe: (1, 1, 128), the only recipe of this GEMM.
        ks_cpu, grouped_layout: DeepGEMM's current keywords for ks and ks_tensor, in their place (not both).
        compiled_dims: DeepGEMM's option, accepted so that its calls run unchanged; it changes nothing here
            (validation.check_deepgemm_options).

    Returns:
        d.

    Notes:
        A group with k_g = 0 gets d[g] = c[g] (zeros without c). ks_tensor must hold ks: it alone places the
        groups' segments on the device, and other values give other sums (never a fault: loads past sum k read
        zeros). Each 128-deep K block of a group is accumulated by the tensor cores, then scaled by sfa[row] *
        sfb[column] and added in FP32 registers. Deterministic (fixed reduction order). A call whose tensors have
        the dtypes, shapes, strides and devices of an earlier valid call (with as many groups) checks only ks again.
    """
    check_deepgemm_options(compiled_dims)
    ks, ks_tensor = group_size_arguments(ks, ks_tensor, ks_cpu, grouped_layout)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c, recipe)
    a, sfa, b, sfb = _split_pairs(a, b)
    _check_recipe(recipe)
    (m, n, total_k, num_groups, scales_ready), launches = checked_k_grouped_call(
        _checked_calls, _check_call, (a, sfa, b, sfb, d, ks, ks_tensor, c), (a, sfa, b, sfb, d, ks_tensor, c), ks,
        ks_tensor, SCALE_BLOCK)
    if not scales_ready:
        sfa = scale_a(sfa, m, total_k // SCALE_BLOCK)
        sfb = scale_b_channels(sfb, n, total_k // SCALE_BLOCK)
    if m == 0:
        return d
    inputs = (a, sfa, b, sfb, ks_tensor)
    if total_k == 0:
        return write_empty_groups(inputs, K_GROUPED_INPUTS, d, c, _TMA_READ)
    return launch_grouped(launches, _plan(m, n, total_k, num_groups, c is not None), _encode, inputs,
                          K_GROUPED_INPUTS, d, m, num_groups, c, _TMA_READ)


def _encode(kernel, config, a, sfa, b, sfb, ks_tensor, d, m: int, num_groups: int) -> bytes:
    return kernel.encode(
        tmap_a=tensor_map(a, (config.block_m, SCALE_BLOCK), 128),
        tmap_b=tensor_map(b, (config.block_n, SCALE_BLOCK), 128),
        tmap_sfa=tensor_map(sfa, (config.block_m, 1), transpose=True),
        tmap_d=tensor_map(d, (1, 64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes),
        sfb=sfb.data_ptr(), shape_m=m, grouped_layout=ks_tensor.data_ptr(), num_groups=num_groups, d=d.data_ptr(),
        split_workspace=0, split_tickets=0, num_unsplit_tiles=0,
        tmap_sfb=tensor_map(sfb, (config.block_n, 1), transpose=True))


def forced_config_call(config, a, b, d: torch.Tensor, ks, ks_tensor: torch.Tensor, c: torch.Tensor = None):
    """A function that runs k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c) with `config` in place of the
    chosen one (side-by-side timing of configs: scripts/sweep_wgrad_gemm.py); validated once, here, with
    kernel-ready scales and at least one non-empty group."""
    a, sfa, b, sfb = _split_pairs(a, b)
    m, n, total_k, num_groups, scales_ready = _check_call(a, sfa, b, sfb, d, ks, ks_tensor, c)
    if not scales_ready or total_k == 0 or m == 0:
        raise ValueError("forced_config_call takes kernel-ready scales and a non-empty problem")
    if c is not None and c.data_ptr() != d.data_ptr():
        raise ValueError("forced_config_call accumulates in place only (c is d)")
    plan, launches = plan_of(config, m, n, num_groups, c is not None, get_num_sms()), {}
    return lambda: launch_grouped(launches, plan, _encode, (a, sfa, b, sfb, ks_tensor), K_GROUPED_INPUTS, d, m,
                                  num_groups, tma_read=_TMA_READ)


def _k_major_view(t, scales, name: str, scale_name: str, rows_name: str) -> tuple:
    """(t.T, scales.T) of a tn operand t [sum k, rows] whose transpose is K-major; a clear error otherwise."""
    check_dtype(t, name, (torch.float8_e4m3fn,))
    check_rank(t, name, 2)
    if t.shape[1] > 1 and t.stride(0) != 1:
        raise ValueError(
            f"{name} [sum k, {rows_name}] must be the transpose of a K-major [{rows_name}, sum k] tensor (stride(0) == "
            f"1), got strides {tuple(t.stride())}: Hopper's FP8 tensor cores read K-major operands only. Pass "
            f"per_channel_cast_transpose_to_fp8(x)[0].T, or call k_grouped_fp8_gemm_nt_contiguous with its output")
    check_rank(scales, scale_name, 2)
    return t.T, scales.T


def k_grouped_fp8_gemm_tn_contiguous(a, b, d: torch.Tensor, ks=None, ks_tensor: torch.Tensor = None,
                                     c: torch.Tensor = None, recipe=(1, 1, 128), *, ks_cpu=None,
                                     grouped_layout: torch.Tensor = None, compiled_dims: str = "nk") -> torch.Tensor:
    """k_grouped_fp8_gemm_nt_contiguous with the operands as the tn layout names them: d[g] = a_g^T @ b_g (+ c[g]).

    Args:
        a: (a [sum k, M] float8_e4m3fn, sfa [sum k / 128, M]) with a.T K-major: the transposes of what
            per_channel_cast_transpose_to_fp8 returns (q.T, scales.T).
        b: (b [sum k, N], sfb [sum k / 128, N]) likewise.
        d, ks, ks_tensor, c, recipe, ks_cpu, grouped_layout: as for k_grouped_fp8_gemm_nt_contiguous.
        compiled_dims: DeepGEMM's option, accepted so that its calls run unchanged; it changes nothing here
            (validation.check_deepgemm_options).

    Returns:
        d.

    Notes:
        The transposed views are taken as they are (no copy). An M-major a or b (a contiguous [sum k, M] tensor)
        is refused with the cast that produces the K-major layout.
    """
    check_deepgemm_options(compiled_dims)
    ks, ks_tensor = group_size_arguments(ks, ks_tensor, ks_cpu, grouped_layout)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks, ks_tensor, c, recipe)
    a, sfa, b, sfb = _split_pairs(a, b)
    a_pair = _k_major_view(a, sfa, "a", "sfa", "M")
    b_pair = _k_major_view(b, sfb, "b", "sfb", "N")
    return k_grouped_fp8_gemm_nt_contiguous(a_pair, b_pair, d, ks, ks_tensor, c, recipe)


@precompiled
def precompile_specs() -> list:
    """Every kernel the k-grouped heuristics pick over the representative shapes."""
    return [kernel_spec(kernel.config, kernel.n, KERNEL_SHAPE_K, torch.float32, kernel.with_accumulation,
                        heuristics.GEMM_TYPE, CHANNEL_SCALED)
            for kernel in heuristics.all_candidate_kernels()]
