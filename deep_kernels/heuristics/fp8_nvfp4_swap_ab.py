"""Config choice for the FP8 x NVFP4 GEMM with A and B swapped (decode sizes, M <= 128 tokens a launch): the weights
expanded to f16 as wgmma's register operand, the tokens its N (csrc/kernels/sm90_fp8_nvfp4_gemm_swap_ab.cuh).

Pure functions of the problem and the device: no GPU calls, no torch. The configs are the MXFP4 swapped kernel's
(heuristics.fp8_fp4_swap_ab.SwapAbConfig; two CTAs an SM only with one math warpgroup of 16 tokens) with this
kernel's shared-memory carve-up; the split (and, above 16 tokens, the math warpgroups) is chosen by that kernel's
fitted cost model (not refitted for NVFP4) over the candidates below.
Measured on the H200 (2026-12-02, e9006d8: 9 configs at 16 tokens and 6 at 64 tokens on the six DeepSeek-V3 decode
shapes, in turns): at 16 tokens one math warpgroup with two CTAs an SM was the fastest config or within 4% of it
on every shape (1.03-1.32x the one-CTA picks), so it is the only candidate there; at 64 tokens the model's picks
were the fastest measured on every shape. Splits above 4 were not measured and are not offered.
"""

from deep_kernels.heuristics import fp8_fp4_swap_ab as mxfp4
from deep_kernels.heuristics.fp8_fp4_swap_ab import SwapAbConfig
from deep_kernels.heuristics.fp8_gemm import BLOCK_K

KERNEL_HEADER = "kernels/sm90_fp8_nvfp4_gemm_swap_ab.cuh"
BLOCK_TS = mxfp4.BLOCK_TS
MAX_TOKENS = mxfp4.MAX_TOKENS
GROUPS_PER_BLOCK = BLOCK_K // 16
MAX_STAGES = mxfp4.MAX_STAGES
MIN_STAGES = mxfp4.MIN_STAGES
SPLITS = (1, 2, 4)


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


def fits_registers(block_t: int, num_math_warpgroups: int) -> bool:
    """Whether the math threads' registers hold the tile: two math warpgroups (232 registers a thread) hold up to 64
    tokens (the two f16 fragment sets, the partial and the final accumulators of 128 tokens spill)."""
    return num_math_warpgroups == 1 or block_t <= 64


def can_share_sm(block_t: int, num_math_warpgroups: int) -> bool:
    """Whether two CTAs fit an SM (128 registers a thread): one math warpgroup of 16 tokens."""
    return num_math_warpgroups == 1 and block_t == 16


def max_stages(block_t: int, num_math_warpgroups: int, ctas_per_sm: int = 1) -> int:
    """As many stages as fit (up to MAX_STAGES); 0 where not even MIN_STAGES do."""
    fitting = [s for s in range(MIN_STAGES, MAX_STAGES + 1)
               if smem_bytes(block_t, num_math_warpgroups, s) <= mxfp4.smem_capacity(ctas_per_sm)]
    return max(fitting, default=0)


def max_chains(block_t: int) -> int:
    """The most accumulator chains whose sets (BLOCK_T / 2 registers each) fit in 32 registers beside the two f16
    fragment sets (32 registers each)."""
    return max(c for c in (1, 2, 4) if c == 1 or c * block_t // 2 <= 32)


def make_config(block_t: int, num_math_warpgroups: int = 2, num_stages: int = None, num_splits: int = 1,
                num_chains: int = None, ctas_per_sm: int = 1) -> SwapAbConfig:
    """A config of the given tiling (as many stages as fit and the most chains unless given), for overrides and
    tests."""
    if block_t not in BLOCK_TS or num_math_warpgroups not in (1, 2) or not fits_registers(block_t, num_math_warpgroups):
        raise ValueError(f"no swapped NVFP4 kernel for {block_t} tokens and {num_math_warpgroups} math warpgroups")
    if ctas_per_sm not in (1, 2) or (ctas_per_sm == 2 and not can_share_sm(block_t, num_math_warpgroups)):
        raise ValueError(f"{ctas_per_sm} CTAs an SM: two need one math warpgroup and 16 tokens")
    stages = num_stages or max_stages(block_t, num_math_warpgroups, ctas_per_sm)
    if stages < MIN_STAGES or smem_bytes(block_t, num_math_warpgroups, stages) > mxfp4.smem_capacity(ctas_per_sm):
        raise ValueError(f"{stages} stages of {block_t} tokens and {num_math_warpgroups} math warpgroups do not fit")
    if num_splits < 1:
        raise ValueError(f"num_splits must be positive, got {num_splits}")
    chains = num_chains or max_chains(block_t)
    if chains not in (1, 2, 4) or chains > max_chains(block_t):
        raise ValueError(f"{chains} accumulator chains do not fit the registers of {block_t} tokens")
    return SwapAbConfig(block_t, num_math_warpgroups, stages, num_splits, ctas_per_sm, chains)


def smem_of(config: SwapAbConfig) -> int:
    return smem_bytes(config.block_t, config.num_math_warpgroups, config.num_stages)


def candidate_configs(m: int, n: int, k: int):
    block_t = mxfp4.block_t_for(m)
    if can_share_sm(block_t, 1):
        for num_splits in (splits for splits in SPLITS if splits <= k // BLOCK_K):
            yield SwapAbConfig(block_t, 1, max_stages(block_t, 1, 2), num_splits, 2, max_chains(block_t))
        return
    for num_math_warpgroups in (2, 1):
        stages = max_stages(block_t, num_math_warpgroups)
        if stages < MIN_STAGES or not fits_registers(block_t, num_math_warpgroups):
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
    return args[:5] + [str(config.num_chains), str(config.ctas_per_sm)]
