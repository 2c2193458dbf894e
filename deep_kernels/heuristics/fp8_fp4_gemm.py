"""Config choice for the FP8 x MXFP4 GEMMs: the SM90 FP8 GEMM kernel's Fp8Mxfp4 operands
(csrc/gemm/sm90_fp4_expand.cuh).

Pure functions of the problem and the device: no GPU calls, no torch. The model is deep_kernels.heuristics.
fp8_gemm's (waves, per-K-block math and loads, DRAM, split-K at decode sizes) with the FP4 kind's differences:

* B moves 4.25 bits a weight (the e2m1 code and its share of the UE8M0 scale per 32) from DRAM and L2, not 8:
  at decode sizes the weight bytes are nearly all the traffic, which is where the kind gains.
* A K block also costs the expansion of the tile's BLOCK_N x 128 codes into e4m3 by the expander warps (the
  producer warpgroup's three spare ones, and with one math warpgroup a second warpgroup of four), overlapped
  with the loads and the math: the K block costs the largest of the three.
* The codes go through a ring of code stages of their own, as deep as the shared memory the math stages leave
  (3 math stages with one math warpgroup, 4 with two where they leave 4 code stages): a K block costs at least
  the code ring's round trip over its depth (CODE_ROUND_TRIP_SECONDS), which bounds decode sizes.
* No multicast (the kind does not take it).
"""

from deep_kernels.heuristics import fp8_gemm
from deep_kernels.heuristics.grouped_fp8_gemm import modelled_rows
from deep_kernels.heuristics.fp8_gemm import (
    BLOCK_K, BLOCK_NS, DRAM_BYTES_PER_S, EPILOGUE_SECONDS, LAUNCH_SECONDS, MATH_SECONDS_PER_K_BLOCK,
    MIN_STAGES, OVERLAP_EPILOGUE_FACTOR, OVERLAP_LOSS, PIPELINED_CONSTANT_SHARE, SM_INGEST_BYTES_PER_S,
    AGGREGATE_INGEST_BYTES_PER_S, SMEM_CAPACITY_BYTES, SPLIT_SECONDS, Fp8GemmConfig, can_pipeline,
    has_epilogue_overlap, swizzle_d_bytes,
)

OPERANDS = "fp8_mxfp4"
# Bits of B per weight: the e2m1 code plus an 8-bit scale per 32.
B_BITS_PER_WEIGHT = 4.25
# Tile heights: one math warpgroup (64 rows) or two (128). (256-row tiles, whose stages grow by the codes and
# column scales too, fit only two stages beside their D staging.)
BLOCK_MS = (64, 128)
# Seconds per code of the expansion by 3 (two math warpgroups) or 7 (one) expander warps: fitted on the H200
# (2026-12-02) to 128 x 128 tiles at M = 4096 (1.3 us a K block); one math warpgroup's seven warps scaled from it.
EXPAND_SECONDS_PER_CODE = {128: 8e-11, 64: 3.4e-11}
# The kernel's kFp4ExpandTableBytes.
EXPAND_TABLE_BYTES = 256
# The kernel's kMaxFp4CodeStages, and the fewest code stages a config may have.
MAX_CODE_STAGES = 32
MIN_CODE_STAGES = 2
# The round trip of a code stage (its TMA from DRAM under load, the expansion, the math, the release), which the
# ring of code stages divides: a K block costs at least its share. Fitted on the H200 (2026-12-02): the FP8 GEMM and
# this kind with 7 stages ran a K block every 0.65-0.73 us at decode sizes.
CODE_ROUND_TRIP_SECONDS = 4.7e-6
# Widest 128-row tile with split-K (the kernel's kMaxFp4SplitBlockN: the math warpgroups have 224 registers).
MAX_SPLIT_BLOCK_N = 96


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _fixed_bytes(block_m: int, block_n: int, num_stages: int, out_dtype_bytes: int) -> int:
    """The FP8 part of the carve-up: D staging, the math stages with per-column scales, their barriers, rounded up
    to 1024 bytes."""
    return _ceil_div(fp8_gemm.smem_bytes(block_m, block_n, num_stages, out_dtype_bytes, "fp8_mxfp4"),
                     1024) * 1024


def _code_stage_bytes(block_n: int) -> int:
    """One code stage: the codes, its two barriers, the rows' scale words."""
    return block_n * BLOCK_K // 2 + 16 + block_n * 4


def code_stages(block_m: int, block_n: int, num_stages: int, out_dtype_bytes: int) -> int:
    """Code stages the kernel carves from what the math stages leave (the traits' kNumCodeStages)."""
    left = SMEM_CAPACITY_BYTES - _fixed_bytes(block_m, block_n, num_stages, out_dtype_bytes) - EXPAND_TABLE_BYTES
    return max(0, min(left // _code_stage_bytes(block_n), MAX_CODE_STAGES))


def smem_bytes(block_m: int, block_n: int, num_stages: int, out_dtype_bytes: int) -> int:
    """Dynamic shared memory of the FP4 kind's carve-up (Sm90Fp8GemmTraits: kFp4SmemBytes): the FP8 stages with
    per-column scales (the expanders') and the barriers, then from a 1024-byte boundary the ring of code stages
    (codes, barriers, scale words) as deep as fits, and the expansion tables."""
    return (_fixed_bytes(block_m, block_n, num_stages, out_dtype_bytes) + EXPAND_TABLE_BYTES +
            code_stages(block_m, block_n, num_stages, out_dtype_bytes) * _code_stage_bytes(block_n))


def math_stages(block_m: int, block_n: int, out_dtype_bytes: int) -> int:
    """Math stages of a tiling: 3 for one math warpgroup (decode: the code ring takes the rest), 4 for two where
    that leaves 4 code stages; 0 when 3 leave fewer than MIN_CODE_STAGES."""
    for stages in ((4, 3) if block_m == 128 else (3,)):
        if code_stages(block_m, block_n, stages, out_dtype_bytes) >= (4 if stages == 4 else MIN_CODE_STAGES):
            return stages
    return 0


def is_legal_tile(block_m: int, block_n: int, grouped: bool = False) -> bool:
    return fp8_gemm.is_legal_tile(block_m, block_n, grouped, operands="fp8_mxfp4")


def make_config(block_m: int, block_n: int, out_dtype_bytes: int, num_stages: int = None, num_splits: int = 1,
                pipelined: bool = None, overlap_epilogue: bool = False) -> Fp8GemmConfig:
    """A config of the given tiling (as many stages as fit unless given; pipelined where the tile allows unless
    told otherwise), for overrides and tests."""
    if block_m not in BLOCK_MS or block_n not in BLOCK_NS or not is_legal_tile(block_m, block_n):
        raise ValueError(f"no FP4 kernel for {block_m}x{block_n} tiles")
    if overlap_epilogue and (num_splits != 1 or block_m != 128):
        raise ValueError("the epilogue overlap needs block_m == 128 and num_splits == 1")
    if num_splits != 1 and block_m == 128 and block_n > MAX_SPLIT_BLOCK_N:
        raise ValueError(f"128-row FP4 tiles take split-K up to {MAX_SPLIT_BLOCK_N} columns")
    if pipelined is None:
        pipelined = can_pipeline(block_m, block_n)
    elif pipelined and not can_pipeline(block_m, block_n):
        raise ValueError(f"a {block_m}x{block_n} tile cannot be pipelined")
    stages = num_stages or math_stages(block_m, block_n, out_dtype_bytes)
    if stages < MIN_STAGES or code_stages(block_m, block_n, stages, out_dtype_bytes) < MIN_CODE_STAGES:
        raise ValueError(f"{block_m}x{block_n} tiles with {stages} math stages leave too few code stages")
    return Fp8GemmConfig(block_m=block_m, block_n=block_n, num_stages=stages, num_tma_multicast=1,
                         multicast_on_a=False, swizzle_d_bytes=swizzle_d_bytes(block_n, out_dtype_bytes),
                         smem_bytes=smem_bytes(block_m, block_n, stages, out_dtype_bytes), num_splits=num_splits,
                         pipelined=pipelined, overlap_epilogue=overlap_epilogue)


def candidate_configs(m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2, grouped: bool = False):
    """Every legal config, larger tiles first (the tie order); split-K options for the Normal kind only."""
    for block_m in sorted(BLOCK_MS, reverse=True):
        for block_n in reversed(BLOCK_NS):
            if not is_legal_tile(block_m, block_n, grouped):
                continue
            stages = math_stages(block_m, block_n, out_dtype_bytes)
            if stages < MIN_STAGES:
                continue
            splitting = not grouped and (block_m == 64 or block_n <= MAX_SPLIT_BLOCK_N)
            splits = fp8_gemm._split_options(m, n, k, block_m, block_n, 1, num_sms) if splitting else (1,)
            for num_splits in splits:
                yield Fp8GemmConfig(
                    block_m=block_m, block_n=block_n, num_stages=stages, num_tma_multicast=1, multicast_on_a=False,
                    swizzle_d_bytes=swizzle_d_bytes(block_n, out_dtype_bytes),
                    smem_bytes=smem_bytes(block_m, block_n, stages, out_dtype_bytes), num_splits=num_splits,
                    pipelined=can_pipeline(block_m, block_n),
                    overlap_epilogue=has_epilogue_overlap(block_m, block_n, num_splits, grouped))


def estimate_seconds(config: Fp8GemmConfig, m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2,
                     with_accumulation: bool = False, num_groups: int = 1) -> float:
    """The model's run-time estimate (module docstring; fp8_gemm.estimate_seconds with the FP4 terms)."""
    units = fp8_gemm.num_work_units(config, m, n, num_sms, num_groups)
    clusters = fp8_gemm.grid_size(config, m, n, num_sms, num_groups)
    active_ctas = min(clusters, units)
    a, b = MATH_SECONDS_PER_K_BLOCK[config.block_m]
    math_s = a * (PIPELINED_CONSTANT_SHARE[config.block_m] if config.pipelined else 1.0) + b * max(config.block_n, 64)
    stage_bytes = config.block_m * BLOCK_K + config.block_n * BLOCK_K * B_BITS_PER_WEIGHT / 8 + config.block_m * 4
    load_s = max(stage_bytes / SM_INGEST_BYTES_PER_S, stage_bytes * active_ctas / AGGREGATE_INGEST_BYTES_PER_S)
    expand_s = config.block_n * BLOCK_K * EXPAND_SECONDS_PER_CODE[config.block_m]
    ring_s = CODE_ROUND_TRIP_SECONDS / code_stages(config.block_m, config.block_n, config.num_stages, out_dtype_bytes)
    k_block_s = max(math_s, load_s, expand_s, ring_s)
    k_blocks = _ceil_div(k, BLOCK_K)
    tile_s = k_blocks * k_block_s + EPILOGUE_SECONDS[config.block_m]
    busiest_cta_s = _ceil_div(units, clusters) * tile_s
    if config.num_splits > 1:
        unsplit = fp8_gemm.num_unsplit_tiles(config, m, n, num_sms)
        partial_bytes = config.block_m * config.block_n * 4
        job_s = (_ceil_div(k_blocks, config.num_splits) * k_block_s + EPILOGUE_SECONDS[config.block_m] +
                 SPLIT_SECONDS + config.num_splits * partial_bytes / SM_INGEST_BYTES_PER_S)
        busiest_cta_s = unsplit // clusters * tile_s + _ceil_div(units - unsplit, clusters) * job_s
    if config.overlap_epilogue:
        busiest_cta_s *= OVERLAP_EPILOGUE_FACTOR
    d_passes = 2 if with_accumulation else 1
    dram_bytes = num_groups * (m * k + n * k * B_BITS_PER_WEIGHT / 8 + d_passes * m * n * out_dtype_bytes)
    dram_s = dram_bytes / DRAM_BYTES_PER_S
    return LAUNCH_SECONDS + max(busiest_cta_s, dram_s) + OVERLAP_LOSS * min(busiest_cta_s, dram_s)


def ranked_configs(m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2, with_accumulation: bool = False,
                   num_groups: int = 1, grouped: bool = False) -> list:
    """(estimate, config) of every candidate, fastest first (ties keep the enumeration order)."""
    check_problem(n, k, num_sms)
    m = max(m, 1)
    timed = [(estimate_seconds(config, m, n, k, num_sms, out_dtype_bytes, with_accumulation, num_groups), config)
             for config in candidate_configs(m, n, k, num_sms, out_dtype_bytes, grouped)]
    timed.sort(key=lambda pair: pair[0])
    return timed


def check_problem(n: int, k: int, num_sms: int) -> None:
    """K a positive multiple of 128 (whole MX scale blocks per K block), N of 16, some SMs."""
    if k % BLOCK_K != 0 or k <= 0:
        raise ValueError(f"k must be a positive multiple of 128, got {k}")
    if n % 16 != 0 or n <= 0:
        raise ValueError(f"n must be a positive multiple of 16, got {n}")
    if num_sms <= 0:
        raise ValueError(f"num_sms must be positive, got {num_sms}")


def get_config(m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2,
               with_accumulation: bool = False) -> Fp8GemmConfig:
    """The dense FP8 x MXFP4 GEMM's config with the lowest modelled time for D[m, n] = A[m, k] * B[n, k]^T."""
    return ranked_configs(m, n, k, num_sms, out_dtype_bytes, with_accumulation)[0][1]


def expands_before(m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2,
                   with_accumulation: bool = False) -> bool:
    """Whether the dense GEMM is faster as a pre-pass expanding B to e4m3 with per-row 1 x 128 scales (the MXFP4 ->
    FP8 requantization: B's 4.25 bits read, 8 written) followed by the FP8 GEMM with per-channel B scales: at
    prefill sizes, where two math warpgroups outrun the kernel's three expander warps, against the kernel's best
    config."""
    in_kernel_s = ranked_configs(m, n, k, num_sms, out_dtype_bytes, with_accumulation)[0][0]
    requant_s = LAUNCH_SECONDS + n * k * (B_BITS_PER_WEIGHT / 8 + 1 + 4 / 128) / DRAM_BYTES_PER_S
    fp8_s = fp8_gemm.ranked_configs(max(m, 1), n, k, num_sms, out_dtype_bytes=out_dtype_bytes,
                                    with_accumulation=with_accumulation, allow_split_k=True,
                                    operands="fp8_channel_scaled")[0][0]
    return requant_s + fp8_s < in_kernel_s


def get_grouped_config(gemm_type: str, m: int, n: int, k: int, num_groups: int, num_sms: int) -> Fp8GemmConfig:
    """The grouped kinds' config (bf16 D; m: total rows when contiguous, expected rows per group when masked),
    with the rows per group modelled as heuristics.grouped_fp8_gemm does."""
    check_problem(n, k, num_sms)
    rows = modelled_rows(gemm_type, m, num_groups, 0)
    candidates = list(candidate_configs(rows, n, k, num_sms, grouped=True))
    return min(candidates, key=lambda config: estimate_seconds(
        config, modelled_rows(gemm_type, m, num_groups, config.block_m), n, k, num_sms, num_groups=num_groups))


def num_producer_threads(config: Fp8GemmConfig) -> int:
    """Threads of the producer side: the TMA warpgroup (whose three spare warps expand), plus a warpgroup of
    expanders with one math warpgroup (the kernel's kNumTMAThreads)."""
    return 256 if config.num_math_warpgroups == 1 else 128


def template_args(config: Fp8GemmConfig, n: int, k: int, out_dtype, with_accumulation: bool,
                  gemm_type: str = "normal") -> list:
    args = fp8_gemm.template_args(config, n, k, out_dtype, with_accumulation, gemm_type, OPERANDS)
    args[6] = str(num_producer_threads(config))
    return args
