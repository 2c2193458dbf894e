"""Grouped (mixture-of-experts) FP8 GEMMs: D_g = A_g @ B_g^T for every expert g, with the scaling of
fp8_gemm_nt, on the same kernel (its MGroupedContiguous / MGroupedMasked kinds) and block scheduler.

Layouts (DeepGEMM's, so switching is one line):
    contiguous  a [M_total, K] float8_e4m3fn, K-major: every expert's rows back to back, each expert's segment
                padded to get_m_alignment_for_contiguous_layout() = 128 rows (M_total a multiple of it);
                sfa FP32 [M_total, ceil(K / 128)] as for fp8_gemm_nt; m_indices [M_total] int32, each row's expert,
                -1 on padding rows (moe_layout's m_indices), or the same layout as offsets or DeepGEMM's psum row
                ends (deep_kernels.contiguous_layout); d [M_total, N] bf16.
    masked      a [G, M_max, K] float8_e4m3fn, K-major; sfa FP32 [G, M_max, ceil(K / 128)], MN-major per group
                (strides (M_4 * ceil(K / 128), 1, M_4), M_4 = M_max rounded up to 4; get_mn_major_tma_aligned_tensor
                makes it); masked_m [G] int32 on the device: rows 0 .. masked_m[g] - 1 of a[g] and d[g] are
                expert g's; d [G, M_max, N] bf16.
    both        b [G, N, K] float8_e4m3fn, K-major; sfb FP32 [G, ceil(N / 128), ceil(K / 128)]. Scales may also come
                row-major (FP32) or packed UE8M0 (int32, last dimension ceil(K / 512)), as for fp8_gemm_nt:
                they are then converted first (an extra pass and an allocation).
Constraints: K and N multiples of 16 (K past the last multiple of 128 as in gemm.py).
"""

import torch

from deep_kernels.device import get_num_sms, has_gpu, target_arch
from deep_kernels import gemm, tuning
from deep_kernels.call_cache import checked_call
from deep_kernels.contiguous_layout import call_m_indices, layout_argument, m_indices_from_offsets
from deep_kernels.gemm import (
    BLOCK_SCALED, SCALE_BLOCK, apply_config_override, check_k_n, get_gemm_kernel, kernel_spec,
    operands_of_recipe, scale_a, scale_b,
)
from deep_kernels.heuristics import grouped_fp8_gemm as heuristics
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, remember_launch, tensor_map
from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT
from deep_kernels.validation import (
    INT32_LIMIT, ceil_div, check_cuda_device, check_deepgemm_options, check_dtype, check_int_range,
    check_no_overlap, check_rank, check_row_major_rows, deepgemm_recipe, is_traced,
)

CONTIGUOUS = "m_grouped_contiguous"
MASKED = "m_grouped_masked"
# The ops `python -m deep_kernels tune --suite grouped_gemm` stores winners under, per kind.
TUNING_OPS = {CONTIGUOUS: "m_grouped_fp8_gemm_nt_contiguous", MASKED: "m_grouped_fp8_gemm_nt_masked"}


def get_m_alignment_for_contiguous_layout() -> int:
    """Rows every expert segment of the contiguous layout is padded to (moe_layout pads to the same)."""
    return CONTIGUOUS_ALIGNMENT


# DeepGEMM's newer name: its contiguous layouts pad M segments (and its K-grouped GEMMs' K groups) to the same 128.
get_mk_alignment_for_contiguous_layout = get_m_alignment_for_contiguous_layout
# DeepGEMM's name for the K-grouped GEMMs' padding of each group's tokens: 128 suits both (their K blocks are 128
# deep for FP8, 64 for BF16).
get_k_alignment_for_contiguous_layout = get_m_alignment_for_contiguous_layout


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m: int = None, num_groups: int = None) -> int:
    """DeepGEMM's per-call alignment hint (it may pick smaller segments for few rows an expert): here always the
    alignment every grouped kernel reads, 128, whatever the expected rows."""
    if expected_m is not None:
        check_int_range(expected_m, "expected_m", 0, INT32_LIMIT)
    if num_groups is not None:
        check_int_range(num_groups, "num_groups", 1, INT32_LIMIT)
    return CONTIGUOUS_ALIGNMENT


def set_mk_alignment_for_contiguous_layout(alignment: int) -> None:
    """DeepGEMM's setter of the contiguous layouts' alignment: the grouped kernels read 128-row segments only, so 128
    is taken (changing nothing) and any other value raises."""
    if alignment != CONTIGUOUS_ALIGNMENT or isinstance(alignment, bool):
        raise ValueError(f"the grouped GEMMs read expert segments padded to {CONTIGUOUS_ALIGNMENT} rows only "
                         f"(get_theoretical_mk_alignment_for_contiguous_layout() returns it), got {alignment!r}")


_plans = {}


def _plan(gemm_type: str, m: int, n: int, k: int, num_groups: int):
    """(kernel, config, grid) of a problem (m: total rows, or expected_m when masked); one dict lookup once seen.
    DK_FP8_GEMM_CONFIG applies here too, over the model's pick."""
    num_sms = get_num_sms()
    key = (gemm_type, m, n, k, num_groups, num_sms)
    plan = _plans.get(key)
    if plan is None:
        config = _tuned_config(gemm_type, m, n, k, num_groups, num_sms) or heuristics.get_grouped_fp8_gemm_config(
            gemm_type, m, n, k, num_groups, num_sms)
        override = gemm._config_override()
        if override:
            config = apply_config_override(config, override, 2, k, grouped=True)
        plan = _plans[key] = plan_of(gemm_type, config, m, n, k, num_sms)
    return plan


def plan_of(gemm_type: str, config, m: int, n: int, k: int, num_sms: int) -> tuple:
    """(kernel, config, grid) of a problem run with `config`."""
    kernel = get_gemm_kernel(config, n, k, torch.bfloat16, False, gemm_type)
    return kernel, config, (heuristics.grid_size(gemm_type, config, m, n, num_sms), 1, 1)


def _tuned_config(gemm_type: str, m: int, n: int, k: int, num_groups: int, num_sms: int):
    """The config `python -m deep_kernels tune --suite grouped_gemm` measured fastest on this GPU, or None."""
    if not has_gpu():
        return None
    path = tuning.tuning_file(torch.cuda.get_device_name())
    if not path.is_file():
        return None
    fields = tuning.lookup(path, TUNING_OPS[gemm_type],
                           tuning.source_identity(gemm.heuristics.KERNEL_HEADER, target_arch()),
                           tuning.grouped_problem_key(num_groups, m, n, k, num_sms))
    return None if fields is None else gemm.heuristics.make_config(out_dtype_bytes=2, **fields)


def _check_b(b, sfb, k: int) -> tuple:
    """b [G, N, K] with its scales; returns (G, N, sfb in the kernel's layout)."""
    check_dtype(b, "b", (torch.float8_e4m3fn,))
    check_rank(b, "b", 3)
    num_groups, n, b_k = b.shape
    if b_k != k:
        raise ValueError(f"a has K = {k} but b is [G, N, K] = {tuple(b.shape)}: K differs")
    check_k_n(k, n)
    check_row_major_rows(b, "b")
    if num_groups > 1 and b.stride(0) != n * b.stride(1):
        raise ValueError(f"b's groups must follow each other (stride(0) = N * stride(1)), got strides {tuple(b.stride())}")
    return num_groups, n, scale_b(sfb, ceil_div(n, SCALE_BLOCK), ceil_div(k, SCALE_BLOCK), num_groups)


def _check_d(d, shape: tuple) -> None:
    check_dtype(d, "d", (torch.bfloat16,))
    if tuple(d.shape) != shape or not d.is_contiguous():
        raise ValueError(f"d must be a contiguous bf16 tensor of shape {shape}, got shape {tuple(d.shape)} "
                         f"strides {tuple(d.stride())}")
    check_row_major_rows(d, "d")


def _check_layout_tensor(t, name: str, length: int) -> None:
    check_dtype(t, name, (torch.int32,))
    if tuple(t.shape) != (length,) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous int32 tensor of shape ({length},), got shape {tuple(t.shape)} "
                         f"strides {tuple(t.stride())}")


def _check_devices(named: tuple) -> None:
    first = named[0][0]
    for tensor, name in named:
        check_cuda_device(tensor, name, like=first)


def _check_contiguous_call(a, sfa, b, sfb, d, group_layout, layout_name: str) -> tuple:
    """Full validation; returns (m_total, n, k, G, whether sfa and sfb are already in the kernel's layouts)."""
    check_dtype(a, "a", (torch.float8_e4m3fn,))
    check_rank(a, "a", 2)
    m, k = a.shape
    num_groups, n, kernel_sfb = _check_b(b, sfb, k)
    check_row_major_rows(a, "a")
    if m % CONTIGUOUS_ALIGNMENT != 0:
        raise ValueError(f"a has M_total = {m} rows: it must be a multiple of "
                         f"get_m_alignment_for_contiguous_layout() = {CONTIGUOUS_ALIGNMENT} (pad each expert's segment)")
    _check_layout_tensor(group_layout, layout_name, m if layout_name == "m_indices" else num_groups + 1)
    _check_d(d, (m, n))
    kernel_sfa = scale_a(sfa, m, ceil_div(k, SCALE_BLOCK))
    _check_devices(((a, "a"), (sfa, "sfa"), (b, "b"), (sfb, "sfb"), (d, "d"), (group_layout, layout_name)))
    return m, n, k, num_groups, kernel_sfa is sfa and kernel_sfb is sfb


def _check_masked_call(a, sfa, b, sfb, d, masked_m, expected_m) -> tuple:
    """Full validation; returns (M_max, n, k, G, whether the scales are kernel-ready)."""
    check_dtype(a, "a", (torch.float8_e4m3fn,))
    check_rank(a, "a", 3)
    a_groups, m_max, k = a.shape
    num_groups, n, kernel_sfb = _check_b(b, sfb, k)
    if a_groups != num_groups:
        raise ValueError(f"a has G = {a_groups} groups but b has {num_groups}")
    check_row_major_rows(a, "a")
    if (num_groups > 1 and a.stride(0) < m_max * a.stride(1)) or a.stride(0) % 16 != 0:
        raise ValueError(f"a's groups must not overlap and start 16-byte aligned, got strides {tuple(a.stride())}")
    _check_layout_tensor(masked_m, "masked_m", num_groups)
    _check_d(d, (num_groups, m_max, n))
    check_int_range(expected_m, "expected_m", 1, max(m_max, 1))
    kernel_sfa = scale_a(sfa, m_max, ceil_div(k, SCALE_BLOCK), num_groups)
    _check_devices(((a, "a"), (sfa, "sfa"), (b, "b"), (sfb, "sfb"), (d, "d"), (masked_m, "masked_m")))
    return m_max, n, k, num_groups, kernel_sfa is sfa and kernel_sfb is sfb


def _split_pairs(a, b) -> tuple:
    if not (isinstance(a, (tuple, list)) and len(a) == 2 and isinstance(b, (tuple, list)) and len(b) == 2):
        raise TypeError("a and b must be (tensor, scales) pairs")
    return (*a, *b)


# What the FP8 (and FP4) grouped kernels read, by name, in launch_grouped's order.
CONTIGUOUS_INPUTS = ("a", "sfa", "b", "sfb", "m_indices")
MASKED_INPUTS = ("a", "sfa", "b", "sfb", "masked_m")
# The tensors the grouped kernels read through TMA (16-byte aligned, as d) and by 4-byte words (the weight scales:
# MXFP4's are bytes); the group layouts are int32, aligned by their dtype. The k-grouped kind reads sfb by TMA too.
_TMA_READ = ("a", "sfa", "b")
_WORD_READ = ("sfb",)


def check_grouped_addresses(inputs: tuple, names: tuple, d: torch.Tensor, tma_read: tuple = _TMA_READ) -> None:
    """The address checks of a grouped call: the inputs (named by names) and d aligned for the kernel's reads and
    writes (tma_read, _WORD_READ), and d over none of the inputs."""
    tma = [name for name in names if name in tma_read]
    words = [name for name in names if name in _WORD_READ and name not in tma_read]
    pointers = dict(zip(names, (t.data_ptr() for t in inputs)))
    if d.data_ptr() % 16 or any(pointers[name] % 16 for name in tma) or any(pointers[name] % 4 for name in words):
        raise ValueError(f"{', '.join(tma)} and d must start at 16-byte aligned addresses (TMA)"
                         + "".join(f", {name} at a 4-byte one" for name in words))
    check_no_overlap([("d", d)], list(zip(names, inputs)), "d and the inputs")


def launch_grouped(launches: dict, plan: tuple, encode, inputs: tuple, names: tuple, d: torch.Tensor, m: int,
                   num_groups: int, c: torch.Tensor = None, tma_read: tuple = _TMA_READ) -> torch.Tensor:
    """The per-call part of a validated grouped call (FP8, BF16 or FP4 weights, M- or k-grouped): its launch at the
    call's addresses and plan, prepared once (check_grouped_addresses passed, encode(kernel, config, *inputs, d, m,
    num_groups) then Kernel.prepare) and kept in the signature's launches. inputs: the tensors the kernel reads,
    named by names, the group layout last; plan: (kernel, config, grid); c: copied into d (unless it is d) once the
    addresses passed, for a kernel that accumulates into d."""
    device_index = d.get_device()
    key = (*[t.data_ptr() for t in inputs], d.data_ptr(), plan)
    launch = launches.get(key)
    if launch is None:
        check_grouped_addresses(inputs, names, d, tma_read)
        kernel, config, grid = plan
        encoded = encode(kernel, config, *inputs, d, m, num_groups)
        launch = remember_launch(launches, key, kernel.prepare(grid, device_index, encoded))
    if c is not None and c.data_ptr() != d.data_ptr():
        d.copy_(c)
    launch.launch(current_raw_stream(device_index))
    return d


def check_grouped_recipe(recipe, recipe_a, recipe_b) -> None:
    """The grouped FP8 GEMMs' recipe, in either of DeepGEMM's spellings: block-scaled weights only."""
    if operands_of_recipe(deepgemm_recipe(recipe, recipe_a, recipe_b)) != BLOCK_SCALED:
        raise ValueError("the grouped FP8 GEMMs take 128 x 128 weight scales: recipe (1, 128, 128), or recipe_a "
                         f"(1, 128) with recipe_b (128, 128), got recipe={recipe!r}, recipe_a={recipe_a!r}, "
                         f"recipe_b={recipe_b!r}")


def m_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, m_indices: torch.Tensor = None, recipe=None,
                                     recipe_a=None, recipe_b=None, *, offsets: torch.Tensor = None,
                                     grouped_layout: torch.Tensor = None, compiled_dims: str = "nk",
                                     disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True,
                                     expected_m_for_psum_layout: int = None) -> torch.Tensor:
    """d[r] = a[r] @ b[m_indices[r]]^T for every row r of the contiguous layout (module docstring).

    Args:
        a: (a [M_total, K] float8_e4m3fn, sfa [M_total, ceil(K / 128)]); M_total a multiple of
            get_m_alignment_for_contiguous_layout().
        b: (b [G, N, K] float8_e4m3fn, sfb [G, ceil(N / 128), ceil(K / 128)] FP32).
        d: [M_total, N] bf16 output.
        m_indices: [M_total] int32 CUDA tensor: each row's expert in [0, G), -1 on padding rows (ids outside
            [0, G) count as padding). Each expert's rows form one segment starting on a multiple of the
            alignment, padding at its end, as moe_layout writes them.
        offsets: instead of m_indices (keyword only): [G + 1] int32 CUDA tensor, the prefix sum of the expert
            sizes (offsets[0] = 0, expert g has offsets[g + 1] - offsets[g] rows, non-negative). Expert g's
            segment then starts at the sum of the earlier experts' sizes each rounded up to the alignment (the
            layout moe_layout builds); rows past the last segment are padding. Converted to m_indices on the
            device by a few torch ops (no host synchronisation; allocates M_total int32).
        grouped_layout: DeepGEMM's keyword for the layout argument, in place of m_indices (not both).
        recipe, recipe_a, recipe_b: DeepGEMM's recipe in either spelling (validation.deepgemm_recipe): None, or the
            block-scaled one, (1, 128, 128) or recipe_a (1, 128) with recipe_b (128, 128).
        compiled_dims, disable_ue8m0_cast: DeepGEMM's options, accepted so that its calls run unchanged; neither
            changes anything here (validation.check_deepgemm_options).
        use_psum_layout: DeepGEMM's other layout argument: m_indices is then [G] int32, expert g's row ends
            (expert g's rows start at expert g - 1's end rounded up to the alignment; deep_kernels.contiguous_layout),
            converted to per-row ids on the device as offsets are. ensure_zero_padding and expected_m_for_psum_layout
            are accepted and change nothing (validation.check_psum_options).

    Returns:
        d.

    Notes:
        Padding rows of d are never written (they keep what d held): tiles with a padding row are stored row
        by row, and M-blocks that start on padding are skipped. Deterministic (fixed reduction order, no
        split-K); numerics as fp8_gemm_nt. No host synchronisation or allocation with m_indices and kernel-
        ready scales (MN-major TMA-aligned FP32 sfa, contiguous FP32 sfb), so it can be captured in a CUDA
        graph. A call whose tensors have the dtypes, shapes, strides and devices of an earlier valid call
        skips re-validation.
    """
    check_deepgemm_options(compiled_dims, disable_ue8m0_cast)
    check_grouped_recipe(recipe, recipe_a, recipe_b)
    m_indices = layout_argument(m_indices, grouped_layout, required=False)
    if use_psum_layout is True and (offsets is not None or m_indices is None):
        raise TypeError("use_psum_layout=True takes the experts' row ends as the layout argument (grouped_layout), "
                        "without offsets")
    m_indices = call_m_indices(m_indices, a, b, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, offsets)
    a, sfa, b, sfb = _split_pairs(a, b)
    if (m_indices is None) == (offsets is None):
        raise TypeError("pass exactly one of m_indices (DeepGEMM's grouped_layout) and offsets")
    layout_name = "m_indices" if offsets is None else "offsets"
    group_layout = m_indices if offsets is None else offsets
    (m, n, k, num_groups, scales_ready), launches = checked_call(
        _check_contiguous_call, (a, sfa, b, sfb, d, group_layout), layout_name)
    if not scales_ready:
        sfa = scale_a(sfa, m, ceil_div(k, SCALE_BLOCK))
        sfb = scale_b(sfb, ceil_div(n, SCALE_BLOCK), ceil_div(k, SCALE_BLOCK), num_groups)
    if m == 0 or num_groups == 0:
        check_grouped_addresses((a, sfa, b, sfb, group_layout), ("a", "sfa", "b", "sfb", layout_name), d)
        return d
    if offsets is not None:
        m_indices = m_indices_from_offsets(offsets, m)
    return launch_grouped(launches, _plan(CONTIGUOUS, m, n, k, num_groups), _encode_contiguous,
                          (a, sfa, b, sfb, m_indices), CONTIGUOUS_INPUTS, d, m, num_groups)


def m_grouped_fp8_gemm_nn_contiguous(a, b, d: torch.Tensor, m_indices: torch.Tensor = None, recipe=None,
                                     recipe_a=None, recipe_b=None, *, offsets: torch.Tensor = None,
                                     grouped_layout: torch.Tensor = None, compiled_dims: str = "nk",
                                     disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True) -> torch.Tensor:
    """DeepGEMM's NN form of m_grouped_fp8_gemm_nt_contiguous: b = (b [G, K, N], sfb [G, ceil(K / 128), ceil(N / 128)])
    is the NT form's pair transposed (b.mT K-major: Hopper's FP8 wgmma reads no other); the NT call on (b.mT, sfb.mT).
    """
    return m_grouped_fp8_gemm_nt_contiguous(
        a, gemm.transposed_pair(b, "b", "N"), d, m_indices, recipe, recipe_a, recipe_b, offsets=offsets,
        grouped_layout=grouped_layout, compiled_dims=compiled_dims, disable_ue8m0_cast=disable_ue8m0_cast,
        use_psum_layout=use_psum_layout, ensure_zero_padding=ensure_zero_padding)


def _encode_contiguous(kernel, config, a, sfa, b, sfb, m_indices, d, m: int, num_groups: int) -> bytes:
    tmap_sfa = tensor_map(sfa, (config.block_m, 1), transpose=True)
    return kernel.encode(
        tmap_a=tensor_map(a, (config.block_m, SCALE_BLOCK), 128),
        tmap_b=tensor_map(b.flatten(0, 1), (config.block_n, SCALE_BLOCK), 128), tmap_sfa=tmap_sfa,
        tmap_d=tensor_map(d, (64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes),
        sfb=sfb.data_ptr(), shape_m=m, grouped_layout=m_indices.data_ptr(), num_groups=num_groups, d=d.data_ptr(),
        split_workspace=0, split_tickets=0, num_unsplit_tiles=0, tmap_sfb=tmap_sfa)


def m_grouped_fp8_gemm_nt_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int, recipe=None,
                                 recipe_a=None, recipe_b=None, *, compiled_dims: str = "nk",
                                 disable_ue8m0_cast: bool = False) -> torch.Tensor:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T for every expert g (masked layout, module docstring).

    Args:
        a: (a [G, M_max, K] float8_e4m3fn, sfa [G, M_max, ceil(K / 128)]).
        b: (b [G, N, K] float8_e4m3fn, sfb [G, ceil(N / 128), ceil(K / 128)] FP32).
        d: [G, M_max, N] bf16 output.
        masked_m: [G] int32 CUDA tensor, valid rows per expert, read on the device (values are clamped to
            [0, M_max]).
        expected_m: host-side estimate of the valid rows per expert, an integer in [1, max(M_max, 1)]; it only
            steers the tile choice (a wrong value costs time, never correctness).
        recipe, recipe_a, recipe_b: as for m_grouped_fp8_gemm_nt_contiguous (block-scaled weights only).
        compiled_dims, disable_ue8m0_cast: DeepGEMM's options, accepted so that its calls run unchanged; neither
            changes anything here (validation.check_deepgemm_options).

    Returns:
        d.

    Notes:
        Rows at or past masked_m[g] of d[g] are never written (they keep what d held). The grid is one CTA per
        SM whatever masked_m holds; CTAs without work exit at once. No host synchronisation (and, with kernel-
        ready scales, no allocation): the call can be captured in a CUDA graph and replayed with new masked_m
        and a. Deterministic; numerics as fp8_gemm_nt.
    """
    check_deepgemm_options(compiled_dims, disable_ue8m0_cast)
    check_grouped_recipe(recipe, recipe_a, recipe_b)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m)
    a, sfa, b, sfb = _split_pairs(a, b)
    (m_max, n, k, num_groups, scales_ready), launches = checked_call(
        _check_masked_call, (a, sfa, b, sfb, d, masked_m), expected_m)
    if not scales_ready:
        sfa = scale_a(sfa, m_max, ceil_div(k, SCALE_BLOCK), num_groups)
        sfb = scale_b(sfb, ceil_div(n, SCALE_BLOCK), ceil_div(k, SCALE_BLOCK), num_groups)
    if m_max == 0 or num_groups == 0:
        check_grouped_addresses((a, sfa, b, sfb, masked_m), MASKED_INPUTS, d)
        return d
    return launch_grouped(launches, _plan(MASKED, expected_m, n, k, num_groups), _encode_masked,
                          (a, sfa, b, sfb, masked_m), MASKED_INPUTS, d, m_max, num_groups)


# DeepGEMM's other name of the masked GEMM, the one vLLM resolves.
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked


def _encode_masked(kernel, config, a, sfa, b, sfb, masked_m, d, m_max: int, num_groups: int) -> bytes:
    tmap_sfa = tensor_map(sfa.permute(0, 2, 1), (1, 1, config.block_m))
    return kernel.encode(
        tmap_a=tensor_map(a, (1, config.block_m, SCALE_BLOCK), 128),
        tmap_b=tensor_map(b.flatten(0, 1), (config.block_n, SCALE_BLOCK), 128), tmap_sfa=tmap_sfa,
        tmap_d=tensor_map(d, (1, 64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes),
        sfb=sfb.data_ptr(), shape_m=m_max, grouped_layout=masked_m.data_ptr(), num_groups=num_groups, d=d.data_ptr(),
        split_workspace=0, split_tickets=0, num_unsplit_tiles=0, tmap_sfb=tmap_sfa)


def forced_config_call(gemm_type: str, config, a, b, d: torch.Tensor, group_layout: torch.Tensor,
                       expected_m: int = None):
    """A function that runs the grouped GEMM of `gemm_type` with `config` in place of the chosen one (measured
    tuning): group_layout is m_indices (contiguous) or masked_m (masked, with expected_m). Validated once, here,
    with kernel-ready scales."""
    a, sfa, b, sfb = _split_pairs(a, b)
    if gemm_type == CONTIGUOUS:
        m, n, k, num_groups, scales_ready = _check_contiguous_call(a, sfa, b, sfb, d, group_layout, "m_indices")
        plan = plan_of(CONTIGUOUS, config, m, n, k, get_num_sms())
        encode, names = _encode_contiguous, CONTIGUOUS_INPUTS
    elif gemm_type == MASKED:
        m, n, k, num_groups, scales_ready = _check_masked_call(a, sfa, b, sfb, d, group_layout, expected_m)
        plan = plan_of(MASKED, config, expected_m, n, k, get_num_sms())
        encode, names = _encode_masked, MASKED_INPUTS
    else:
        raise ValueError(f"gemm_type must be {CONTIGUOUS!r} or {MASKED!r}, got {gemm_type!r}")
    if not scales_ready:
        raise ValueError("forced_config_call takes kernel-ready scales (FP32, MN-major TMA-aligned sfa)")
    launches = {}
    inputs = (a, sfa, b, sfb, group_layout)
    return lambda: launch_grouped(launches, plan, encode, inputs, names, d, m, num_groups)


@precompiled
def precompile_specs() -> list:
    """Every kernel the grouped heuristics pick over the representative shapes."""
    return [kernel_spec(kernel.config, kernel.n, kernel.k, torch.bfloat16, False, kernel.gemm_type)
            for kernel in heuristics.all_candidate_kernels()]
