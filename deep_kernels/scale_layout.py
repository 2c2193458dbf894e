"""DeepGEMM's scale-layout helpers, so that code written for DeepGEMM prepares its scales unchanged.

transform_sf_into_required_layout(sf, mn, k, recipe, ...) takes FP32 scales as the casts write them and returns them
in the layout the GEMMs read without a per-call copy. On Hopper, as DeepGEMM does there:
    1 x 128 scales (activations, or per-channel weights of the weight-gradient recipe), [G?, mn, ceil(k / 128)]:
        MN-major with mn rounded up to 4 (get_mn_major_tma_aligned_tensor; the input itself when already so);
    128 x 128 block scales (weights), [G?, ceil(mn / 128), ceil(k / 128)]: checked and returned as they are.
Other granularities, and DeepGEMM's packed UE8M0 int32 (its Blackwell layout), raise before anything runs. The FP4
GEMMs take their weight scales as the casts write them (per_token_cast_to_mxfp4, per_token_cast_to_nvfp4).
get_tma_aligned_size (public also as tma_aligned_size) is validation.tma_aligned_size with its arguments checked.
"""

import torch

from deep_kernels.gemm import SCALE_BLOCK, get_mn_major_tma_aligned_tensor
from deep_kernels.validation import (
    INT32_LIMIT, ceil_div, check_deepgemm_options, check_dtype, check_int_range, int_tuple, tma_aligned_size,
)

TMA_ELEMENT_SIZES = (1, 2, 4, 8, 16)


def get_tma_aligned_size(n: int, element_size: int) -> int:
    """n rounded up so that n elements of element_size bytes fill whole 16-byte TMA units (DeepGEMM's name)."""
    check_int_range(n, "n", 0, INT32_LIMIT)
    if isinstance(element_size, bool) or element_size not in TMA_ELEMENT_SIZES:
        raise ValueError(f"element_size must be one of {TMA_ELEMENT_SIZES} bytes, got {element_size!r}")
    return tma_aligned_size(n, element_size)


def _granularity(recipe, is_sfa) -> tuple:
    """(rows, K) of the scale blocks: a recipe (M, N, K) with is_sfa saying which operand, or a pair (rows, K)."""
    sizes = int_tuple(recipe) or ()
    if len(sizes) == 3:
        if not isinstance(is_sfa, bool):
            raise ValueError(f"a recipe (M, N, K) needs is_sfa (True: a's scales, False: b's), got {is_sfa!r}")
        return (sizes[0] if is_sfa else sizes[1]), sizes[2]
    if len(sizes) == 2:
        if is_sfa is not None:
            raise ValueError("is_sfa goes with a recipe (M, N, K), not with a pair (rows, K)")
        return sizes
    raise ValueError(f"recipe must be (M, N, K) scale block sizes or a pair (rows, K), got {recipe!r}")


def transform_sf_into_required_layout(sf: torch.Tensor, mn: int, k: int, recipe, num_groups: int = None,
                                      is_sfa: bool = None, disable_ue8m0_cast: bool = False,
                                      psum_layout: torch.Tensor = None) -> torch.Tensor:
    """The scales sf of an operand of mn rows and k columns in the layout the GEMMs read (module docstring).

    Args:
        sf: FP32 scales [num_groups?, ceil(mn / rows), ceil(k / 128)], any strides.
        mn, k: the operand's rows (M for a's scales, N for b's) and columns.
        recipe: (M, N, K) with is_sfa, or (rows, K): 1 x 128 or 128 x 128 blocks.
        num_groups: the leading group dimension of sf, or None when sf is 2-D.
        is_sfa: with a 3-element recipe, whether sf scales a (True) or b (False).
        disable_ue8m0_cast, psum_layout: DeepGEMM's options, checked; neither changes anything here (FP32 scales are
            read as given, and the MN-major layout keeps every row, the psum layout's padding rows included).

    Returns:
        The scales in the GEMMs' layout: a new MN-major tensor for 1 x 128 scales (sf itself when already so), sf
        itself for 128 x 128 blocks.
    """
    rows, k_block = _granularity(recipe, is_sfa)
    check_int_range(mn, "mn", 0, INT32_LIMIT)
    check_int_range(k, "k", 0, INT32_LIMIT)
    if num_groups is not None:
        check_int_range(num_groups, "num_groups", 0, INT32_LIMIT)
    check_deepgemm_options(disable_ue8m0_cast=disable_ue8m0_cast)
    if psum_layout is not None:
        check_dtype(psum_layout, "psum_layout", (torch.int32,))
    if (rows, k_block) not in ((1, SCALE_BLOCK), (SCALE_BLOCK, SCALE_BLOCK)):
        raise ValueError(f"Hopper's FP8 GEMMs read 1 x 128 and 128 x 128 scale blocks, got {rows} x {k_block} (the FP4 "
                         f"GEMMs take their weight scales as per_token_cast_to_mxfp4 / _nvfp4 write them)")
    if isinstance(sf, torch.Tensor) and sf.dtype == torch.int32:
        raise ValueError("packed UE8M0 int32 scales are DeepGEMM's Blackwell layout: pass the FP32 scales")
    check_dtype(sf, "sf", (torch.float32,))
    shape = (*(() if num_groups is None else (num_groups,)), ceil_div(mn, rows), ceil_div(k, k_block))
    if tuple(sf.shape) != shape:
        raise ValueError(f"sf of {rows} x {k_block} blocks for mn = {mn}, k = {k}"
                         f"{'' if num_groups is None else f', num_groups = {num_groups}'} must have shape {shape}, "
                         f"got {tuple(sf.shape)}")
    return get_mn_major_tma_aligned_tensor(sf) if rows == 1 else sf
