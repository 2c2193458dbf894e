"""FP8-activation x MXFP4-weight GEMMs on Hopper: D = A @ B^T (+ C), dense and grouped, on the FP8 GEMM engine
(its GemmOperands::Fp8Mxfp4 kind: csrc/gemm/sm90_fp4_expand.cuh).

Layouts:
    a    as for fp8_gemm_nt and its grouped twins: [M, K] (contiguous: [M_total, K]; masked: [G, M_max, K])
         float8_e4m3fn with 1x128 scales sfa (FP32 MN-major TMA-aligned, or row-major FP32 / packed UE8M0,
         converted first).
    b    e2m1 codes [N, K / 2] (grouped: [G, N, K / 2]) as torch.float4_e2m1fn_x2 or uint8, element 2i in the low
         nibble of byte i, rows contiguous (per_token_cast_to_mxfp4's codes); sfb the UE8M0 scales, one per row
         and 32 columns: [N, K / 32] (grouped: [G, N, K / 32]) torch.float8_e8m0fnu or uint8, contiguous
         (per_token_cast_to_mxfp4's "row_major" scales). The kernels read both as they are; the dense GEMM
         also takes them prepared once (prepare_fp4_weights, deep_kernels.fp4_weights) for its decode kernel.
    d    [M, N] bf16, or FP32 when accumulating c (dense only; c may be d).
Constraints: K a positive multiple of 128, N of 16.

Numerics: the kernel expands B to e4m3 on chip, per B row n and 128-deep K block: with e_max the largest
exponent of the block's four UE8M0 scales, a code of a sub-block with exponent e becomes e2m1 * 2^(6 - (e_max -
e)) in e4m3, exactly wherever e_max - e <= 14 (else rounded to nearest even: the sub-block's values are then
under 2^-12 of the block's largest), and the tensor cores' FP32 sum of each 128-deep block is promoted with
sfa[row] * 2^(e_max - 133) per column, as the FP8 recipe promotes every 128 K. A NaN scale (0xFF) gives NaN
columns. Deterministic (fixed reduction order, split-K included). At decode sizes (up to 128 tokens) the dense GEMM
runs a kernel with A and B swapped (csrc/kernels/sm90_fp8_fp4_gemm_swap_ab.cuh: the weights expanded in registers
as wgmma's A operand, the same numerics). At prefill sizes the dense GEMM expands B first (mxfp4_requant_to_fp8,
the same numerics) and runs the FP8 GEMM with per-channel scales (fp8_fp4_gemm_nt's Notes).
NVFP4 weights (E4M3 1x16 scales and an FP32 global scale: b = (codes, sfb, global_scale)) are supported by the
dense GEMM only, through deep_kernels.nvfp4_gemm (expanded exactly to f16, f16 tensor cores, the same promotion).
"""

import torch

from deep_kernels import nvfp4_gemm
from deep_kernels.call_cache import checked_call
from deep_kernels.contiguous_layout import call_m_indices, layout_argument
from deep_kernels.device import get_num_sms
from deep_kernels.fp4_weights import TILE_ROWS as PREPARED_TILE_ROWS, PreparedFp4Weights, check_prepared
from deep_kernels.gemm import (
    FP8_GEMM, SCALE_BLOCK, _split_workspace, check_d_over_operands, check_n, check_output, scale_a,
)
from deep_kernels.grouped_gemm import (
    CONTIGUOUS_INPUTS, MASKED_INPUTS, _split_pairs, check_grouped_addresses, launch_grouped,
)
from deep_kernels.heuristics import fp8_fp4_gemm as heuristics
from deep_kernels.heuristics import fp8_fp4_swap_ab as swap_ab_heuristics
from deep_kernels.heuristics import fp8_gemm as fp8_heuristics
from deep_kernels.jit.definition import PTR, TENSOR_MAP, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, get_kernel, remember_launch, tensor_map
from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT
from deep_kernels.validation import (
    check_cuda_device, check_deepgemm_options, check_dtype, check_int_range, check_rank, check_row_major_rows,
    is_traced, scale_block_sizes, tma_aligned_size,
)
from deep_kernels.workspace import persistent_empty

MXFP4_GROUP_SIZE = 32
CODE_DTYPES = (torch.float4_e2m1fn_x2, torch.uint8)
SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8)
NORMAL, CONTIGUOUS, MASKED = "normal", "m_grouped_contiguous", "m_grouped_masked"

# The dense GEMM at decode sizes with A and B swapped: the weights expanded into wgmma's register operand.
FP8_FP4_SWAP_AB_GEMM = KernelDef(
    swap_ab_heuristics.KERNEL_HEADER, "sm90_fp8_fp4_gemm_swap_ab_impl",
    template=("BLOCK_T", "kNumMathWarpgroups", "kNumStages", "OutputType", "kWithAccumulation", "kNumCTAsPerSM",
              "kNumChains", "kPreparedWeights", "kMasked", "kTileScaled", "kPipelinedPromotion", "kClusterSplits"),
    params=(Param("tmap_a", TENSOR_MAP), Param("tmap_codes", TENSOR_MAP), Param("tmap_sfa", TENSOR_MAP),
            Param("tmap_d", TENSOR_MAP), Param("sfb_words", PTR), Param("shape_n", U32), Param("shape_k", U32),
            Param("num_splits", U32), Param("split_workspace", PTR), Param("split_tickets", PTR),
            Param("prepared_weights", PTR), Param("masked_m", PTR), Param("shape_m", U32), Param("num_groups", U32),
            Param("d", PTR)),
    threads=lambda t: swap_ab_heuristics.num_threads(int(t["kNumMathWarpgroups"]), int(t["kNumCTAsPerSM"]),
                                                     int(t["BLOCK_T"])),
    cluster=lambda t: int(t["kClusterSplits"]))

# B expanded from prepared weights at prefill sizes (deep_kernels.fp4_weights): a CTA per 128 rows and
# PREPARED_EXPAND_K_BLOCKS K blocks (the kernel's kKBlocksPerCta).
PREPARED_EXPAND_K_BLOCKS = 4
FP4_PREPARED_EXPAND = KernelDef(
    "kernels/sm90_fp4_prepared_expand.cuh", "sm90_fp4_prepared_expand_impl", template=("kBlockScaled", "kTileScaled"),
    params=(Param("prepared", PTR), Param("q", PTR), Param("scales", PTR), Param("shape_n", U32), Param("shape_k", U32),
            Param("scale_stride", U32)),
    threads=lambda t: 256)


def kernel_spec(config, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, gemm_type: str = NORMAL):
    return FP8_GEMM.spec(*heuristics.template_args(config, n, k, out_dtype, accumulate, gemm_type))


def _kernel(config, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, gemm_type: str = NORMAL):
    return get_kernel(kernel_spec(config, n, k, out_dtype, accumulate, gemm_type), smem_bytes=config.smem_bytes)


def _check_weights(b, sfb, k: int, num_groups) -> int:
    """b's codes and sfb's UE8M0 scales for reduction depth k (num_groups: None for dense); returns N."""
    lead = () if num_groups is None else (num_groups,)
    check_dtype(b, "b", CODE_DTYPES)
    check_rank(b, "b", len(lead) + 2)
    if num_groups is not None and b.shape[0] != num_groups:
        raise ValueError(f"a has G = {num_groups} groups but b has {b.shape[0]}")
    n = b.shape[-2]
    if b.shape[-1] * 2 != k:
        raise ValueError(f"b must hold K / 2 = {k // 2} bytes of e2m1 codes per row (two codes a byte, a is "
                         f"[..., K = {k}]), got shape {tuple(b.shape)}")
    check_n(n)
    if not b.is_contiguous():
        raise ValueError(f"b must be contiguous, got strides {tuple(b.stride())}")
    check_dtype(sfb, "sfb", SCALE_DTYPES)
    shape = lead + (n, k // MXFP4_GROUP_SIZE)
    if tuple(sfb.shape) != shape or not sfb.is_contiguous():
        raise ValueError(f"sfb must be contiguous UE8M0 scales of shape {shape} (one per row and 32 columns, "
                         f"per_token_cast_to_mxfp4's row_major layout), got shape {tuple(sfb.shape)} strides "
                         f"{tuple(sfb.stride())}")
    return n


def _check_k(k: int) -> None:
    if k % SCALE_BLOCK != 0 or k == 0:
        raise ValueError(f"K must be a positive multiple of 128 for MXFP4 weights (whole 32-wide scale groups in "
                         f"each 128-deep block), got {k}")


def _check_addresses(a, sfa, b, sfb, d) -> None:
    if (a.data_ptr() | b.data_ptr() | d.data_ptr() | sfa.data_ptr()) % 16 or sfb.data_ptr() % 4:
        raise ValueError("a, b, d and sfa must start at 16-byte aligned addresses (TMA), sfb at a 4-byte one")


def _check_dense_call(a, sfa, b, sfb, d, c) -> tuple:
    """Full validation; returns (m, n, k, whether sfa is kernel-ready)."""
    check_dtype(a, "a", (torch.float8_e4m3fn,))
    check_rank(a, "a", 2)
    m, k = a.shape
    _check_k(k)
    n = _check_weights(b, sfb, k, None)
    check_row_major_rows(a, "a")
    check_output(d, c, m, n)
    kernel_sfa = scale_a(sfa, m, k // SCALE_BLOCK)
    for tensor, name in ((a, "a"), (sfa, "sfa"), (b, "b"), (sfb, "sfb"), (d, "d")) + ((c, "c"),) * (c is not None):
        check_cuda_device(tensor, name, like=a)
    return m, n, k, kernel_sfa is sfa




_plans = {}


def _dense_plan(m: int, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, num_sms: int,
                prepared: bool = False):
    """The swapped kernel's config where it runs (decode sizes: swap_ab_heuristics.is_preferred), else (kernel,
    config, grid, split-K layout) of the in-kernel expansion, or None where B is expanded before the GEMM
    (heuristics.expands_before; prepared weights: always)."""
    key = (m, n, k, out_dtype, accumulate, num_sms, prepared)
    if key not in _plans:
        if swap_ab_heuristics.is_preferred(m, n, k, num_sms):
            _plans[key] = swap_ab_heuristics.get_config(m, n, k, num_sms, out_dtype.itemsize, prepared)
        elif prepared or heuristics.expands_before(m, n, k, num_sms, out_dtype.itemsize, accumulate):
            _plans[key] = None
        else:
            config = heuristics.get_config(m, n, k, num_sms, out_dtype.itemsize, accumulate)
            _plans[key] = _dense_plan_of(config, m, n, k, out_dtype, accumulate, num_sms)
    return _plans[key]


class _ExpansionWorkspace:
    """One device's buffers for B expanded to e4m3 [N, K] and its per-row FP32 scales (MN-major, N rounded up to
    4) at prefill sizes."""

    def __init__(self, device_index: int, num_codes: int, num_scales: int):
        self.codes = persistent_empty(num_codes, torch.uint8, device_index)
        self.scales = persistent_empty(num_scales, torch.float32, device_index)


_expansion_workspaces = {}
_retired_expansion_workspaces = []


def _expanded_weights(b: torch.Tensor, sfb: torch.Tensor, n: int, k: int) -> tuple:
    """(e4m3 [N, K], FP32 scales [N, K / 128] MN-major) of B, by mxfp4_requant_to_fp8 into the device's persistent
    expansion workspace (_expansion_buffers)."""
    from deep_kernels.quant.fp4 import mxfp4_requant_to_fp8

    k_blocks, aligned_n = k // SCALE_BLOCK, tma_aligned_size(n, 4)
    codes, scales = _expansion_buffers(b.get_device(), n * k, aligned_n * k_blocks)
    q = codes.view(torch.float8_e4m3fn).view(n, k)
    scales = scales.as_strided((n, k_blocks), (1, aligned_n))
    return mxfp4_requant_to_fp8(b, sfb.view(torch.float8_e8m0fnu), scale_layout="mn_major", out=(q, scales))


def _expanded_prepared_weights(prepared: PreparedFp4Weights) -> tuple:
    """(e4m3 [N, K], FP32 scales) of prepared weights in the device's expansion workspace: 128 x 128 block scales
    [ceil(N / 128), K / 128] where the weights fold into blocks, else per row and 128 columns, MN-major."""
    n, k = prepared.n, prepared.k
    k_blocks, aligned_n = k // SCALE_BLOCK, tma_aligned_size(n, 4)
    num_scales = -(-n // SCALE_BLOCK) * k_blocks if prepared.folds_into_blocks else aligned_n * k_blocks
    codes, scales = _expansion_buffers(prepared.data.get_device(), n * k, num_scales)
    q = codes.view(torch.float8_e4m3fn).view(n, k)
    if prepared.folds_into_blocks:
        scales = scales.view(-1, k_blocks)
        expand_prepared(prepared.data, n, k, True, q, scales, tile_scaled=prepared.tile_scaled)
    else:
        scales = scales.as_strided((n, k_blocks), (1, aligned_n))
        expand_prepared(prepared.data, n, k, False, q, scales, aligned_n, prepared.tile_scaled)
    return q, scales


def expand_prepared(data: torch.Tensor, n: int, k: int, block_scaled: bool, q: torch.Tensor, scales: torch.Tensor,
                    scale_stride: int = 0, tile_scaled: bool = False) -> None:
    """B expanded from a prepared weights' CUDA tensor (tile_scaled: PreparedFp4Weights.tile_scaled) into q (e4m3
    [N, K], contiguous) and scales (FP32: block_scaled, [ceil(N / 128), K / 128] contiguous; else MN-major, element
    (row, K block) at K block * scale_stride + row); the kernel's numerics in kernels/sm90_fp4_prepared_expand.cuh."""
    kernel = get_kernel(FP4_PREPARED_EXPAND.spec(kBlockScaled="true" if block_scaled else "false",
                                                 kTileScaled="true" if tile_scaled else "false"))
    grid = (-(-(k // SCALE_BLOCK) // PREPARED_EXPAND_K_BLOCKS), -(-n // (2 * PREPARED_TILE_ROWS)), 1)
    kernel.launch(grid, data.get_device(), prepared=data.data_ptr(),
                  q=q.data_ptr(), scales=scales.data_ptr(), shape_n=n, shape_k=k, scale_stride=scale_stride)


def _expansion_buffers(device_index: int, num_codes: int, num_scales: int) -> tuple:
    """The first num_codes bytes and num_scales FP32 of the device's persistent expansion workspace (grown, never
    shrunk; kept alive once replaced, for CUDA graphs captured before; refused during capture: run the shape once
    before capturing it)."""
    workspace = _expansion_workspaces.get(device_index)
    if workspace is None or workspace.codes.numel() < num_codes or workspace.scales.numel() < num_scales:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("fp8_fp4_gemm_nt: this prefill shape needs a larger expansion workspace, which cannot "
                               "be allocated during CUDA-graph capture; run the same call once before capturing")
        if workspace is not None:
            _retired_expansion_workspaces.append(workspace)
        workspace = _expansion_workspaces[device_index] = _ExpansionWorkspace(
            device_index, max(num_codes, 2 * (workspace.codes.numel() if workspace else 0)),
            max(num_scales, 2 * (workspace.scales.numel() if workspace else 0)))
    return workspace.codes[:num_codes], workspace.scales[:num_scales]


def _dense_plan_of(config, m: int, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, num_sms: int):
    kernel = _kernel(config, n, k, out_dtype, accumulate)
    grid = (fp8_heuristics.grid_size(config, m, n, num_sms), 1, 1)
    split_layout = (fp8_heuristics.num_unsplit_tiles(config, m, n, num_sms),
                    *fp8_heuristics.split_workspace_sizes(config, m, n, num_sms))
    return kernel, config, grid, split_layout


def swap_ab_kernel_spec(config, out_dtype: torch.dtype, accumulate: bool, prepared: bool = False, masked: bool = False,
                        tile_scaled: bool = False):
    """The swapped kernel of config (on tile-scaled prepared weights: of swap_ab_heuristics.for_tile_scaled(config))."""
    if tile_scaled:
        config = swap_ab_heuristics.for_tile_scaled(config)
    return FP8_FP4_SWAP_AB_GEMM.spec(*swap_ab_heuristics.template_args(config, out_dtype, accumulate, prepared, masked,
                                                                       tile_scaled))


def _swap_ab_kernel(config, out_dtype: torch.dtype, accumulate: bool, prepared: bool, masked: bool,
                    tile_scaled: bool):
    smem = (swap_ab_heuristics.for_tile_scaled(config).smem_bytes_of(True) if tile_scaled else config.smem_bytes)
    return get_kernel(swap_ab_kernel_spec(config, out_dtype, accumulate, prepared, masked, tile_scaled),
                      smem_bytes=smem)


def _swap_ab_launch(launches: dict, config, a, sfa, b, sfb, d, m: int, n: int, k: int, accumulate: bool,
                    tile_scaled: bool = False):
    """The launch of the swapped kernel (m <= 128 tokens, sfa kernel-ready) of config, split-K through the FP8
    GEMM's workspace or in a cluster (config.splits_in_cluster); sfb None: b is prepare_fp4_weights's tensor
    (tile_scaled: its PreparedFp4Weights.tile_scaled). Prepared (Kernel.prepare) once per address set, config and
    workspace, its address checks passed, and kept in launches, the validated call signature's."""
    if config.block_t < m:
        raise ValueError(f"a swapped config of {config.block_t} tokens cannot take m = {m}")
    if not 1 <= config.num_splits <= k // SCALE_BLOCK:
        raise ValueError(f"num_splits must be in 1..K / 128 = {k // SCALE_BLOCK}, got {config.num_splits}")
    prepared = sfb is None
    device_index = a.get_device()
    num_tiles = -(-n // config.block_w)
    workspace = None
    if config.num_splits > 1 and not config.splits_in_cluster:
        workspace = _split_workspace(device_index, num_tiles * config.block_w * config.block_t * config.num_splits,
                                     num_tiles * config.num_math_warpgroups)
    # NOTE: tile_scaled too: prepared weights of either layout may come to lie at the same address.
    key = (a.data_ptr(), sfa.data_ptr(), b.data_ptr(), 0 if prepared else sfb.data_ptr(), d.data_ptr(), config,
           tile_scaled, workspace)
    launch = launches.get(key)
    if launch is None:
        check_d_over_operands(d, a, sfa, b, sfb)
        kernel = _swap_ab_kernel(config, d.dtype, accumulate, prepared, False, tile_scaled)
        tmap_a = tensor_map(a, (config.block_t, SCALE_BLOCK), 128)
        # NOTE: prepared weights come by bulk copies: tmap_codes is not read then (any valid map does).
        tmap_codes = tmap_a if prepared else tensor_map(b.view(torch.uint8), (config.block_w, SCALE_BLOCK // 2), 64)
        encoded = kernel.encode(
            tmap_a=tmap_a, tmap_codes=tmap_codes, tmap_sfa=tensor_map(sfa, (config.block_t, 1), transpose=True),
            tmap_d=tensor_map(d, (config.block_t, 128 // d.element_size()), 128),
            sfb_words=0 if prepared else sfb.data_ptr(), shape_n=n, shape_k=k, num_splits=config.num_splits,
            split_workspace=workspace.partials.data_ptr() if workspace else 0,
            split_tickets=workspace.tickets.data_ptr() if workspace else 0,
            prepared_weights=b.data_ptr() if prepared else 0, masked_m=0, shape_m=0, num_groups=0, d=0)
        launch = remember_launch(launches, key, kernel.prepare((num_tiles * config.num_splits, 1, 1), device_index,
                                                               encoded))
    return launch


def _codes_map(b: torch.Tensor, block_n: int) -> tuple:
    """The codes as bytes [rows, K / 2], box BLOCK_N rows x 64 bytes (one 128-deep K block), unswizzled."""
    codes = b.view(torch.uint8)
    return tensor_map(codes.reshape(-1, codes.shape[-1]), (block_n, SCALE_BLOCK // 2))


def _is_nvfp4(b) -> bool:
    return isinstance(b, (tuple, list)) and len(b) == 3


def _split_nvfp4(a, b) -> tuple:
    if not (isinstance(a, (tuple, list)) and len(a) == 2):
        raise TypeError("a must be a (tensor, scales) pair")
    return (*a, *b)


def _reject_nvfp4(b) -> None:
    if _is_nvfp4(b):
        raise ValueError("NVFP4 weights (codes, sfb, global_scale) are supported by the dense fp8_fp4_gemm_nt only; "
                         "the grouped GEMMs take MXFP4 weights")


def check_fp4_recipe(recipe, recipe_a, recipe_b, b) -> None:
    """DeepGEMM's recipe of an FP8 x FP4 call: none, or recipe_a (1, 128) with recipe_b (1, 32) for MXFP4 weights or
    (1, 16) for NVFP4 ones (the operands' K blocks differ, so the (M, N, K) recipe cannot describe them)."""
    if recipe is None and recipe_a is None and recipe_b is None:
        return
    block_b = (1, 16) if _is_nvfp4(b) else (1, MXFP4_GROUP_SIZE)
    if (recipe is not None or recipe_a is None or recipe_b is None
            or scale_block_sizes(recipe_a, "recipe_a") != (1, SCALE_BLOCK)
            or scale_block_sizes(recipe_b, "recipe_b") != block_b):
        raise ValueError(f"the FP8 x FP4 GEMMs take recipe_a (1, 128) with recipe_b {block_b} for these weights, or no "
                         f"recipe; got recipe={recipe!r}, recipe_a={recipe_a!r}, recipe_b={recipe_b!r}")


def fp8_fp4_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None, recipe_a=None, recipe_b=None,
                    *, compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> torch.Tensor:
    """D = A @ B^T (+ C) with e4m3 activations (1x128 scales) and MXFP4 or NVFP4 weights, FP32 accumulation.

    Args:
        a: (a [M, K] float8_e4m3fn, sfa [M, K / 128]) as per_token_cast_to_fp8 returns it.
        b: MXFP4: (codes [N, K / 2] float4_e2m1fn_x2 or uint8, sfb [N, K / 32] float8_e8m0fnu or uint8) as
            per_token_cast_to_mxfp4(w) returns it (row_major scales); or prepare_fp4_weights(codes, sfb), the
            same weights prepared once for the decode kernel (deep_kernels.fp4_weights).
            NVFP4: (codes, sfb [N, K / 16] float8_e4m3fn, global_scale float32 CUDA tensor of one element): the
            pair per_token_cast_to_nvfp4(w, global_scale) returns (row_major scales) and the global scale it was
            given (deep_kernels.nvfp4_gemm has the layouts and numerics).
        d: [M, N] output, bf16; fp32 when c is given.
        c: optional fp32 [M, N] added to the product; may be d itself.
        recipe, recipe_a, recipe_b: DeepGEMM's recipe: none, or recipe_a (1, 128) with recipe_b (1, 32) (MXFP4) or
            (1, 16) (NVFP4), checked against the weights given (check_fp4_recipe).
        compiled_dims, disable_ue8m0_cast: DeepGEMM's options, accepted so that its calls run unchanged; neither
            changes anything here (validation.check_deepgemm_options).

    Returns:
        d.

    Notes:
        K must be a multiple of 128. Numerics: the module docstring (exact expansion, one FP32 promotion per
        128-deep block with sfa * 2^(e_max - 133) per column). Deterministic. Up to 128 rows (decode) the kernel
        with A and B swapped runs (heuristics.fp8_fp4_swap_ab: the weights expanded into wgmma's register operand,
        the tokens its N; the same numerics, its 128-deep block's FP32 sum taken over up to four accumulator sets).
        Split-K at decode sizes shares the FP8 GEMM's per-device workspace (the same CUDA-graph rule: run a shape
        once before capturing it). Between 129 rows and the prefill sizes the expander kernel runs. At
        prefill sizes (heuristics.expands_before: from a few hundred rows), where the kernel's three expander warps
        cannot keep up with two math warpgroups, B is expanded once per call by mxfp4_requant_to_fp8 (the same
        numerics: e4m3 with one power-of-two scale per row and 128 columns, exact under the same condition) into a
        persistent per-device workspace, and the FP8 GEMM with per-channel B scales (recipe (1, 1, 128)) multiplies;
        that workspace too is grown outside CUDA-graph capture only. No host synchronisation or allocation with
        kernel-ready sfa (MN-major FP32). Prepared weights: up to 128 rows the swapped kernel reads them with fewer
        instructions per weight, the same numerics; from 129 rows on B is expanded per call from them into the same
        persistent workspace, with one power-of-two scale per 128 x 128 block where preparation found every block
        exact in e4m3 (then the block-scaled FP8 GEMM multiplies: the values are the same, the promotion scale
        sfa * 2^(E - 133) per block), else per row and 128 columns as above (deep_kernels.fp4_weights).
    """
    check_deepgemm_options(compiled_dims, disable_ue8m0_cast)
    check_fp4_recipe(recipe, recipe_a, recipe_b, b)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.fp8_fp4_gemm_nt(a, b, d, c)
    return fp8_fp4_gemm_nt_with_config(None, a, b, d, c)


def fp8_fp4_gemm_nt_with_config(config, a, b, d: torch.Tensor, c: torch.Tensor = None) -> torch.Tensor:
    """fp8_fp4_gemm_nt with config in place of the chosen one (None: the chosen one), for measured tuning,
    side-by-side timing and tests: a heuristics.fp8_fp4_gemm config, or a heuristics.fp8_fp4_swap_ab one (the
    swapped kernel, up to 128 tokens); NVFP4 weights: a heuristics.fp8_nvfp4_swap_ab one, run on every 128-row
    slice."""
    if isinstance(b, PreparedFp4Weights):
        return _fp8_fp4_gemm_nt_prepared(a, b, d, c, config)
    if _is_nvfp4(b):
        return nvfp4_gemm.fp8_nvfp4_gemm_nt(*_split_nvfp4(a, b), d, c, config)
    a, sfa, b, sfb = _split_pairs(a, b)
    (m, n, k, sfa_ready), launches = checked_call(_check_dense_call, (a, sfa, b, sfb, d, c))
    if not sfa_ready:
        sfa = scale_a(sfa, m, k // SCALE_BLOCK)
    _check_addresses(a, sfa, b, sfb, d)
    if m == 0:
        return d
    num_sms = get_num_sms()
    accumulate = c is not None
    if config is None:
        plan = _dense_plan(m, n, k, d.dtype, accumulate, num_sms)
        if plan is None:
            # Prefill: B expanded once per call, then the FP8 GEMM with per-channel scales.
            from deep_kernels.gemm import fp8_gemm_nt
            check_d_over_operands(d, a, sfa, b, sfb)
            return fp8_gemm_nt((a, sfa), _expanded_weights(b, sfb, n, k), d, c, recipe=(1, 1, 128))
    elif isinstance(config, swap_ab_heuristics.SwapAbConfig):
        plan = config
    else:
        plan = _dense_plan_of(config, m, n, k, d.dtype, accumulate, num_sms)
    if isinstance(plan, swap_ab_heuristics.SwapAbConfig):
        return _run(_swap_ab_launch(launches, plan, a, sfa, b, sfb, d, m, n, k, accumulate), c, d)
    return _run(_expanding_launch(launches, plan, a, sfa, b, sfb, d, m), c, d)


def _expanding_launch(launches: dict, plan: tuple, a, sfa, b, sfb, d, m: int):
    """The launch of the FP8 engine's kind that expands the codes in shared memory (plan: _dense_plan_of's),
    prepared (Kernel.prepare) once per address set, plan and split-K workspace, its address checks passed, and kept
    in launches, the validated call signature's."""
    kernel, config, grid, (num_unsplit_tiles, workspace_floats, num_tickets) = plan
    device_index = a.get_device()
    workspace = _split_workspace(device_index, workspace_floats, num_tickets) if num_tickets else None
    key = (a.data_ptr(), sfa.data_ptr(), b.data_ptr(), sfb.data_ptr(), d.data_ptr(), plan, workspace)
    launch = launches.get(key)
    if launch is None:
        check_d_over_operands(d, a, sfa, b, sfb)
        map_sfa = tensor_map(sfa, (config.block_m, 1), transpose=True)
        # NOTE: tmap_sfb is not read by this kind (the expanders write the column scales); any valid map does.
        encoded = kernel.encode(
            tmap_a=tensor_map(a, (config.block_m, SCALE_BLOCK), 128), tmap_b=_codes_map(b, config.block_n),
            tmap_sfa=map_sfa,
            tmap_d=tensor_map(d, (64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes),
            sfb=sfb.data_ptr(), shape_m=m, grouped_layout=0, num_groups=0, d=0,
            split_workspace=workspace.partials.data_ptr() if workspace else 0,
            split_tickets=workspace.tickets.data_ptr() if workspace else 0, num_unsplit_tiles=num_unsplit_tiles,
            tmap_sfb=map_sfa)
        launch = remember_launch(launches, key, kernel.prepare(grid, device_index, encoded))
    return launch


def _run(launch, c, d: torch.Tensor) -> torch.Tensor:
    """c copied into d where it is not d, then the launch: only once the launch's address checks have passed, which
    a copy over an input would defeat."""
    if c is not None and c.data_ptr() != d.data_ptr():
        d.copy_(c)
    launch.launch(current_raw_stream(d.get_device()))
    return d


def _check_prepared_call(a, sfa, data, d, c, n: int, k_prepared: int) -> tuple:
    """Full validation with prepared weights of n rows and k_prepared columns; returns (m, k, whether sfa is
    kernel-ready)."""
    check_dtype(a, "a", (torch.float8_e4m3fn,))
    check_rank(a, "a", 2)
    m, k = a.shape
    _check_k(k)
    if k != k_prepared:
        raise ValueError(f"a has K = {k} columns but the prepared weights K = {k_prepared}")
    if n % 16 != 0:
        raise ValueError(f"N must be a positive multiple of 16, got prepared weights of {n} rows")
    check_prepared(data, n, k)
    check_row_major_rows(a, "a")
    check_output(d, c, m, n)
    kernel_sfa = scale_a(sfa, m, k // SCALE_BLOCK)
    for tensor, name in ((a, "a"), (sfa, "sfa"), (data, "b"), (d, "d")) + ((c, "c"),) * (c is not None):
        check_cuda_device(tensor, name, like=a)
    return m, k, kernel_sfa is sfa


def _fp8_fp4_gemm_nt_prepared(a, prepared: PreparedFp4Weights, d, c, config) -> torch.Tensor:
    """fp8_fp4_gemm_nt with prepared weights: up to 128 rows the swapped kernel reads them as they are; from 129
    rows on, B is expanded per call (block-scaled where the weights fold into 128 x 128 blocks, else per row) and
    the FP8 GEMM of that recipe multiplies."""
    if not (isinstance(a, (tuple, list)) and len(a) == 2):
        raise TypeError("a must be an (a, sfa) pair")
    a, sfa = a
    n = prepared.n
    (m, k, sfa_ready), launches = checked_call(_check_prepared_call, (a, sfa, prepared.data, d, c), n, prepared.k)
    if not sfa_ready:
        sfa = scale_a(sfa, m, k // SCALE_BLOCK)
    _check_addresses(a, sfa, prepared.data, prepared.data, d)
    if config is not None and not isinstance(config, swap_ab_heuristics.SwapAbConfig):
        raise ValueError("prepared weights run the swapped kernel only: config must be a heuristics.fp8_fp4_swap_ab "
                         "one")
    if m == 0:
        return d
    if config is None and not swap_ab_heuristics.is_preferred(m, n, k, get_num_sms()):
        from deep_kernels.gemm import fp8_gemm_nt
        recipe = None if prepared.folds_into_blocks else (1, 1, 128)
        check_d_over_operands(d, a, sfa, prepared.data)
        return fp8_gemm_nt((a, sfa), _expanded_prepared_weights(prepared), d, c, recipe=recipe)
    accumulate = c is not None
    plan = config or _dense_plan(m, n, k, d.dtype, accumulate, get_num_sms(), prepared=True)
    return _run(_swap_ab_launch(launches, plan, a, sfa, prepared.data, None, d, m, n, k, accumulate,
                                prepared.tile_scaled), c, d)


def _check_bf16_d(d, shape: tuple) -> None:
    check_dtype(d, "d", (torch.bfloat16,))
    if tuple(d.shape) != shape or not d.is_contiguous():
        raise ValueError(f"d must be a contiguous bf16 tensor of shape {shape}, got shape {tuple(d.shape)} "
                         f"strides {tuple(d.stride())}")


def _check_layout_tensor(t, name: str, length: int) -> None:
    check_dtype(t, name, (torch.int32,))
    if tuple(t.shape) != (length,) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous int32 tensor of shape ({length},), got shape "
                         f"{tuple(t.shape)} strides {tuple(t.stride())}")


def _check_contiguous_call(a, sfa, b, sfb, d, m_indices) -> tuple:
    """Full validation; returns (m_total, n, k, G, whether sfa is kernel-ready)."""
    check_dtype(a, "a", (torch.float8_e4m3fn,))
    check_rank(a, "a", 2)
    m, k = a.shape
    _check_k(k)
    check_rank(b, "b", 3)
    num_groups = b.shape[0]
    n = _check_weights(b, sfb, k, num_groups)
    check_row_major_rows(a, "a")
    if m % CONTIGUOUS_ALIGNMENT != 0:
        raise ValueError(f"a has M_total = {m} rows: it must be a multiple of "
                         f"get_m_alignment_for_contiguous_layout() = {CONTIGUOUS_ALIGNMENT} (pad each expert's segment)")
    _check_layout_tensor(m_indices, "m_indices", m)
    _check_bf16_d(d, (m, n))
    kernel_sfa = scale_a(sfa, m, k // SCALE_BLOCK)
    for tensor, name in ((a, "a"), (sfa, "sfa"), (b, "b"), (sfb, "sfb"), (d, "d"), (m_indices, "m_indices")):
        check_cuda_device(tensor, name, like=a)
    return m, n, k, num_groups, kernel_sfa is sfa


def _check_masked_rows(a, sfa, d, masked_m, expected_m, n: int) -> torch.Tensor:
    """The masked calls' checks past their weights' (a [G, M_max, K] already of dtype, rank and K checked): a's rows
    and groups, masked_m, d [G, M_max, n] and expected_m; returns sfa as the kernel reads it."""
    num_groups, m_max, k = a.shape
    check_row_major_rows(a, "a")
    if (num_groups > 1 and a.stride(0) < m_max * a.stride(1)) or a.stride(0) % 16 != 0:
        raise ValueError(f"a's groups must not overlap and start 16-byte aligned, got strides {tuple(a.stride())}")
    _check_layout_tensor(masked_m, "masked_m", num_groups)
    _check_bf16_d(d, (num_groups, m_max, n))
    check_int_range(expected_m, "expected_m", 1, max(m_max, 1))
    return scale_a(sfa, m_max, k // SCALE_BLOCK, num_groups)


def _check_masked_call(a, sfa, b, sfb, d, masked_m, expected_m) -> tuple:
    """Full validation; returns (M_max, n, k, G, whether sfa is kernel-ready)."""
    check_dtype(a, "a", (torch.float8_e4m3fn,))
    check_rank(a, "a", 3)
    num_groups, m_max, k = a.shape
    _check_k(k)
    n = _check_weights(b, sfb, k, num_groups)
    kernel_sfa = _check_masked_rows(a, sfa, d, masked_m, expected_m, n)
    for tensor, name in ((a, "a"), (sfa, "sfa"), (b, "b"), (sfb, "sfb"), (d, "d"), (masked_m, "masked_m")):
        check_cuda_device(tensor, name, like=a)
    return m_max, n, k, num_groups, kernel_sfa is sfa


def _grouped_plan(gemm_type: str, m: int, n: int, k: int, num_groups: int):
    num_sms = get_num_sms()
    key = (gemm_type, m, n, k, num_groups, num_sms)
    plan = _plans.get(key)
    if plan is None:
        config = heuristics.get_grouped_config(gemm_type, m, n, k, num_groups, num_sms)
        kernel = _kernel(config, n, k, torch.bfloat16, False, gemm_type)
        grid_m = m if gemm_type == CONTIGUOUS else m * num_groups
        grid = (num_sms if gemm_type == MASKED else fp8_heuristics.grid_size(config, grid_m, n, num_sms), 1, 1)
        plan = _plans[key] = (kernel, config, grid)
    return plan


def m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d: torch.Tensor, m_indices: torch.Tensor = None, recipe=None,
                                         recipe_a=None, recipe_b=None, *, grouped_layout: torch.Tensor = None,
                                         compiled_dims: str = "nk", disable_ue8m0_cast: bool = False,
                                         use_psum_layout: bool = False, ensure_zero_padding: bool = True,
                                         expected_m_for_psum_layout: int = None) -> torch.Tensor:
    """d[r] = a[r] @ b[m_indices[r]]^T for every row r of the contiguous layout, MXFP4 weights per expert.

    Args:
        a: (a [M_total, K] float8_e4m3fn, sfa [M_total, K / 128]); M_total a multiple of
            get_m_alignment_for_contiguous_layout(), each expert's segment padded to it (as for
            m_grouped_fp8_gemm_nt_contiguous).
        b: (codes [G, N, K / 2] float4_e2m1fn_x2 or uint8, sfb [G, N, K / 32] float8_e8m0fnu or uint8).
        d: [M_total, N] bf16 output.
        m_indices: [M_total] int32 CUDA tensor: each row's expert in [0, G), -1 on padding rows.
        grouped_layout: DeepGEMM's keyword for the layout argument, in place of m_indices (not both).
        recipe, recipe_a, recipe_b: as for fp8_fp4_gemm_nt (MXFP4: recipe_a (1, 128) with recipe_b (1, 32)).
        compiled_dims, disable_ue8m0_cast: DeepGEMM's options, accepted so that its calls run unchanged; neither
            changes anything here (validation.check_deepgemm_options).
        use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout: as for m_grouped_fp8_gemm_nt_contiguous
            (use_psum_layout=True: m_indices holds the experts' row ends).

    Returns:
        d.

    Notes:
        Padding rows of d are never written. Numerics as fp8_fp4_gemm_nt; deterministic; no host synchronisation
        (CUDA-graph safe with kernel-ready sfa).
    """
    check_deepgemm_options(compiled_dims, disable_ue8m0_cast)
    _reject_nvfp4(b)
    check_fp4_recipe(recipe, recipe_a, recipe_b, b)
    m_indices = call_m_indices(layout_argument(m_indices, grouped_layout), a, b, use_psum_layout, ensure_zero_padding,
                               expected_m_for_psum_layout)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, m_indices)
    a, sfa, b, sfb = _split_pairs(a, b)
    (m, n, k, num_groups, sfa_ready), launches = checked_call(_check_contiguous_call,
                                                             (a, sfa, b, sfb, d, m_indices))
    if not sfa_ready:
        sfa = scale_a(sfa, m, k // SCALE_BLOCK)
    inputs = (a, sfa, b, sfb, m_indices)
    if m == 0 or num_groups == 0:
        check_grouped_addresses(inputs, CONTIGUOUS_INPUTS, d)
        return d
    return launch_grouped(launches, _grouped_plan(CONTIGUOUS, m, n, k, num_groups), _encode_contiguous, inputs,
                          CONTIGUOUS_INPUTS, d, m, num_groups)


def _encode_contiguous(kernel, config, a, sfa, b, sfb, m_indices, d, m: int, num_groups: int) -> bytes:
    map_sfa = tensor_map(sfa, (config.block_m, 1), transpose=True)
    return kernel.encode(
        tmap_a=tensor_map(a, (config.block_m, SCALE_BLOCK), 128), tmap_b=_codes_map(b, config.block_n),
        tmap_sfa=map_sfa,
        tmap_d=tensor_map(d, (64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes),
        sfb=sfb.data_ptr(), shape_m=m, grouped_layout=m_indices.data_ptr(), num_groups=num_groups, d=d.data_ptr(),
        split_workspace=0, split_tickets=0, num_unsplit_tiles=0, tmap_sfb=map_sfa)


def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int, recipe=None,
                                     recipe_a=None, recipe_b=None, *, compiled_dims: str = "nk",
                                     disable_ue8m0_cast: bool = False) -> torch.Tensor:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T for every expert g (masked layout), MXFP4 weights.

    Args:
        a: (a [G, M_max, K] float8_e4m3fn, sfa [G, M_max, K / 128]) as for m_grouped_fp8_gemm_nt_masked.
        b: (codes [G, N, K / 2] float4_e2m1fn_x2 or uint8, sfb [G, N, K / 32] float8_e8m0fnu or uint8); or
            prepare_fp4_weights(codes, sfb) of those [G, ...] tensors, the experts' weights prepared once for the
            decode kernel (deep_kernels.fp4_weights).
        d: [G, M_max, N] bf16 output.
        masked_m: [G] int32 CUDA tensor, valid rows per expert, read on the device (clamped to [0, M_max]).
        expected_m: host-side estimate of the valid rows per expert in [1, max(M_max, 1)]; steers the tiling only.
        recipe, recipe_a, recipe_b: as for fp8_fp4_gemm_nt (MXFP4: recipe_a (1, 128) with recipe_b (1, 32)).
        compiled_dims, disable_ue8m0_cast: DeepGEMM's options, accepted so that its calls run unchanged; neither
            changes anything here (validation.check_deepgemm_options).

    Returns:
        d.

    Notes:
        Rows at or past masked_m[g] are never written. A fixed grid whatever masked_m holds; CUDA-graph safe
        (no host synchronisation). Numerics as fp8_fp4_gemm_nt; deterministic. Prepared weights run the decode
        kernel with A and B swapped (the weights expanded into wgmma's register operand, tokens its N) as
        persistent CTAs over the work items (expert, BLOCK_T tokens of its masked_m rows, 64 or 128 weight rows),
        each over the whole K: an expert with masked_m = 0 has no work items; D rows are stored from the
        accumulators, below masked_m only. Unprepared weights run the FP8 engine's masked kind with the codes
        expanded into shared memory.
    """
    check_deepgemm_options(compiled_dims, disable_ue8m0_cast)
    _reject_nvfp4(b)
    check_fp4_recipe(recipe, recipe_a, recipe_b, b)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m)
    return m_grouped_fp8_fp4_gemm_nt_masked_with_config(None, a, b, d, masked_m, expected_m)


def m_grouped_fp8_fp4_gemm_nt_masked_with_config(config, a, b, d: torch.Tensor, masked_m: torch.Tensor,
                                                 expected_m: int) -> torch.Tensor:
    """m_grouped_fp8_fp4_gemm_nt_masked with config in place of the chosen one (None: the chosen one), for measured
    tuning and tests: prepared weights only, a heuristics.fp8_fp4_swap_ab config without split-K
    (heuristics.fp8_fp4_swap_ab.get_masked_config)."""
    _reject_nvfp4(b)
    if isinstance(b, PreparedFp4Weights):
        return _masked_prepared(a, b, d, masked_m, expected_m, config)
    if config is not None:
        raise ValueError("config is taken with prepared weights only")
    a, sfa, b, sfb = _split_pairs(a, b)
    (m_max, n, k, num_groups, sfa_ready), launches = checked_call(_check_masked_call, (a, sfa, b, sfb, d, masked_m),
                                                                 expected_m)
    if not sfa_ready:
        sfa = scale_a(sfa, m_max, k // SCALE_BLOCK, num_groups)
    inputs = (a, sfa, b, sfb, masked_m)
    if m_max == 0 or num_groups == 0:
        check_grouped_addresses(inputs, MASKED_INPUTS, d)
        return d
    return launch_grouped(launches, _grouped_plan(MASKED, expected_m, n, k, num_groups), _encode_masked, inputs,
                          MASKED_INPUTS, d, m_max, num_groups)


def _encode_masked(kernel, config, a, sfa, b, sfb, masked_m, d, m_max: int, num_groups: int) -> bytes:
    map_sfa = tensor_map(sfa.permute(0, 2, 1), (1, 1, config.block_m))
    return kernel.encode(
        tmap_a=tensor_map(a, (1, config.block_m, SCALE_BLOCK), 128), tmap_b=_codes_map(b, config.block_n),
        tmap_sfa=map_sfa,
        tmap_d=tensor_map(d, (1, 64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes),
        sfb=sfb.data_ptr(), shape_m=m_max, grouped_layout=masked_m.data_ptr(), num_groups=num_groups,
        d=d.data_ptr(), split_workspace=0, split_tickets=0, num_unsplit_tiles=0, tmap_sfb=map_sfa)


def _check_masked_prepared_call(a, sfa, data, d, masked_m, expected_m, n: int, k_prepared: int) -> tuple:
    """Full validation with grouped prepared weights of n rows and k_prepared columns (data: their tensor); returns
    (M_max, k, G, whether sfa is kernel-ready)."""
    check_dtype(a, "a", (torch.float8_e4m3fn,))
    check_rank(a, "a", 3)
    num_groups, m_max, k = a.shape
    _check_k(k)
    if not isinstance(data, torch.Tensor) or data.dim() != 4:
        raise ValueError("the masked GEMM takes grouped prepared weights: prepare_fp4_weights of codes [G, N, K / 2] "
                         "and scales [G, N, K / 32]")
    if data.shape[0] != num_groups:
        raise ValueError(f"a has G = {num_groups} groups but the prepared weights {data.shape[0]}")
    if k != k_prepared:
        raise ValueError(f"a has K = {k} columns but the prepared weights K = {k_prepared}")
    if n % 16 != 0 or n == 0:
        raise ValueError(f"N must be a positive multiple of 16, got prepared weights of {n} rows")
    check_prepared(data, n, k, num_groups)
    kernel_sfa = _check_masked_rows(a, sfa, d, masked_m, expected_m, n)
    for tensor, name in ((a, "a"), (sfa, "sfa"), (data, "b"), (d, "d"), (masked_m, "masked_m")):
        check_cuda_device(tensor, name, like=a)
    return m_max, k, num_groups, kernel_sfa is sfa


# What the masked decode kernel reads from prepared weights, by name, in launch_grouped's order.
PREPARED_MASKED_INPUTS = ("a", "sfa", "b", "masked_m")


def _masked_prepared(a, prepared: PreparedFp4Weights, d, masked_m, expected_m: int, config) -> torch.Tensor:
    """m_grouped_fp8_fp4_gemm_nt_masked on grouped prepared weights: the swapped kernel's masked layout."""
    if not (isinstance(a, (tuple, list)) and len(a) == 2):
        raise TypeError("a must be an (a, sfa) pair")
    if config is not None and not (isinstance(config, swap_ab_heuristics.SwapAbConfig) and config.num_splits == 1):
        raise ValueError("config must be a heuristics.fp8_fp4_swap_ab config without split-K")
    a, sfa = a
    n = prepared.n
    (m_max, k, num_groups, sfa_ready), launches = checked_call(
        _check_masked_prepared_call, (a, sfa, prepared.data, d, masked_m), expected_m, n, prepared.k)
    if not sfa_ready:
        sfa = scale_a(sfa, m_max, k // SCALE_BLOCK, num_groups)
    inputs = (a, sfa, prepared.data, masked_m)
    if m_max == 0 or num_groups == 0:
        check_grouped_addresses(inputs, PREPARED_MASKED_INPUTS, d)
        return d
    plan = _masked_prepared_plan(config, expected_m, n, k, num_groups, prepared.tile_scaled)
    return launch_grouped(launches, plan, _encode_masked_prepared, inputs, PREPARED_MASKED_INPUTS, d, m_max,
                          num_groups)


def _masked_prepared_plan(config, expected_m: int, n: int, k: int, num_groups: int, tile_scaled: bool) -> tuple:
    """(kernel, config, grid) of the masked decode kernel: config, or the heuristics' pick where it is None."""
    num_sms = get_num_sms()
    key = ("masked_swap_ab", config, expected_m, n, k, num_groups, num_sms, tile_scaled)
    plan = _plans.get(key)
    if plan is None:
        if config is None:
            config = swap_ab_heuristics.get_masked_config(expected_m, n, k, num_groups, num_sms)
        kernel = _swap_ab_kernel(config, torch.bfloat16, False, True, True, tile_scaled)
        plan = _plans[key] = (kernel, config, (num_sms * config.ctas_per_sm, 1, 1))
    return plan


def _encode_masked_prepared(kernel, config, a, sfa, data, masked_m, d, m_max: int, num_groups: int) -> bytes:
    tmap_a = tensor_map(a, (1, swap_ab_heuristics.masked_a_box_rows(config), SCALE_BLOCK), 128)
    # NOTE: the masked layout reads neither tmap_codes nor tmap_d (bulk copies in, direct row stores out).
    return kernel.encode(
        tmap_a=tmap_a, tmap_codes=tmap_a, tmap_sfa=tensor_map(sfa.permute(0, 2, 1), (1, 1, config.block_t)),
        tmap_d=tmap_a, sfb_words=0, shape_n=d.shape[-1], shape_k=a.shape[-1], num_splits=1, split_workspace=0,
        split_tickets=0, prepared_weights=data.data_ptr(), masked_m=masked_m.data_ptr(), shape_m=m_max,
        num_groups=num_groups, d=d.data_ptr())


# (M, N, K) the heuristics' picks are precompiled for: DeepSeek-V3's dense shapes at decode and prefill sizes.
REPRESENTATIVE_MNK = tuple((m, n, k) for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
                                                  (4096, 7168), (7168, 2048)) for m in (1, 16, 64, 128, 4096))


@precompiled
def precompile_specs() -> list:
    """The dense picks over REPRESENTATIVE_MNK (bf16 D), the swapped kernel's at its decode sizes (on unprepared
    and prepared weights, tile-scaled or not), and the prefill expansion of prepared weights."""
    specs = {}
    for m, n, k in REPRESENTATIVE_MNK:
        args = tuple(heuristics.template_args(heuristics.get_config(m, n, k, 132), n, k, torch.bfloat16, False))
        specs.setdefault(args, FP8_GEMM.spec(*args))
        if m <= swap_ab_heuristics.MAX_TOKENS:
            for prepared, tile_scaled in ((False, False), (True, False), (True, True)):
                config = swap_ab_heuristics.get_config(m, n, k, 132, prepared=prepared)
                spec = swap_ab_kernel_spec(config, torch.bfloat16, False, prepared, tile_scaled=tile_scaled)
                specs.setdefault(("swap_ab",) + spec.template_args, spec)
    return list(specs.values()) + [FP4_PREPARED_EXPAND.spec(kBlockScaled=block, kTileScaled=tile)
                                   for block in ("true", "false") for tile in ("true", "false")]
