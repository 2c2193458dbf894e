"""Config choice for the SM90 FP8 GEMM kernel (csrc/kernels/sm90_fp8_gemm.cuh).

Pure functions of the problem and the device: no GPU calls, no torch.

The model. Every candidate (BLOCK_M, BLOCK_N, multicast) gets an estimated run time and the fastest
wins; ties keep the first candidate of a fixed enumeration order (larger tiles first), so the choice is
deterministic.

* Waves: the persistent grid hands work units (tiles, or tile pairs with multicast) to clusters
  round-robin, so the busiest CTA runs ceil(units / clusters) tiles; the wave count rounds up, which is
  where a badly filled last wave costs.
* One tile costs K / 128 K blocks plus a fixed epilogue. A K block costs the larger of
    - math: wgmma plus the FP32 promotion, linear in max(BLOCK_N, 64) (fitted per math-warpgroup
      count; below N = 64 a wgmma is bound by its shared-memory reads of A);
    - loads: (BLOCK_M + BLOCK_N) x 128 bytes (+ sfa) at the per-SM ingest rate, which is capped per SM
      and shared by the active SMs (an aggregate L2-to-SM rate); a multicast operand counts half in the
      aggregate, since one L2 read feeds both CTAs of a pair.
* DRAM: unique bytes of A, B and D (D twice with accumulation) at an effective DRAM rate.
* Estimate = launch/prologue constant + max(busiest CTA's tiles, DRAM time) + OVERLAP_LOSS x the smaller
  of the two (they never overlap perfectly; this also ranks configs of DRAM-bound shapes); multicast
  scales it by MULTICAST_FACTOR: on the H200 the pair's lockstep costs 64- and 128-row tiles more than the
  halved L2 reads save, while 256-row tiles (the largest stages) gain from it.
  The dense kind (ranked_configs) rates a 256-row tile without a cluster, with the epilogue overlap and at most
  DENSE_TWO_WAVE_UNICAST_MAX_K_BLOCKS K blocks, at most DENSE_TWO_WAVE_UNICAST_OVER_MULTICAST times its multicast twin
  (measured faster at M = 4096).

Split-K (Normal kind, no multicast). When the tiles of a config are fewer than the SMs, the config is
also offered with S = 2 .. min(K / 128, num_sms // tiles) splits of every tile (so the jobs, tiles x S, fit
one wave): each job runs ceil(K / 128 / S) K blocks, then stores its FP32 partial tile (BLOCK_M x BLOCK_N x
4 bytes) to an L2-resident workspace and takes a ticket (SPLIT_SECONDS), and the last job of each tile
reads the S partials back (at the per-SM ingest rate) before its epilogue. At decode sizes a K block of one
tile is latency-bound (the wgmma group, its wait and the promotion: MATH_SECONDS_PER_K_BLOCK's constant
term), not bandwidth-bound, so cutting every CTA's K loop S-fold is what pays. With more tiles than SMs
only the last, partial wave is split (tail split): the first num_unsplit_tiles = tiles // SMs x SMs tiles
run whole, and the remaining tiles x S jobs (S = 2 .. min(K / 128, SMs // remaining tiles, MAX_TAIL_SPLITS))
fill the last wave. Ties keep fewer splits.
The last wave's rows as a second launch with a config of their own (the full waves' rows keeping the pick, with its
pipelined K loop and epilogue overlap, which split-K excludes) ran 0.93-1.02x the single launch on the H200
(2026-12-04: 4096 x 2112 x 7168; the weight gradients 24576 x 1536 and 7168 x 2048 at 4096 and 16384 tokens): a
partly filled wave runs at a higher clock than a full one, so it costs less than the wave count says. Not offered.

Time constants were fitted on an H200 (132 SMs, clocks as throttled under FP8 load) against measured
runs of this kernel; they only need to rank configs, not to predict absolute times exactly.
Shared memory takes as many pipeline stages as fit (at least MIN_STAGES, at most MAX_STAGES).
Multicast is only considered where its pairs are whole: on A (pairs of N-blocks) when the N-block count
is even, on B (pairs of M-blocks) when the M-block count (per group) is even.
"""

import math
from dataclasses import dataclass, replace

SMEM_CAPACITY_BYTES = 232448
BLOCK_K = 128
NUM_TMA_THREADS = 128
THREADS_PER_WARPGROUP = 128
MIN_STAGES = 3
MAX_STAGES = 32
# 64 rows: one math warpgroup; 128: two of 64 rows each; 256: two of 128 rows each (two 64-row wgmma waves
# sharing every B stage, so a stage's bytes feed twice the tensor work).
BLOCK_MS = (64, 128, 256)
# Multiples of 16 up to 192 (two 64 x N accumulator sets per thread must fit in 232 registers) whose
# tiles cover at most two 128-wide sfb blocks: BLOCK_N <= 128 + gcd(BLOCK_N, 128).
BLOCK_NS = tuple(n for n in range(16, 193, 16) if n <= 128 + math.gcd(n, 128))
# Widest 256-row tile: two waves of final accumulators and one partial set (3 x BLOCK_N / 2 registers) fit in
# 232 registers up to 128 columns; the kernel's kMaxTwoWaveBlockN.
MAX_TWO_WAVE_BLOCK_N = 128
# Widest tile whose K loop can be pipelined (two partial accumulator sets and the final one in registers), by
# math warpgroup count; the kernel's kMaxPipelinedBlockN.
MAX_PIPELINED_BLOCK_N = {64: 128, 128: 128}
# Widest 256-row tile whose K loop can be pipelined across its two waves (two final and two partial accumulator sets,
# 2 x BLOCK_N registers); block-scaled operands, the Normal kind. The kernel's kMaxPipelinedTwoWaveBlockN.
MAX_PIPELINED_TWO_WAVE_BLOCK_N = 96

# Model constants (seconds, bytes/s), fitted on an H200 (2026-11-30): about 9% mean
# error on 160 measured (shape, config) points; picks within 2% of the best measured config.
# a + b * BLOCK_N, by BLOCK_M. The 256-row terms were fitted on the H200 (2026-12-02) to a sweep of 128- and 256-row
# tiles with and without multicast at M = 4096 and 8192 over the six benchmark N x K (scripts/sweep_fp8_gemm.py):
# the picks are then within 0.9% of the fastest swept config on average, 6.6% at worst.
MATH_SECONDS_PER_K_BLOCK = {64: (0.15e-6, 0.0022e-6), 128: (0.12e-6, 0.00266e-6), 256: (0.12e-6, 0.0058e-6)}
# Share of the constant term a that a pipelined K loop still pays, by math WGs (the rest overlaps the next
# wgmma group). Fitted on the H200 (2026-11-30) to a sweep of both K loops over the 18 benchmark shapes
# (plain / pipelined time at equal tiles: 1.00-1.04 at M = 4096, mean 1.04 at M = 64 and 128); with it the
# model's pick is within 5% of the fastest swept config on every shape (geomean 0.6%).
# No 256-row entry (pipelined 256-row tiles are not offered, can_pipeline_waves): on the H200 (2026-12-02, the six
# benchmark N x K at M = 4096, timed in turns) 256x96 pipelined with 4 stages ran 1.006-1.041x its plain twin on five
# shapes (0.979 at 32768 x 512) but 0.81-0.94x the picks in two runs (smaller tiles, and at N = 4096 and 7168 a last
# partial wave of tiles); with 3 stages (two held by the loop) 0.64-0.87x, and 256x64 pipelined 0.64-0.76x.
PIPELINED_CONSTANT_SHARE = {64: 0.4, 128: 0.9}
SM_INGEST_BYTES_PER_S = 90e9
AGGREGATE_INGEST_BYTES_PER_S = 14e12
DRAM_BYTES_PER_S = 2.8e12
EPILOGUE_SECONDS = {64: 0.3e-6, 128: 0.5e-6, 256: 1.0e-6}  # by BLOCK_M
LAUNCH_SECONDS = 3e-6
# Time of a multicast config over its estimate, by BLOCK_M: the pair waits for each other's stage releases, which
# costs the narrower tiles more than the halved L2 reads of the shared operand save; 256-row tiles, whose stages
# are the largest, gain (same sweep as the 256-row terms above).
MULTICAST_FACTOR = {64: 1.05, 128: 1.05, 256: 0.97}
# The dense kind (block-scaled, one group: ranked_configs): a 256-row tile without a cluster, with the epilogue overlap
# (at least MIN_TILES_PER_CTA_FOR_OVERLAP tiles a CTA) and at most DENSE_TWO_WAVE_UNICAST_MAX_K_BLOCKS K blocks, runs in
# at most this share of the time of the same tile's pairs multicasting A (or B). On the H200 (2026-12-02, M = 4096,
# 256x128 tiles, 3 stages, timed in turns, two runs) it ran 1.008x and 1.007x (4096 x 7168), 1.040x and 1.039x
# (7168 x 2048) the pairs multicasting A and 1.03-1.04x those multicasting B; at 7168 x 16384 (128 K blocks) 1.009x and
# 0.992x the pairs multicasting A, so the longer K loops keep the pairs.
DENSE_TWO_WAVE_UNICAST_OVER_MULTICAST = 0.992
DENSE_TWO_WAVE_UNICAST_MAX_K_BLOCKS = 56
# Time of a block-scaled 256-row K block over MATH_SECONDS_PER_K_BLOCK[256]: its loop waits for the stage once for both
# waves and builds the wgmma descriptors in uniform registers (237 -> 204 instructions per K block). On the H200
# (2026-12-02, timed in turns with cuBLAS) 256x128 with A multicast went from 1.015x to 1.062x cuBLAS at 4096x4096x7168
# and from 1.030x to 1.078x at 4096x7168x16384, and beat 128x160 at 4096x7168x2048 (1.078x against 1.040x), while
# 128x192 kept 4096x24576x1536 (1.114x against 1.088x) and 4096x32768x512 (1.229x against 1.210x).
BLOCK_SCALED_TWO_WAVE_MATH_FACTOR = 0.97
# Time of a K block of a 256-row tile with D staged in parts (may_stage_d_in_parts: more stages than fit beside the
# whole tile's staging) over the same tile's K block with the stages that fit beside it; the candidates offer such
# configs only once it is measured to gain (None: not offered). On the H200 (2026-12-02, M = 4096, timed in turns)
# 256x128 with 4 stages (D in 64-column chunks) ran 1.000, 1.009 and 1.002x the same tiles with 3 stages at 7168 x 16384,
# 4096 x 7168 and 7168 x 2048, and 256x112 with 4 stages 0.80-0.95x the picks.
STAGED_IN_PARTS_K_BLOCK_FACTOR = None
OVERLAP_LOSS = 0.25  # share of the smaller of the two bounds that the larger does not hide
# A partial-tile store, a gpu-scope ticket and the barriers around it: fitted on the H200 (2026-11-30) to
# the split-K configs of the 12 decode shapes (measured within 0.4 us where split, e.g. 11.8 us at
# 64x2112x7168), so that 64x7168x2048 keeps its unsplit 64x64 tiles (9.3 us, against 11.1 us split).
SPLIT_SECONDS = 2.0e-6
# Time of an epilogue-overlap config over the same config without it, applied to its tiles' time. Fitted on the
# H200 (2026-11-30) to 18 (shape, tile) pairs at M = 4096 (the six benchmark N x K, 128 x {128, 160, 192}): 0.91 to
# 1.01, mean 0.955; never more than 1% slower. The saving grows with the tiles' length rather than staying one
# epilogue per tile, so it is a share, not a constant.
OVERLAP_EPILOGUE_FACTOR = 0.955
# The same for 256-row tiles (the next tile's first wave issued ahead). Fitted on the H200 (2026-12-02) to the six
# benchmark N x K at M = 4096, 256x128 tiles with and without the overlap, timed in turns: 0.969 to 0.989, mean 0.978.
TWO_WAVE_OVERLAP_EPILOGUE_FACTOR = 0.976
# Most splits of a tail split (the last job of a tile reads the partials back one after another).
MAX_TAIL_SPLITS = 8
# Split-K with a tile's splits in one cluster (Fp8GemmConfig.splits_in_cluster): the leader reads the other splits'
# partial sums from their shared memory after a cluster barrier, in place of SPLIT_SECONDS' workspace store, fence and
# ticket. Fitted on the H200 (2026-12-02, the decode sweep of scripts/sweep_decode_fp8_gemm.py, timed in turns with
# the workspace split of the same tiles): with 2 splits 0.6 to 2.7 us faster on every one of 14 tilings. With 3 and more
# splits the clusters of 3 or 4 CTAs did not all fit on the GPCs at once where the tiles x splits neared the SM count
# (0.53-0.74x), so the candidates offer 2 splits only.
CLUSTER_SPLIT_SECONDS = 0.6e-6
MAX_CLUSTER_SPLITS = 2
# Most stages of a one-math-warpgroup (64-row) dense tile at least 64 columns wide when M is one such tile
# (dense_stages_64_rows: also no more than a job's K blocks): on the H200 (same sweeps, timed in turns) 8 stages ran
# 3-7% faster than the 10-13 that fit at M = 64 (64x64 at 64x7168x2048 8.08 -> 7.82 us, 64x96 at 64x24576x1536
# 16.74 -> 16.02 us, 64x64/2c at 64x4096x7168 14.96 -> 14.27 us; 64x128 at 64x32768x512, 4 K blocks a tile, 9.10 us
# with 8, 8.99 with 4), while with two M blocks (M = 128) 64x64 tiles ran 4-6% faster with all 13 (10.99 against
# 11.49 us at 128x2112x7168, 16.67 against 17.71 at 128x4096x7168), as did 64x32 tiles (18 stages) and 128-row tiles.
MAX_DENSE_STAGES_64_ROWS = 8
# A dense unsplit 64-row tile of one M block running at least LONG_JOB_K_BLOCKS K blocks (K >= 16384) takes every stage
# that fits, and where M fills the tile and such tiles fit one wave (is_long_job_64_rows) its estimate is scaled by
# LONG_JOB_FACTOR: on the H200 (2026-12-02, L2 flushed before each run, timed in turns with the previous pick, 64x112
# with two splits in a cluster and 8 stages) 64x64 unsplit with 13 stages (evict-first B) ran 1.091x and 1.113x faster
# at 64x7168x16384 (two runs; 10 stages 1.006x 13), where B's 117 MB stream from DRAM; at M = 32 it ran 0.943x.
LONG_JOB_K_BLOCKS = 128
LONG_JOB_FACTOR = 0.95
# Dense tiles take the epilogue overlap only when a CTA runs at least this many tiles: at decode sizes, with one or two
# tiles per CTA, the same tiles without it ran 3.5-3.8% faster on the H200 (128x192 at 128x24576x1536 17.71 -> 17.06
# us, 128x128 at 128x32768x512 10.66 -> 10.29 us).
MIN_TILES_PER_CTA_FOR_OVERLAP = 3
# Dense block-scaled unicast tiles of decode GEMMs (M at most EVICT_FIRST_MAX_M, the rows measured) load B evict-first
# (Fp8GemmConfig.evict_first_b) where each B line's readers run at once (one M block, or at most
# EVICT_FIRST_MAX_M_BLOCKS with every tile in one wave) and B's bytes are at least EVICT_FIRST_MIN_B_OVER_D times D's
# (D read and written with accumulation). On the H200 (2026-12-02, the 12 decode shapes, L2 flushed before each run,
# timed in turns with the same configs without it, two runs) it ran 1.004-1.122x faster on every config of 11 shapes
# (median 1.04; 64x64 tiles at 128x4096x7168, two M blocks: 1.07), as B's lines, rather than the dirty lines that other
# work left in L2, make room for the lines that follow; at 128x32768x512 (B twice D) 1.006x and 0.989x. The estimate
# of such a config is scaled by EVICT_FIRST_B_FACTOR.
EVICT_FIRST_MAX_M = 128
EVICT_FIRST_MAX_M_BLOCKS = 2
EVICT_FIRST_MIN_B_OVER_D = 4
EVICT_FIRST_B_FACTOR = 0.96
# Time of a K block's math with the ping-pong schedule (the two math warpgroups take turns running their wgmma
# groups, csrc/gemm/sm90_math_schedule.cuh) over the same tiles' lockstep plain K loop, by BLOCK_M; the candidates
# offer the schedule only at the tile heights listed (where it was measured to win). None: on the H200 (2026-12-02,
# M = 4096, the six benchmark N x K, timed in turns with the lockstep kernel of the same tiles) it ran 1.04-1.10x
# the lockstep time at 128 and 256 rows (with the turn handed over at the issue instead: 1.01-1.03x).
PING_PONG_MATH_FACTOR = {}
# Own-tile ping-pong (MathSchedule::OwnTilePingPong: each of the two math warpgroups owns whole BLOCK_M-row tiles, which
# take turns at the tensor cores tile by tile): a + b * BLOCK_N seconds per K block of one tile, by BLOCK_M (the
# warpgroup's tile); the tiles' epilogues overlap the other warpgroup's turn (OWN_TILE_EPILOGUE_SECONDS). The candidates
# offer the schedule only at the tile heights listed (where it was measured to win). None: on the H200 (2026-12-02, the
# six benchmark N x K at M = 4096, timed in turns) 64x128 pipelined own tiles ran at 0.62-0.80x the model's picks and
# 0.72-0.92x their lockstep twin (128x128 pipelined: the same arithmetic per warpgroup); 128x128 own tiles (two waves,
# plain K loop) at 0.58-0.82x the picks and 0.64-0.87x their twin (256x128, the same cluster). In its turn one
# warpgroup feeds the tensor cores alone, so its K loop must keep a group in flight while it promotes: a second
# partial set, which 232 registers allow only up to 64 x 128 (MAX_OWN_TILE_PIPELINED_BLOCK_N); such a tile loads 24.8 KB
# per 64 x 128 x 128 K block, 1.5x the bytes per MAC of 128 x 128, and peaked at 942 TFLOPS (24576 x 1536), 84 GB/s per
# SM, the per-SM ingest rate the model fits (SM_INGEST_BYTES_PER_S; the 256x128 pick ran 1414 TFLOPS on 64 GB/s). The
# two-wave own tiles hold one partial set and drain the tensor pipe at every promotion.
OWN_TILE_MATH_SECONDS_PER_K_BLOCK = {}
OWN_TILE_EPILOGUE_SECONDS = 0.1e-6
# Tile heights the own-tile schedule takes (one or two 64-row waves per warpgroup), and by height the widest tile whose
# K loop it pipelines (one wave: two partial sets and the final one in registers; two waves hold no second partial set).
OWN_TILE_BLOCK_MS = (64, 128)
MAX_OWN_TILE_PIPELINED_BLOCK_N = {64: 128}
# Per-channel B scales: the promotion reads one float2 of sfb per 8 columns from shared memory and multiplies per
# column. Fitted on the H200 (2026-12-02) to the sweep of scripts/sweep_wgrad_gemm.py (four weight-gradient shapes,
# FP32 D accumulated, six tilings each): the picks are the fastest swept tiling on three shapes, 1.3% behind it on the
# fourth (4096 x 7168 x 16384: 128 x 160 against 128 x 128 pipelined).
CHANNEL_PROMOTION_SECONDS_PER_COLUMN = 0.0003e-6
# Per-channel B scales: the tile widths whose K loop runs as the pipelined halves (can_pipeline_halves: two wgmma groups
# of half the columns per K block, one promoted while the other runs), and their K-block math time over the plain K
# loop's. Once each half's first sfb pairs load one step ahead, on the H200 (2026-12-03, the eight weight-gradient
# shapes, timed in turns, bitwise equal) 128 x 192 with the halves ran 1.07-1.13x as fast as before (when 0.96-0.98 of
# the plain loop's time) and 1.034x and 1.089x as fast as 128 x 128 pipelined at 7168 x 2048 (4096 and 16384 tokens);
# 128 x 160 1.07x and 1.14x as fast as before at 4096 x 7168, where it ran 1.067x and 1.054x as fast as 128 x 192, and
# 1.13x as fast as 128 x 144 with the plain loop (the earlier pick) at 2112 x 2112 x 16384.
CHANNEL_HALVES_BLOCK_NS = (160, 192)
CHANNEL_HALVES_MATH_FACTOR = 0.9

GEMM_TYPES = {
    "normal": "deep_kernels::GemmType::Normal",
    "m_grouped_contiguous": "deep_kernels::GemmType::MGroupedContiguous",
    "m_grouped_masked": "deep_kernels::GemmType::MGroupedMasked",
    "k_grouped": "deep_kernels::GemmType::KGrouped",
}
# The operands' formats and scaling (csrc/gemm/gemm_operands.cuh).
GEMM_OPERANDS = {
    "fp8_block_scaled": "deep_kernels::GemmOperands::Fp8BlockScaled",
    "fp8_channel_scaled": "deep_kernels::GemmOperands::Fp8ChannelScaled",
    "fp8_mxfp4": "deep_kernels::GemmOperands::Fp8Mxfp4",
    "bf16": "deep_kernels::GemmOperands::Bf16",
}
# Operands whose B scales are 1 x 128 per row (loaded per stage next to sfa: BLOCK_N FP32 more per stage).
CHANNEL_SCALED_OPERANDS = ("fp8_channel_scaled",)
OUTPUT_TYPES = {"bfloat16": ("__nv_bfloat16", 2), "float32": ("float", 4)}
# How the two math warpgroups share the tensor cores (csrc/gemm/sm90_math_schedule.cuh); math_schedule picks one.
MATH_SCHEDULES = {"lockstep": "deep_kernels::MathSchedule::Lockstep", "ping_pong": "deep_kernels::MathSchedule::PingPong",
                  "own_tiles": "deep_kernels::MathSchedule::OwnTilePingPong"}

KERNEL_HEADER = "kernels/sm90_fp8_gemm.cuh"


@dataclass(frozen=True)
class Fp8GemmConfig:
    """One instantiation's tiling; `smem_bytes` is the dynamic shared memory to launch with."""

    block_m: int
    block_n: int
    num_stages: int
    num_tma_multicast: int
    multicast_on_a: bool
    swizzle_d_bytes: int
    smem_bytes: int
    block_k: int = BLOCK_K
    num_splits: int = 1
    pipelined: bool = False
    # Issue the next tile's first K block before this tile's store (the kernel's kOverlapEpilogue; BLOCK_M 128 or 256,
    # no split-K, grouped kinds BLOCK_N a multiple of 64): the candidates use it wherever it applies
    # (has_epilogue_overlap, OVERLAP_EPILOGUE_FACTOR, TWO_WAVE_OVERLAP_EPILOGUE_FACTOR).
    overlap_epilogue: bool = False
    # The two math warpgroups take turns issuing their wgmma groups (the kernel's MathSchedule::PingPong; two math
    # warpgroups, plain K loop): one warpgroup's group runs on the tensor cores while the other promotes.
    ping_pong: bool = False
    # Each of the two math warpgroups owns whole block_m-row tiles (64 or 128), consecutive tiles alternating, and the
    # warpgroups take turns at the tensor cores tile by tile (the kernel's MathSchedule::OwnTilePingPong): one's
    # promotion tail and store run while the other's wgmma groups run.
    own_tiles: bool = False
    # Split-K with each tile's num_splits jobs as one cluster (the kernel's kSplitsInCluster): the leader sums the other
    # splits' partial sums from their shared memory instead of a global workspace; every tile split, one job per CTA
    # (tiles x num_splits <= SMs: has_splits_in_cluster).
    splits_in_cluster: bool = False
    # B's boxes load with an L2 evict-first policy (the kernel's kEvictFirstB; dense block-scaled, no multicast or
    # multicast on B): where one M block (or one pair multicasting B) reads every line of B once (decode), B's lines make
    # room for the lines that follow.
    evict_first_b: bool = False
    # Per-channel B scales: a producer warp copies each stage's sfb thread-major (the kernel's kThreadMajorSfb), so
    # that the promotion reads a thread's sfb of two 8-column groups with one 16-byte shared-memory load.
    thread_major_sfb: bool = False

    @property
    def num_math_warpgroups(self) -> int:
        return 2 if self.own_tiles else num_math_warpgroups(self.block_m)

    @property
    def num_math_threads(self) -> int:
        return self.num_math_warpgroups * THREADS_PER_WARPGROUP

    @property
    def num_tma_threads(self) -> int:
        return NUM_TMA_THREADS

    @property
    def num_threads(self) -> int:
        return self.num_tma_threads + self.num_math_threads


def num_math_warpgroups(block_m: int) -> int:
    """One math warpgroup for 64-row tiles, two otherwise (the kernel's math_warpgroups_of)."""
    return 1 if block_m == 64 else 2


def num_m_waves(block_m: int) -> int:
    """64-row wgmma waves per math warpgroup (the kernel's m_waves_of)."""
    return block_m // (num_math_warpgroups(block_m) * 64)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _align(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def swizzle_d_bytes(block_n: int, out_dtype_bytes: int) -> int:
    """The TMA swizzle (and box width in bytes) of D: the widest of 128/64/32 dividing a tile row."""
    row_bytes = block_n * out_dtype_bytes
    return next(s for s in (128, 64, 32) if row_bytes % s == 0)


def stage_bytes(block_m: int, block_n: int, operands: str = "fp8_block_scaled") -> int:
    """Shared memory of one stage: A, B, sfa, and with per-column scales sfb: loaded by TMA with per-channel B scales
    (padded to 128 bytes, TMA's shared-memory alignment), written by the expanders with FP4 weights."""
    if operands in CHANNEL_SCALED_OPERANDS:
        sfb_bytes = _align(block_n * 4, 128)
    else:
        sfb_bytes = block_n * 4 if operands == "fp8_mxfp4" else 0
    return block_m * BLOCK_K + block_n * BLOCK_K + block_m * 4 + sfb_bytes


def smem_bytes(block_m: int, block_n: int, num_stages: int, out_dtype_bytes: int,
               operands: str = "fp8_block_scaled", own_tiles: bool = False, d_in_parts: bool = False) -> int:
    """Dynamic shared memory of the kernel's carve-up: D staging, then per stage A, B, sfa (and sfb with per-channel
    B scales), then barriers. D staging: the whole tile (with own tiles, each math warpgroup's), or with per-channel B
    scales and FP32 D two chunks of 64 rows per math warpgroup (the kernel's streamed store), or for a 256-row tile
    that may stage D in parts (d_in_parts: may_stage_d_in_parts) whose stages leave no room for the whole tile's, one
    64-row wave per math warpgroup, or where that does not fit either one chunk of a wave (the kernel's
    kStagedPartBytes)."""
    stages_bytes = num_stages * stage_bytes(block_m, block_n, operands) + 2 * num_stages * 8
    if operands in CHANNEL_SCALED_OPERANDS and out_dtype_bytes == 4:
        d_bytes = _align(num_math_warpgroups(block_m) * 2 * 64 * swizzle_d_bytes(block_n, 4), 1024)
    else:
        d_bytes = _align((2 if own_tiles else 1) * block_m * block_n * out_dtype_bytes, 1024)
        if d_in_parts and d_bytes + stages_bytes > SMEM_CAPACITY_BYTES:
            d_bytes = _align(num_math_warpgroups(block_m) * 64 * block_n * out_dtype_bytes, 1024)
            if d_bytes + stages_bytes > SMEM_CAPACITY_BYTES:
                d_bytes = _align(num_math_warpgroups(block_m) * 64 * swizzle_d_bytes(block_n, out_dtype_bytes), 1024)
    return d_bytes + stages_bytes


def may_stage_d_in_parts(block_m: int, operands: str = "fp8_block_scaled", ping_pong: bool = False,
                         grouped: bool = False) -> bool:
    """Whether the kernel stages a tile's D in parts where its stages leave no room for the whole tile's (the kernel's
    kStagedPartBytes): 256-row tiles of the Normal kind with block-scaled operands, lockstep."""
    return block_m == 256 and operands == "fp8_block_scaled" and not ping_pong and not grouped


def stages_d_in_parts(config, out_dtype_bytes: int = 2, operands: str = "fp8_block_scaled") -> bool:
    """Whether the config's kernel stages D in parts (more stages than fit beside the whole tile's staging)."""
    return (may_stage_d_in_parts(config.block_m, operands, config.ping_pong) and
            config.num_stages > max_stages(config.block_m, config.block_n, out_dtype_bytes, operands=operands))


def max_stages(block_m: int, block_n: int, out_dtype_bytes: int, smem_capacity: int = SMEM_CAPACITY_BYTES,
               operands: str = "fp8_block_scaled", own_tiles: bool = False, d_in_parts: bool = False) -> int:
    """The most stages that fit (d_in_parts: with D staged in parts where the whole tile's staging leaves too few)."""
    if d_in_parts:
        return max((s for s in range(1, MAX_STAGES + 1) if smem_bytes(block_m, block_n, s, out_dtype_bytes, operands,
                                                                       d_in_parts=True) <= smem_capacity),
                   default=0)
    fixed = smem_bytes(block_m, block_n, 0, out_dtype_bytes, operands, own_tiles)
    per_stage = smem_bytes(block_m, block_n, 1, out_dtype_bytes, operands, own_tiles) - fixed
    return min(MAX_STAGES, (smem_capacity - fixed) // per_stage)


def can_pipeline(block_m: int, block_n: int) -> bool:
    """Whether the tile's K loop can keep two wgmma groups in flight (registers for three accumulator sets; not
    at 256 rows, whose registers hold two waves of final accumulators)."""
    return block_n <= MAX_PIPELINED_BLOCK_N.get(block_m, 0)


def can_pipeline_waves(block_m: int, block_n: int, operands: str = "fp8_block_scaled", num_splits: int = 1,
                       ping_pong: bool = False) -> bool:
    """Whether a 256-row tile can pipeline its K loop across its two waves (each wave's wgmma group runs while the
    other wave's is promoted; the kernel's kPipelinedWaves): block-scaled operands, BLOCK_N at most
    MAX_PIPELINED_TWO_WAVE_BLOCK_N, no split-K, lockstep (the Normal kind: the grouped kinds refuse it)."""
    return (block_m == 256 and block_n <= MAX_PIPELINED_TWO_WAVE_BLOCK_N and operands == "fp8_block_scaled" and
            num_splits == 1 and not ping_pong)


def can_pipeline_halves(block_m: int, block_n: int, operands: str, num_splits: int = 1) -> bool:
    """Whether a per-channel-scaled tile too wide for a second accumulator set can run its K loop as pipelined halves
    (two wgmma groups of BLOCK_N / 2 columns per K block, one promoted while the other runs; the kernel's
    kPipelinedHalves; the k-grouped kind's at most 160 columns): 64 or 128 rows, BLOCK_N a multiple of 32, no split-K."""
    return (operands in CHANNEL_SCALED_OPERANDS and block_m in MAX_PIPELINED_BLOCK_N and
            block_n > MAX_PIPELINED_BLOCK_N[block_m] and block_n % 32 == 0 and num_splits == 1)


def can_ping_pong(block_m: int, pipelined: bool) -> bool:
    """Whether the kernel takes the ping-pong schedule: two math warpgroups (128 or 256 rows), plain K loop."""
    return block_m in (128, 256) and not pipelined


def can_own_tiles(block_m: int, block_n: int, num_splits: int = 1, grouped: bool = False,
                  operands: str = "fp8_block_scaled") -> bool:
    """Whether the kernel takes the own-tile ping-pong: 64- or 128-row tiles per math warpgroup (128 rows: two waves,
    at most MAX_TWO_WAVE_BLOCK_N columns), the Normal kind with block-scaled operands, no split-K."""
    return (block_m in OWN_TILE_BLOCK_MS and (block_m == 64 or block_n <= MAX_TWO_WAVE_BLOCK_N) and num_splits == 1 and
            not grouped and operands == "fp8_block_scaled")


def can_pipeline_own_tile(block_m: int, block_n: int) -> bool:
    """Whether an own tile's K loop can keep a group in flight across K blocks (MAX_OWN_TILE_PIPELINED_BLOCK_N)."""
    return block_n <= MAX_OWN_TILE_PIPELINED_BLOCK_N.get(block_m, 0)


def math_schedule(config) -> str:
    """The kernel's MathSchedule for the config (MATH_SCHEDULES)."""
    if config.own_tiles:
        return MATH_SCHEDULES["own_tiles"]
    return MATH_SCHEDULES["ping_pong" if config.ping_pong else "lockstep"]


def is_legal_tile(block_m: int, block_n: int, grouped: bool = False, operands: str = "fp8_block_scaled") -> bool:
    """Whether the kernel takes the tiling: 256-row tiles at most MAX_TWO_WAVE_BLOCK_N columns wide, for the M-grouped
    kinds (`grouped`) only with block-scaled FP8 operands."""
    return block_m != 256 or (block_n <= MAX_TWO_WAVE_BLOCK_N and (not grouped or operands == "fp8_block_scaled"))


def is_legal_multicast(block_m: int, num_tma_multicast: int, multicast_on_a: bool, grouped: bool = False) -> bool:
    """Whether the kernel takes the cluster: the M-grouped kinds' 256-row tiles multicast A only (a contiguous
    256-row tile may start on an odd 128-row half, so M-block pairs do not line up with the segments)."""
    return not (grouped and block_m == 256 and num_tma_multicast == 2 and not multicast_on_a)


def has_splits_in_cluster(config: Fp8GemmConfig, m: int, n: int, num_sms: int) -> bool:
    """Whether a splits-in-cluster config can run the problem: every CTA one job, so tiles x splits fit the SMs."""
    return config.splits_in_cluster and num_tiles(config, m, n) * config.num_splits <= num_sms


def num_tiles(config: Fp8GemmConfig, m: int, n: int) -> int:
    """Output tiles of a Normal GEMM (what split-K's workspace and tickets are sized by)."""
    return _ceil_div(m, config.block_m) * _ceil_div(n, config.block_n)


def num_unsplit_tiles(config: Fp8GemmConfig, m: int, n: int, num_sms: int) -> int:
    """Tiles of a split-K config that run whole: 0 with fewer tiles than SMs (every tile is split), else
    the full waves' tiles (only the last, partial wave is split)."""
    if config.num_splits == 1:
        return num_tiles(config, m, n)
    return num_tiles(config, m, n) // num_sms * num_sms


def split_workspace_sizes(config: Fp8GemmConfig, m: int, n: int, num_sms: int) -> tuple:
    """(FP32 workspace floats, uint32 tickets) a split-K launch needs; (0, 0) without split-K."""
    if config.num_splits == 1 or config.splits_in_cluster:
        return 0, 0
    split_tiles = num_tiles(config, m, n) - num_unsplit_tiles(config, m, n, num_sms)
    return (split_tiles * config.num_splits * config.block_m * config.block_n,
            split_tiles * config.num_math_warpgroups)


def num_work_units(config: Fp8GemmConfig, m: int, n: int, num_sms: int, num_groups: int = 1) -> int:
    """Scheduler units (tiles, or tile pairs with multicast; with split-K, jobs: the unsplit tiles plus
    splits x the split tiles) of a Normal or masked (m rows per group) GEMM on num_sms SMs."""
    num_m_blocks = _ceil_div(m, config.block_m)
    num_n_blocks = _ceil_div(n, config.block_n)
    if config.num_tma_multicast == 2:
        if config.multicast_on_a:
            num_n_blocks = _ceil_div(num_n_blocks, 2)
        else:
            num_m_blocks = _ceil_div(num_m_blocks, 2)
    units = num_groups * num_m_blocks * num_n_blocks
    unsplit = num_unsplit_tiles(config, m, n, num_sms) if config.num_splits > 1 else units
    return unsplit + (units - unsplit) * config.num_splits


def grid_size(config: Fp8GemmConfig, m: int, n: int, num_sms: int, num_groups: int = 1) -> int:
    """CTAs to launch: one per SM at most, a whole number of clusters, no more than the work needs.

    For contiguous grouped GEMMs pass m = total rows; for masked ones the work depends on device data, so
    launch num_sms rounded down to the cluster size.
    """
    if config.splits_in_cluster:
        return max(1, num_tiles(config, m, n)) * config.num_splits
    clusters = min(num_sms // config.num_tma_multicast, max(1, num_work_units(config, m, n, num_sms, num_groups)))
    return clusters * config.num_tma_multicast


def estimate_seconds(config: Fp8GemmConfig, m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2,
                     with_accumulation: bool = False, num_groups: int = 1, operands: str = "fp8_block_scaled",
                     num_m_blocks: float = None) -> float:
    """The model's run-time estimate (see the module docstring); per-channel B scales add BLOCK_N FP32 to every
    stage and their promotion's shared-memory reads to every K block (CHANNEL_PROMOTION_SECONDS_PER_COLUMN).
    num_m_blocks: M-blocks per group in place of ceil(m / BLOCK_M), where the rows are not known on the host (masked
    groups: their expected block count; fractional), no split-K."""
    units = num_work_units(config, m, n, num_sms, num_groups)
    if num_m_blocks is not None:
        num_n_blocks = _ceil_div(n, config.block_n)
        if config.num_tma_multicast == 2 and config.multicast_on_a:
            num_n_blocks = _ceil_div(num_n_blocks, 2)
        elif config.num_tma_multicast == 2:
            num_m_blocks /= 2
        units = num_groups * num_m_blocks * num_n_blocks
    ctas = grid_size(config, m, n, num_sms, num_groups)
    clusters = ctas // config.num_tma_multicast
    active_ctas = min(ctas, units * config.num_tma_multicast)

    a, b = MATH_SECONDS_PER_K_BLOCK[config.block_m]
    # NOTE: the pipelined halves (wider tiles) are modelled as the plain K loop at CHANNEL_HALVES_MATH_FACTOR.
    halves = config.pipelined and can_pipeline_halves(config.block_m, config.block_n, operands, config.num_splits)
    pipelined = config.pipelined and not halves
    # NOTE: below N = 64 a wgmma is bound by reading A from shared memory, not by its N.
    math_s = a * (PIPELINED_CONSTANT_SHARE[config.block_m] if pipelined else 1.0) + b * max(config.block_n, 64)
    epilogue_s = EPILOGUE_SECONDS[config.block_m]
    if config.own_tiles:
        if config.block_m in OWN_TILE_MATH_SECONDS_PER_K_BLOCK:
            a, b = OWN_TILE_MATH_SECONDS_PER_K_BLOCK[config.block_m]
        else:
            # Unmeasured (forced configs only): half the K block of the lockstep tile of twice the rows, whose two
            # warpgroups each run this tile's work.
            a, b = (term / 2 for term in MATH_SECONDS_PER_K_BLOCK[2 * config.block_m])
        math_s, epilogue_s = a + b * max(config.block_n, 64), OWN_TILE_EPILOGUE_SECONDS
    if config.ping_pong:
        math_s *= PING_PONG_MATH_FACTOR[config.block_m]
    if config.block_m == 256 and operands == "fp8_block_scaled":
        math_s *= BLOCK_SCALED_TWO_WAVE_MATH_FACTOR
    if operands in CHANNEL_SCALED_OPERANDS:
        math_s += CHANNEL_PROMOTION_SECONDS_PER_COLUMN * config.block_n * num_m_waves(config.block_m)
        if halves:
            math_s *= CHANNEL_HALVES_MATH_FACTOR
    a_bytes, b_bytes = config.block_m * BLOCK_K, config.block_n * BLOCK_K
    loaded_bytes = stage_bytes(config.block_m, config.block_n, operands)
    l2_bytes = loaded_bytes
    if config.num_tma_multicast == 2:
        l2_bytes -= (a_bytes if config.multicast_on_a else b_bytes) / 2
    load_s = max(loaded_bytes / SM_INGEST_BYTES_PER_S, l2_bytes * active_ctas / AGGREGATE_INGEST_BYTES_PER_S)
    k_block_s = max(math_s, load_s)
    if not config.pipelined and stages_d_in_parts(config, out_dtype_bytes, operands):
        # NOTE: unmeasured (forced configs only): as the same tiles with the stages that fit beside the whole tile.
        k_block_s *= STAGED_IN_PARTS_K_BLOCK_FACTOR or 1.0
    busiest_cta_s = _ceil_div(units, clusters) * (_ceil_div(k, BLOCK_K) * k_block_s + epilogue_s)
    if config.num_splits > 1:
        # Whole waves of unsplit tiles (none at decode sizes), then one or more waves of split jobs.
        unsplit = num_unsplit_tiles(config, m, n, num_sms)
        partial_bytes = config.block_m * config.block_n * 4
        # Splits in a cluster: the leader reads the other splits' partial sums, no workspace round trip.
        split_s, partials_read = ((CLUSTER_SPLIT_SECONDS, config.num_splits - 1) if config.splits_in_cluster
                                  else (SPLIT_SECONDS, config.num_splits))
        job_s = (_ceil_div(_ceil_div(k, BLOCK_K), config.num_splits) * k_block_s + EPILOGUE_SECONDS[config.block_m] +
                 split_s + partials_read * partial_bytes / SM_INGEST_BYTES_PER_S)
        busiest_cta_s = (unsplit // clusters * (_ceil_div(k, BLOCK_K) * k_block_s + EPILOGUE_SECONDS[config.block_m]) +
                         _ceil_div(units - unsplit, clusters) * job_s)

    if config.overlap_epilogue:
        busiest_cta_s *= TWO_WAVE_OVERLAP_EPILOGUE_FACTOR if config.block_m == 256 else OVERLAP_EPILOGUE_FACTOR

    d_passes = 2 if with_accumulation else 1
    dram_bytes = num_groups * (m * k + n * k + d_passes * m * n * out_dtype_bytes)
    dram_s = dram_bytes / DRAM_BYTES_PER_S
    seconds = LAUNCH_SECONDS + max(busiest_cta_s, dram_s) + OVERLAP_LOSS * min(busiest_cta_s, dram_s)
    if config.evict_first_b:
        seconds *= EVICT_FIRST_B_FACTOR
    return seconds * (MULTICAST_FACTOR[config.block_m] if config.num_tma_multicast == 2 else 1.0)


def _multicast_options(m: int, n: int, block_m: int, block_n: int, num_sms: int):
    yield 1, False
    if num_sms < 2:
        return
    if _ceil_div(n, block_n) % 2 == 0:
        yield 2, True
    num_m_blocks = _ceil_div(m, block_m)
    if num_m_blocks % 2 == 0:
        yield 2, False


def _split_options(m: int, n: int, k: int, block_m: int, block_n: int, num_tma_multicast: int, num_sms: int):
    """Split counts to try: 1, and (no multicast) 2 .. one wave of jobs: every tile's splits with fewer
    tiles than SMs, the last partial wave's (at most MAX_TAIL_SPLITS) with more."""
    yield 1
    tiles = _ceil_div(m, block_m) * _ceil_div(n, block_n)
    if num_tma_multicast != 1 or block_m == 256:
        return
    if tiles < num_sms:
        yield from range(2, min(_ceil_div(k, BLOCK_K), num_sms // tiles) + 1)
    elif tiles % num_sms:
        yield from range(2, min(_ceil_div(k, BLOCK_K), num_sms // (tiles % num_sms), MAX_TAIL_SPLITS) + 1)


def has_streamed_store_registers(block_m: int, num_tma_multicast: int, out_dtype_bytes: int, operands: str) -> bool:
    """Whether the tiling compiles without a stack frame: the streamed FP32 store (per-channel B scales) of 256-row
    tiles spills without a 2-CTA cluster (the kernel's static_assert)."""
    return not (operands in CHANNEL_SCALED_OPERANDS and out_dtype_bytes == 4 and block_m == 256 and
                num_tma_multicast == 1)


def has_epilogue_overlap(block_m: int, block_n: int, num_splits: int, grouped: bool = False,
                         operands: str = "fp8_block_scaled") -> bool:
    """Whether a tiling takes the epilogue overlap (the kernel's kOverlapEpilogue): 128-row tiles (256-row ones with
    block-scaled operands) without split-K, for the grouped kinds with block scales or FP4 weights only tiles of a
    multiple of 64 columns (ptxas serializes the wgmma of the others: their vote and row-predicated store meet the K
    loop's dispatch over more than two sfb offsets, which per-channel B scales do not have)."""
    return ((block_m == 128 or (block_m == 256 and operands == "fp8_block_scaled")) and num_splits == 1 and
            (not grouped or block_n % 64 == 0 or operands in CHANNEL_SCALED_OPERANDS))


def candidate_configs(m: int, n: int, num_sms: int, smem_capacity: int = SMEM_CAPACITY_BYTES,
                      out_dtype_bytes: int = 2, k: int = None, grouped: bool = False, block_ms: tuple = BLOCK_MS,
                      operands: str = "fp8_block_scaled"):
    """Every legal config for the problem, in the fixed order ties are broken by (split-K options only when k is
    given: Normal GEMMs; grouped: the grouped kinds' epilogue overlap rule); block_ms: the tile heights to offer;
    operands: what a stage holds (GEMM_OPERANDS)."""
    # NOTE: larger tiles first, so ties (typically memory-bound shapes) go to the one moving fewer bytes.
    for block_m in sorted(block_ms, reverse=True):
        for block_n in reversed(BLOCK_NS):
            if not is_legal_tile(block_m, block_n, grouped):
                continue
            stages = max_stages(block_m, block_n, out_dtype_bytes, smem_capacity, operands)
            if stages < MIN_STAGES:
                continue
            # Dense block-scaled tiles (k given): the decode rules on stages and the epilogue overlap.
            dense = k is not None and operands == "fp8_block_scaled"
            for num_tma_multicast, multicast_on_a in _multicast_options(m, n, block_m, block_n, num_sms):
                if not (has_streamed_store_registers(block_m, num_tma_multicast, out_dtype_bytes, operands) and
                        is_legal_multicast(block_m, num_tma_multicast, multicast_on_a, grouped)):
                    continue
                splits = (1,) if k is None else _split_options(m, n, k, block_m, block_n, num_tma_multicast, num_sms)
                for num_splits in splits:
                    overlap = has_epilogue_overlap(block_m, block_n, num_splits, grouped, operands) and not (
                        dense and _ceil_div(_ceil_div(m, block_m) * _ceil_div(n, block_n), num_sms) <
                        MIN_TILES_PER_CTA_FOR_OVERLAP)
                    config = Fp8GemmConfig(
                        block_m=block_m,
                        block_n=block_n,
                        num_stages=stages,
                        num_tma_multicast=num_tma_multicast,
                        multicast_on_a=multicast_on_a,
                        swizzle_d_bytes=swizzle_d_bytes(block_n, out_dtype_bytes),
                        smem_bytes=smem_bytes(block_m, block_n, stages, out_dtype_bytes, operands),
                        num_splits=num_splits,
                        pipelined=can_pipeline(block_m, block_n) or (
                            block_n in CHANNEL_HALVES_BLOCK_NS and
                            can_pipeline_halves(block_m, block_n, operands, num_splits)),
                        overlap_epilogue=overlap,
                    )
                    if dense and block_m == 64 and m <= 64 and block_n >= 64:
                        config = with_stages(config, dense_stages_64_rows(stages, k, num_splits), out_dtype_bytes)
                    if dense and takes_evict_first_b(config, m, n, k, num_sms, out_dtype_bytes):
                        config = replace(config, evict_first_b=True)
                    yield config
                    # NOTE: after the same tiles with the whole tile staged, so that a tie keeps them.
                    if (STAGED_IN_PARTS_K_BLOCK_FACTOR is not None and not grouped and not config.pipelined and
                            may_stage_d_in_parts(block_m, operands)):
                        parts_stages = max_stages(block_m, block_n, out_dtype_bytes, smem_capacity, operands,
                                                  d_in_parts=True)
                        if parts_stages > stages:
                            yield replace(config, num_stages=parts_stages, smem_bytes=smem_bytes(
                                block_m, block_n, parts_stages, out_dtype_bytes, operands, d_in_parts=True))
                    # NOTE: after its plain twin, so that a tie keeps the plain K loop; offered once its share of the
                    # constant term is measured (PIPELINED_CONSTANT_SHARE[256]).
                    if (block_m in PIPELINED_CONSTANT_SHARE and not grouped and
                            can_pipeline_waves(block_m, block_n, operands, num_splits)):
                        waves_stages = max_stages(block_m, block_n, out_dtype_bytes, smem_capacity, operands,
                                                  d_in_parts=True)
                        yield replace(config, pipelined=True, num_stages=waves_stages, smem_bytes=smem_bytes(
                            block_m, block_n, waves_stages, out_dtype_bytes, operands, d_in_parts=True))
                    # NOTE: after the workspace split of the same tiles (a tie keeps it).
                    if (k is not None and 1 < num_splits <= MAX_CLUSTER_SPLITS and operands == "fp8_block_scaled" and
                            _ceil_div(m, block_m) * _ceil_div(n, block_n) * num_splits <= num_sms):
                        yield replace(config, splits_in_cluster=True)
                    # NOTE: after its lockstep twin, so that a tie keeps the lockstep schedule.
                    # NOTE: never with per-channel B scales: on the H200 (2026-12-02, the eight weight-gradient shapes
                    # and two k-grouped ones, timed in turns) it ran 1.3-2.9% slower than lockstep on the same tiles.
                    if block_m in PING_PONG_MATH_FACTOR and not grouped and operands == "fp8_block_scaled":
                        yield replace(config, pipelined=False, ping_pong=True, overlap_epilogue=False)
                    if (block_m in OWN_TILE_MATH_SECONDS_PER_K_BLOCK and
                            can_own_tiles(block_m, block_n, num_splits, grouped, operands)):
                        own_stages = max_stages(block_m, block_n, out_dtype_bytes, smem_capacity, operands, True)
                        if own_stages >= MIN_STAGES:
                            yield replace(config, num_stages=own_stages, smem_bytes=smem_bytes(
                                block_m, block_n, own_stages, out_dtype_bytes, operands, True),
                                pipelined=can_pipeline_own_tile(block_m, block_n), overlap_epilogue=False,
                                own_tiles=True)


def takes_evict_first_b(config: Fp8GemmConfig, m: int, n: int, k: int, num_sms: int,
                        out_dtype_bytes: int = 2) -> bool:
    """Whether a dense block-scaled config loads B evict-first (EVICT_FIRST_MAX_M, EVICT_FIRST_MAX_M_BLOCKS,
    EVICT_FIRST_MIN_B_OVER_D): unicast at decode sizes, B's bytes at least EVICT_FIRST_MIN_B_OVER_D times D's (FP32 D is
    accumulated: read and written), and one M block, or a few with every tile (job) in one wave, so that the M blocks
    sharing a B line read it at about the same time."""
    m_blocks = _ceil_div(m, config.block_m)
    d_bytes = m * (2 * out_dtype_bytes if out_dtype_bytes == 4 else out_dtype_bytes)
    return config.num_tma_multicast == 1 and m <= EVICT_FIRST_MAX_M and k >= EVICT_FIRST_MIN_B_OVER_D * d_bytes and (
        m_blocks == 1 or (m_blocks <= EVICT_FIRST_MAX_M_BLOCKS and num_work_units(config, m, n, num_sms) <= num_sms))


def dense_stages_64_rows(stages: int, k: int, num_splits: int) -> int:
    """Stages of a dense block-scaled 64-row tile at least 64 columns wide where M is one tile: at most
    MAX_DENSE_STAGES_64_ROWS, and no more than a job's K blocks (at least MIN_STAGES), of the `stages` that fit; a job
    of at least LONG_JOB_K_BLOCKS K blocks takes them all."""
    job_k_blocks = _ceil_div(_ceil_div(k, BLOCK_K), num_splits)
    if num_splits == 1 and job_k_blocks >= LONG_JOB_K_BLOCKS:
        return stages
    return min(stages, MAX_DENSE_STAGES_64_ROWS, max(MIN_STAGES, job_k_blocks))


def is_long_job_64_rows(config: Fp8GemmConfig, m: int, n: int, k: int, num_sms: int) -> bool:
    """Whether a dense block-scaled config is an unsplit pipelined 64-row tile that M = 64 fills, at least 64 columns
    wide, whose tiles fit one wave and run at least LONG_JOB_K_BLOCKS K blocks each (LONG_JOB_FACTOR)."""
    return (config.block_m == 64 and m == 64 and config.block_n >= 64 and config.pipelined and
            config.num_splits == 1 and config.num_tma_multicast == 1 and num_tiles(config, m, n) <= num_sms and
            _ceil_div(k, BLOCK_K) >= LONG_JOB_K_BLOCKS)


def with_stages(config: Fp8GemmConfig, num_stages: int, out_dtype_bytes: int,
                operands: str = "fp8_block_scaled") -> Fp8GemmConfig:
    """`config` with num_stages stages (and its shared memory)."""
    return replace(config, num_stages=num_stages,
                   smem_bytes=smem_bytes(config.block_m, config.block_n, num_stages, out_dtype_bytes, operands))


def check_problem(n: int, k: int, num_sms: int) -> None:
    """What every config choice needs: k and n positive multiples of 16, some SMs."""
    if k % 16 != 0 or k <= 0:
        raise ValueError(f"k must be a positive multiple of 16, got {k}")
    if n % 16 != 0 or n <= 0:
        raise ValueError(f"n must be a positive multiple of 16, got {n}")
    if num_sms <= 0:
        raise ValueError(f"num_sms must be positive, got {num_sms}")


def ranked_configs(m: int, n: int, k: int, num_sms: int, smem_capacity: int = SMEM_CAPACITY_BYTES,
                   out_dtype_bytes: int = 2, with_accumulation: bool = False, num_groups: int = 1,
                   allow_split_k: bool = False, block_ms: tuple = BLOCK_MS, operands: str = "fp8_block_scaled") -> list:
    """Every candidate with its modelled time, fastest first (ties keep the enumeration order): the model's
    pick first, then what measured tuning times next. Arguments as for get_fp8_gemm_config; block_ms limits the
    tile heights (block_ms=(64, 128): the picks before 256-row tiles, which the benchmark times alongside)."""
    check_problem(n, k, num_sms)
    m = max(m, 1)
    split_k = k if allow_split_k and num_groups == 1 else None
    def modelled_seconds(config) -> float:
        seconds = estimate_seconds(config, m, n, k, num_sms, out_dtype_bytes, with_accumulation, num_groups, operands)
        # NOTE: split_k marks the dense kind (the decode rules' scope).
        if split_k is not None and operands == "fp8_block_scaled" and is_long_job_64_rows(config, m, n, k, num_sms):
            seconds *= LONG_JOB_FACTOR
        return seconds

    timed = [(modelled_seconds(config), config)
             for config in candidate_configs(m, n, num_sms, smem_capacity, out_dtype_bytes, split_k,
                                             block_ms=block_ms, operands=operands)]
    if not timed:
        raise ValueError(f"no FP8 GEMM config fits {smem_capacity} bytes of shared memory")
    if operands == "fp8_block_scaled" and num_groups == 1 and _ceil_div(k, BLOCK_K) <= DENSE_TWO_WAVE_UNICAST_MAX_K_BLOCKS:
        timed = _rate_two_wave_unicast(timed)
    timed.sort(key=lambda pair: pair[0])
    return timed


def _rate_two_wave_unicast(timed: list) -> list:
    """(seconds, config) pairs with each 256-row unicast config with the epilogue overlap at most
    DENSE_TWO_WAVE_UNICAST_OVER_MULTICAST times its fastest multicast twin (the same config in a 2-CTA cluster): the
    dense kind's measured rate (the caller applies it up to DENSE_TWO_WAVE_UNICAST_MAX_K_BLOCKS K blocks)."""
    twin_key = lambda config: replace(config, num_tma_multicast=1, multicast_on_a=False)
    fastest_twin = {}
    for seconds, config in timed:
        if config.block_m == 256 and config.num_tma_multicast == 2:
            key = twin_key(config)
            fastest_twin[key] = min(fastest_twin.get(key, seconds), seconds)
    return [(min(seconds, fastest_twin[config] * DENSE_TWO_WAVE_UNICAST_OVER_MULTICAST)
             if config.block_m == 256 and config.num_tma_multicast == 1 and config.overlap_epilogue and
             config in fastest_twin else seconds, config)
            for seconds, config in timed]


def get_fp8_gemm_config(m: int, n: int, k: int, num_sms: int, smem_capacity: int = SMEM_CAPACITY_BYTES,
                        out_dtype_bytes: int = 2, with_accumulation: bool = False,
                        num_groups: int = 1, allow_split_k: bool = False,
                        operands: str = "fp8_block_scaled") -> Fp8GemmConfig:
    """The config with the lowest modelled time for D[m, n] = A[m, k] * B[n, k]^T.

    Args:
        m: rows of A (per group for masked grouped GEMMs, total rows for contiguous ones); 0 is allowed.
        n, k: columns of D and the reduction depth (both multiples of 16).
        num_sms: SMs the persistent grid may use.
        smem_capacity: dynamic shared memory per block, bytes.
        out_dtype_bytes: 2 for bf16 D, 4 for FP32 D.
        with_accumulation: D += A * B^T (D is read and written).
        num_groups: groups of a masked grouped GEMM (1 otherwise).
        allow_split_k: also consider split-K configs (the Normal kind only; grouped kinds leave it off).
        operands: the operands' formats (GEMM_OPERANDS): "fp8_channel_scaled" for 1 x 128 scales on B too.

    Returns:
        A frozen Fp8GemmConfig; equal inputs give equal configs.
    """
    return ranked_configs(m, n, k, num_sms, smem_capacity, out_dtype_bytes, with_accumulation, num_groups,
                          allow_split_k, operands=operands)[0][1]


def config_label(config: Fp8GemmConfig) -> str:
    """BLOCK_MxBLOCK_N/splits, then p (pipelined K loop), o (epilogue overlap), t (ping-pong: the math warpgroups
    take turns issuing), w (own-tile ping-pong: each math warpgroup owns BLOCK_M x BLOCK_N tiles), c (splits in a
    cluster), e (evict-first B), s (thread-major sfb), +a / +b (multicast of A / B): 128x192/1o, 64x64/4p, 64x64/2pc, 256x128/1+a, 256x128/1t+a, 64x128/1pw+b."""
    flags = (("p" if config.pipelined else "") + ("o" if config.overlap_epilogue else "") +
             ("t" if config.ping_pong else "") + ("w" if config.own_tiles else "") +
             ("c" if config.splits_in_cluster else "") + ("e" if config.evict_first_b else "") +
             ("s" if config.thread_major_sfb else ""))
    multicast = ("+a" if config.multicast_on_a else "+b") if config.num_tma_multicast > 1 else ""
    return f"{config.block_m}x{config.block_n}/{config.num_splits}{flags}{multicast}"


def config_fields(config: Fp8GemmConfig) -> dict:
    """The fields that make a config again with make_config (what measured tuning stores)."""
    return {"block_m": config.block_m, "block_n": config.block_n, "num_tma_multicast": config.num_tma_multicast,
            "multicast_on_a": config.multicast_on_a, "num_stages": config.num_stages,
            "num_splits": config.num_splits, "pipelined": config.pipelined,
            "overlap_epilogue": config.overlap_epilogue, "ping_pong": config.ping_pong, "own_tiles": config.own_tiles,
            "splits_in_cluster": config.splits_in_cluster, "evict_first_b": config.evict_first_b,
            "thread_major_sfb": config.thread_major_sfb}


def _output_type(out_dtype) -> tuple:
    name = str(out_dtype).removeprefix("torch.")
    name = {"bf16": "bfloat16", "float": "float32", "fp32": "float32"}.get(name, name)
    if name not in OUTPUT_TYPES:
        raise ValueError(f"out_dtype must be bfloat16 or float32, got {out_dtype!r}")
    return OUTPUT_TYPES[name]


def template_args(config: Fp8GemmConfig, n: int, k: int, out_dtype, with_accumulation: bool,
                  gemm_type: str = "normal", operands: str = "fp8_block_scaled", mn_major_a: bool = False,
                  mn_major_b: bool = False) -> list:
    """The kernel's C++ template arguments, in declaration order.

    out_dtype is "bfloat16" / "float32" (or a torch dtype); gemm_type one of GEMM_TYPES; operands one of
    GEMM_OPERANDS; mn_major_a / mn_major_b: the operand is M- / N-contiguous (BF16 operands, Normal kind only).
    """
    cpp_type, _ = _output_type(out_dtype)
    if with_accumulation and cpp_type != "float":
        raise ValueError("accumulation needs a float32 D")
    if gemm_type not in GEMM_TYPES:
        raise ValueError(f"gemm_type must be one of {sorted(GEMM_TYPES)}, got {gemm_type!r}")
    if operands not in GEMM_OPERANDS:
        raise ValueError(f"operands must be one of {sorted(GEMM_OPERANDS)}, got {operands!r}")
    return [
        str(n),
        str(k),
        str(config.block_m),
        str(config.block_n),
        str(config.block_k),
        str(config.num_stages),
        str(config.num_tma_threads),
        str(config.num_math_threads),
        str(config.num_tma_multicast),
        "true" if config.multicast_on_a else "false",
        GEMM_TYPES[gemm_type],
        cpp_type,
        "true" if with_accumulation else "false",
        str(config.num_splits),
        "true" if config.pipelined else "false",
        "true" if config.overlap_epilogue else "false",
        GEMM_OPERANDS[operands],
        "true" if mn_major_a else "false",
        "true" if mn_major_b else "false",
        math_schedule(config),
        "true" if config.splits_in_cluster else "false",
        "true" if config.evict_first_b else "false",
        "true" if config.thread_major_sfb else "false",
    ]


REPRESENTATIVE_MS = (1, 64, 128, 4096, 8192)
REPRESENTATIVE_NKS = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (576, 7168))
# (out_dtype, with_accumulation) pairs the API exposes.
REPRESENTATIVE_OUTPUTS = (("bfloat16", False), ("float32", True))


@dataclass(frozen=True)
class CandidateKernel:
    config: Fp8GemmConfig
    n: int
    k: int
    out_dtype: str
    with_accumulation: bool
    gemm_type: str = "normal"
    operands: str = "fp8_block_scaled"

    def template_args(self) -> list:
        return template_args(self.config, self.n, self.k, self.out_dtype, self.with_accumulation, self.gemm_type,
                             self.operands)


def all_candidate_configs(num_sms: int = 132, smem_capacity: int = SMEM_CAPACITY_BYTES) -> list:
    """Every distinct kernel the heuristics pick over the representative shapes (for compile tests)."""
    kernels = {}
    for out_dtype, with_accumulation in REPRESENTATIVE_OUTPUTS:
        _, out_bytes = _output_type(out_dtype)
        for n, k in REPRESENTATIVE_NKS:
            for m in REPRESENTATIVE_MS:
                config = get_fp8_gemm_config(m, n, k, num_sms, smem_capacity, out_bytes, with_accumulation,
                                             allow_split_k=True)
                kernel = CandidateKernel(config, n, k, out_dtype, with_accumulation)
                kernels.setdefault(tuple(kernel.template_args()), kernel)
    return list(kernels.values())


# (M, N) = out x in of the weight-gradient GEMMs (recipe (1, 1, 128)) and their token counts K.
REPRESENTATIVE_WGRAD_MNS = ((2112, 7168), (24576, 1536), (7168, 2048), (4096, 7168))
REPRESENTATIVE_WGRAD_KS = (4096, 16384)


def wgrad_candidate_kernels(num_sms: int = 132, smem_capacity: int = SMEM_CAPACITY_BYTES) -> list:
    """Every distinct weight-gradient kernel (per-channel B scales) the heuristics pick over the representative
    shapes, accumulating into FP32 D (the gradient buffer) or not (bf16 D)."""
    kernels = {}
    for out_dtype, with_accumulation in REPRESENTATIVE_OUTPUTS:
        _, out_bytes = _output_type(out_dtype)
        for m, n in REPRESENTATIVE_WGRAD_MNS:
            for k in REPRESENTATIVE_WGRAD_KS:
                config = get_fp8_gemm_config(m, n, k, num_sms, smem_capacity, out_bytes, with_accumulation,
                                             allow_split_k=True, operands="fp8_channel_scaled")
                kernel = CandidateKernel(config, n, k, out_dtype, with_accumulation, operands="fp8_channel_scaled")
                kernels.setdefault(tuple(kernel.template_args()), kernel)
    return list(kernels.values())


def make_config(block_m: int, block_n: int, num_tma_multicast: int, multicast_on_a: bool,
                out_dtype_bytes: int, num_stages: int = None, num_splits: int = 1,
                pipelined: bool = None, overlap_epilogue: bool = False,
                operands: str = "fp8_block_scaled", ping_pong: bool = False, own_tiles: bool = False,
                splits_in_cluster: bool = False, evict_first_b: bool = False,
                thread_major_sfb: bool = False) -> Fp8GemmConfig:
    """A config of the given tiling with as many stages as fit (or num_stages), pipelined where the tile
    allows (and the schedule is not ping-pong) unless pipelined says otherwise, for overrides and tests (operands:
    what a stage holds; own_tiles: the own-tile ping-pong, block_m rows per math warpgroup)."""
    if own_tiles:
        return _make_own_tile_config(block_m, block_n, num_tma_multicast, multicast_on_a, out_dtype_bytes, num_stages,
                                     num_splits, pipelined, overlap_epilogue, operands, ping_pong)
    if block_m not in BLOCK_MS or block_n not in BLOCK_NS or not is_legal_tile(block_m, block_n):
        raise ValueError(f"no kernel for {block_m}x{block_n} tiles: block_m in {BLOCK_MS}, block_n in {BLOCK_NS} "
                         f"(at most {MAX_TWO_WAVE_BLOCK_N} with 256 rows)")
    if num_splits != 1 and (num_tma_multicast != 1 or block_m == 256):
        raise ValueError("split-K needs num_tma_multicast == 1 and block_m <= 128")
    if overlap_epilogue and not has_epilogue_overlap(block_m, block_n, num_splits, operands=operands):
        raise ValueError("the epilogue overlap needs num_splits == 1 and block_m 128 (or 256 with block-scaled "
                         "operands)")
    # (num_tma_multicast == 1 and block_m <= 128: split-K's check above.)
    if splits_in_cluster and not (2 <= num_splits <= 8 and operands == "fp8_block_scaled"):
        raise ValueError("splits in a cluster need 2..8 splits and block-scaled operands")
    if evict_first_b and not ((num_tma_multicast == 1 or not multicast_on_a) and operands == "fp8_block_scaled"):
        raise ValueError("evict-first B needs no multicast (or multicast on B) and block-scaled operands")
    if thread_major_sfb and operands not in CHANNEL_SCALED_OPERANDS:
        raise ValueError("thread-major sfb needs per-channel B scales")
    if ping_pong and (pipelined or not can_ping_pong(block_m, False) or
                      operands not in ("fp8_block_scaled",) + CHANNEL_SCALED_OPERANDS):
        raise ValueError("the ping-pong schedule needs block_m 128 or 256, the plain K loop (pipelined=False) and "
                         "block-scaled or per-channel-scaled operands")
    if operands in CHANNEL_SCALED_OPERANDS and not has_streamed_store_registers(block_m, num_tma_multicast,
                                                                              out_dtype_bytes, operands):
        raise ValueError("256-row tiles with per-channel B scales and FP32 D need num_tma_multicast == 2")
    if pipelined is None:
        pipelined = can_pipeline(block_m, block_n) and not ping_pong
    elif pipelined and not (can_pipeline(block_m, block_n) or
                            can_pipeline_halves(block_m, block_n, operands, num_splits) or
                            can_pipeline_waves(block_m, block_n, operands, num_splits, ping_pong)):
        raise ValueError(f"a {block_m}x{block_n} tile cannot be pipelined (block_m 64 or 128, block_n at most "
                         f"{MAX_PIPELINED_BLOCK_N[128]}; per-channel B scales: or a multiple of 32 without split-K; "
                         f"block_m 256: block-scaled, block_n at most {MAX_PIPELINED_TWO_WAVE_BLOCK_N})")
    # NOTE: D staged in parts only where asked for more stages than fit beside the whole tile's staging (or pipelined).
    d_in_parts = may_stage_d_in_parts(block_m, operands, ping_pong)
    stages = num_stages or max_stages(block_m, block_n, out_dtype_bytes, operands=operands,
                                      d_in_parts=d_in_parts and pipelined)
    return Fp8GemmConfig(block_m=block_m, block_n=block_n, num_stages=stages, num_tma_multicast=num_tma_multicast,
                         multicast_on_a=multicast_on_a, swizzle_d_bytes=swizzle_d_bytes(block_n, out_dtype_bytes),
                         smem_bytes=smem_bytes(block_m, block_n, stages, out_dtype_bytes, operands,
                                               d_in_parts=d_in_parts), num_splits=num_splits,
                         pipelined=pipelined, overlap_epilogue=overlap_epilogue, ping_pong=ping_pong,
                         splits_in_cluster=splits_in_cluster, evict_first_b=evict_first_b,
                         thread_major_sfb=thread_major_sfb)


def _make_own_tile_config(block_m: int, block_n: int, num_tma_multicast: int, multicast_on_a: bool,
                          out_dtype_bytes: int, num_stages: int, num_splits: int, pipelined: bool,
                          overlap_epilogue: bool, operands: str, ping_pong: bool) -> Fp8GemmConfig:
    """make_config for the own-tile ping-pong (pipelined wherever the tile allows unless pipelined says otherwise)."""
    if block_n not in BLOCK_NS or not can_own_tiles(block_m, block_n, num_splits, operands=operands):
        raise ValueError(f"the own-tile ping-pong needs block_m in {OWN_TILE_BLOCK_MS} (128 rows: block_n at most "
                         f"{MAX_TWO_WAVE_BLOCK_N}), block-scaled operands and no split-K; got {block_m}x{block_n}, "
                         f"{num_splits} splits, {operands}")
    if overlap_epilogue or ping_pong:
        raise ValueError("the own-tile ping-pong takes neither the epilogue overlap nor the shared-tile ping-pong")
    if pipelined is None:
        pipelined = can_pipeline_own_tile(block_m, block_n)
    elif pipelined and not can_pipeline_own_tile(block_m, block_n):
        raise ValueError(f"an own {block_m}x{block_n} tile cannot be pipelined (block_n at most "
                         f"{MAX_OWN_TILE_PIPELINED_BLOCK_N} by block_m)")
    stages = num_stages or max_stages(block_m, block_n, out_dtype_bytes, operands=operands, own_tiles=True)
    return Fp8GemmConfig(block_m=block_m, block_n=block_n, num_stages=stages, num_tma_multicast=num_tma_multicast,
                         multicast_on_a=multicast_on_a, swizzle_d_bytes=swizzle_d_bytes(block_n, out_dtype_bytes),
                         smem_bytes=smem_bytes(block_m, block_n, stages, out_dtype_bytes, operands, True),
                         pipelined=pipelined, own_tiles=True)


def compile_coverage_kernels(num_sms: int = 132) -> list:
    """all_candidate_configs() plus kernels for the code paths those picks leave out on the H200: multicast
    on A and on B, the grouped kinds, each D swizzle width, the widest tile, split-K at the widest tile (one
    partial slot in flight) and with splits not dividing K, the plain K loop of a pipelinable tile and the
    widest pipelined tile of one math warpgroup, the epilogue overlap's K loops and stores, per-channel B scales
    (dense and k-grouped; their pipelined halves), the ping-pong schedules (shared tiles, block-scaled and
    per-channel-scaled; own tiles) and split-K with the splits in a cluster."""
    kernels = {tuple(c.template_args()): c for c in all_candidate_configs(num_sms)}
    extras = [
        CandidateKernel(make_config(128, 128, 2, True, 2), 7168, 2048, "bfloat16", False),
        CandidateKernel(make_config(128, 112, 2, False, 2), 2112, 7168, "bfloat16", False),
        CandidateKernel(make_config(64, 48, 2, True, 4), 576, 7168, "float32", True),
        CandidateKernel(make_config(128, 192, 1, False, 4), 4096, 7168, "float32", False),
        CandidateKernel(make_config(128, 144, 2, False, 2), 4096, 7168, "bfloat16", False, "m_grouped_contiguous"),
        CandidateKernel(make_config(64, 96, 2, True, 2), 4096, 7168, "bfloat16", False, "m_grouped_contiguous"),
        CandidateKernel(make_config(128, 160, 2, False, 2), 7168, 2048, "bfloat16", False, "m_grouped_masked"),
        CandidateKernel(make_config(128, 96, 1, False, 4), 7168, 2048, "float32", True, "m_grouped_masked"),
        CandidateKernel(make_config(128, 192, 1, False, 4, num_splits=2), 4096, 7168, "float32", True),
        CandidateKernel(make_config(64, 192, 1, False, 2, num_splits=5), 24576, 1536, "bfloat16", False),
        CandidateKernel(make_config(128, 128, 1, False, 2, pipelined=False), 4096, 7168, "bfloat16", False),
        CandidateKernel(make_config(64, 128, 1, False, 4, num_splits=3), 7168, 2048, "float32", True),
        # The epilogue overlap: plain and pipelined K loops, accumulation, multicast.
        CandidateKernel(make_config(128, 192, 1, False, 2, overlap_epilogue=True), 4096, 7168, "bfloat16", False),
        CandidateKernel(make_config(128, 128, 1, False, 2, overlap_epilogue=True), 32768, 512, "bfloat16", False),
        CandidateKernel(make_config(128, 160, 1, False, 4, overlap_epilogue=True), 7168, 16384, "float32", True),
        CandidateKernel(make_config(128, 192, 2, False, 2, overlap_epilogue=True), 7168, 2048, "bfloat16", False),
        # The epilogue overlap of 256-row tiles; the M-grouped kinds' 256-row tiles (row-predicated stores of two waves),
        # with and without the overlap.
        CandidateKernel(make_config(256, 128, 2, True, 2, overlap_epilogue=True), 4096, 7168, "bfloat16", False),
        CandidateKernel(make_config(256, 128, 2, True, 2, overlap_epilogue=True), 4096, 7168, "bfloat16", False,
                        "m_grouped_contiguous"),
        CandidateKernel(make_config(256, 112, 1, False, 2), 7168, 2048, "bfloat16", False, "m_grouped_masked"),
        # Pipelined 256-row tiles: 96 columns (four sfb offsets) with the overlap and multicast, 80 with accumulation.
        CandidateKernel(make_config(256, 96, 2, True, 2, pipelined=True, overlap_epilogue=True), 4096, 7168, "bfloat16",
                        False),
        CandidateKernel(make_config(256, 80, 1, False, 4, pipelined=True), 7168, 2048, "float32", True),
        # The ping-pong schedule: with the epilogue overlap, two waves with multicast, split-K with accumulation.
        CandidateKernel(make_config(128, 160, 1, False, 2, overlap_epilogue=True, ping_pong=True), 7168, 2048,
                        "bfloat16", False),
        CandidateKernel(make_config(256, 128, 2, True, 2, ping_pong=True), 4096, 7168, "bfloat16", False),
        CandidateKernel(make_config(128, 112, 1, False, 4, num_splits=2, ping_pong=True), 576, 640, "float32", True),
        # Splits in a cluster: one math warpgroup, and two with FP32 D accumulated.
        CandidateKernel(make_config(64, 64, 1, False, 2, num_splits=2, splits_in_cluster=True), 4096, 7168, "bfloat16",
                        False),
        CandidateKernel(make_config(128, 64, 1, False, 4, num_splits=4, splits_in_cluster=True), 2112, 7168, "float32",
                        True),
        # The own-tile ping-pong: the pipelined one-wave loop with multicast, the plain loop with accumulation, two
        # waves with multicast.
        CandidateKernel(make_config(64, 128, 2, False, 2, own_tiles=True), 7168, 2048, "bfloat16", False),
        CandidateKernel(make_config(64, 192, 1, False, 4, own_tiles=True), 2112, 7168, "float32", True),
        CandidateKernel(make_config(128, 128, 2, True, 2, own_tiles=True), 4096, 7168, "bfloat16", False),
        # Per-channel B scales (the weight gradient's): pipelined with the overlap, two waves with multicast, the
        # widest tile's plain K loop; the k-grouped kind (K from the device: SHAPE_K 0), pipelined and two waves.
        CandidateKernel(make_config(128, 128, 1, False, 4, overlap_epilogue=True, operands="fp8_channel_scaled"),
                        7168, 4096, "float32", True, operands="fp8_channel_scaled"),
        CandidateKernel(make_config(256, 128, 2, True, 4, operands="fp8_channel_scaled"), 7168, 4096, "float32",
                        True, operands="fp8_channel_scaled"),
        CandidateKernel(make_config(128, 192, 1, False, 2, overlap_epilogue=True, operands="fp8_channel_scaled"),
                        2048, 4096, "bfloat16", False, operands="fp8_channel_scaled"),
        CandidateKernel(make_config(128, 128, 1, False, 4, pipelined=False, overlap_epilogue=True,
                                    operands="fp8_channel_scaled"), 2048, 0, "float32", True, "k_grouped",
                        "fp8_channel_scaled"),
        CandidateKernel(make_config(128, 128, 1, False, 4, overlap_epilogue=True, operands="fp8_channel_scaled"),
                        2048, 0, "float32", True, "k_grouped", "fp8_channel_scaled"),
        CandidateKernel(make_config(256, 128, 2, False, 4, operands="fp8_channel_scaled"), 7168, 0, "float32", False,
                        "k_grouped", "fp8_channel_scaled"),
        # The pipelined halves (per-channel B scales, dense) with the epilogue overlap, and without it.
        CandidateKernel(make_config(128, 192, 1, False, 4, pipelined=True, overlap_epilogue=True,
                                    operands="fp8_channel_scaled"), 7168, 16384, "float32", True,
                        operands="fp8_channel_scaled"),
        CandidateKernel(make_config(128, 160, 1, False, 2, pipelined=True, operands="fp8_channel_scaled"), 2048, 4096,
                        "bfloat16", False, operands="fp8_channel_scaled"),
        CandidateKernel(make_config(128, 160, 1, False, 4, pipelined=True, operands="fp8_channel_scaled"), 7168, 0,
                        "float32", True, "k_grouped", "fp8_channel_scaled"),
        # The k-grouped kind's epilogue overlap at widths other than multiples of 64: the halves with B multicast.
        CandidateKernel(make_config(128, 160, 2, False, 4, pipelined=True, overlap_epilogue=True,
                                    operands="fp8_channel_scaled"), 7168, 0, "float32", True, "k_grouped",
                        "fp8_channel_scaled"),
        # The ping-pong schedule with per-channel B scales: dense with the epilogue overlap, k-grouped with two waves.
        CandidateKernel(make_config(128, 192, 1, False, 4, overlap_epilogue=True, operands="fp8_channel_scaled",
                                    ping_pong=True), 7168, 16384, "float32", True, operands="fp8_channel_scaled"),
        CandidateKernel(make_config(256, 128, 2, False, 4, operands="fp8_channel_scaled", ping_pong=True), 7168, 0,
                        "float32", True, "k_grouped", "fp8_channel_scaled"),
    ]
    for kernel in extras:
        kernels.setdefault(tuple(kernel.template_args()), kernel)
    return list(kernels.values())
