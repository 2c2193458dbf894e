"""Config choice for the FP8 x NVFP4 GEMM with A and B swapped (decode sizes, M <= 128 tokens a launch): the weights
expanded to f16 as wgmma's register operand, the tokens its N (csrc/kernels/sm90_fp8_nvfp4_gemm_swap_ab.cuh).

Pure functions of the problem and the device: no GPU calls, no torch. The configs are the MXFP4 swapped kernel's
(heuristics.fp8_fp4_swap_ab.SwapAbConfig, one CTA an SM) with this kernel's shared-memory carve-up; the choice
uses that kernel's fitted cost model (not refitted for NVFP4).
"""

from deep_kernels.heuristics import fp8_fp4_swap_ab as mxfp4
from deep_kernels.heuristics.fp8_fp4_swap_ab import SwapAbConfig
from deep_kernels.heuristics.fp8_gemm import BLOCK_K, SMEM_CAPACITY_BYTES

KERNEL_HEADER = "kernels/sm90_fp8_nvfp4_gemm_swap_ab.cuh"
BLOCK_TS = mxfp4.BLOCK_TS
MAX_TOKENS = mxfp4.MAX_TOKENS
GROUPS_PER_BLOCK = BLOCK_K // 16
MAX_STAGES = mxfp4.MAX_STAGES
MIN_STAGES = mxfp4.MIN_STAGES
SPLITS = mxfp4.SPLITS


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def _stage_bytes(block_t: int, num_math_warpgroups: int) -> int:
    block_w = 64 * num_math_warpgroups
    return block_t * BLOCK_K + block_w * BLOCK_K // 2 + _align(block_t * 4, 128) + block_w * GROUPS_PER_BLOCK


def smem_bytes(block_t: int, num_math_warpgroups: int, num_stages: int) -> int:
    """The kernel's carve-up (Sm90Fp8Nvfp4SwapAbTraits::kSmemBytes): the stages, two f16 activation tiles per math
    warpgroup (1024-byte aligned), the barriers."""
    f16_tiles = 2 * num_math_warpgroups * block_t * BLOCK_K * 2
    return _align(num_stages * _stage_bytes(block_t, num_math_warpgroups), 1024) + f16_tiles + 16 * num_stages


def max_stages(block_t: int, num_math_warpgroups: int) -> int:
    """As many stages as fit (up to MAX_STAGES); 0 where not even MIN_STAGES do."""
    fitting = [s for s in range(MIN_STAGES, MAX_STAGES + 1)
               if smem_bytes(block_t, num_math_warpgroups, s) <= SMEM_CAPACITY_BYTES]
    return max(fitting, default=0)


def max_chains(block_t: int) -> int:
    """The most accumulator chains whose sets (BLOCK_T / 2 registers each) fit in 32 registers beside the two f16
    fragment sets (32 registers each)."""
    return max(c for c in (1, 2, 4) if c == 1 or c * block_t // 2 <= 32)


def make_config(block_t: int, num_math_warpgroups: int = 2, num_stages: int = None, num_splits: int = 1,
                num_chains: int = None) -> SwapAbConfig:
    """A config of the given tiling (as many stages as fit and the most chains unless given), for overrides and
    tests."""
    if block_t not in BLOCK_TS or num_math_warpgroups not in (1, 2):
        raise ValueError(f"no swapped NVFP4 kernel for {block_t} tokens and {num_math_warpgroups} math warpgroups")
    stages = num_stages or max_stages(block_t, num_math_warpgroups)
    if stages < MIN_STAGES or smem_bytes(block_t, num_math_warpgroups, stages) > SMEM_CAPACITY_BYTES:
        raise ValueError(f"{stages} stages of {block_t} tokens and {num_math_warpgroups} math warpgroups do not fit")
    if num_splits < 1:
        raise ValueError(f"num_splits must be positive, got {num_splits}")
    chains = num_chains or max_chains(block_t)
    if chains not in (1, 2, 4) or chains > max_chains(block_t):
        raise ValueError(f"{chains} accumulator chains do not fit the registers of {block_t} tokens")
    return SwapAbConfig(block_t, num_math_warpgroups, stages, num_splits, 1, chains)


def smem_of(config: SwapAbConfig) -> int:
    return smem_bytes(config.block_t, config.num_math_warpgroups, config.num_stages)


def candidate_configs(m: int, n: int, k: int):
    block_t = mxfp4.block_t_for(m)
    for num_math_warpgroups in (2, 1):
        stages = max_stages(block_t, num_math_warpgroups)
        if stages < MIN_STAGES:
            continue
        for num_splits in (splits for splits in SPLITS if splits <= k // BLOCK_K):
            yield SwapAbConfig(block_t, num_math_warpgroups, stages, num_splits, 1, max_chains(block_t))


def get_config(m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2) -> SwapAbConfig:
    """The config with the lowest modelled time (the MXFP4 swapped kernel's model) for m <= MAX_TOKENS tokens."""
    if k % BLOCK_K != 0 or k <= 0 or n % 16 != 0 or n <= 0:
        raise ValueError(f"k must be a positive multiple of 128 and n of 16, got k = {k}, n = {n}")
    return min(candidate_configs(m, n, k),
               key=lambda config: mxfp4.estimate_seconds(config, m, n, k, num_sms, out_dtype_bytes))


def template_args(config: SwapAbConfig, out_dtype, with_accumulation: bool) -> list:
    """The kernel's C++ template arguments, in declaration order."""
    args = mxfp4.template_args(config, out_dtype, with_accumulation)
    return args[:5] + [str(config.num_chains)]
