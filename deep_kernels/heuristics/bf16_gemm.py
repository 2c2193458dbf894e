"""Config choice for the BF16 GEMMs: the SM90 GEMM engine's Bf16 operands kind (csrc/gemm/sm90_bf16_mainloop.cuh).

Pure functions of the problem and the device: no GPU calls, no torch. The model is the FP8 GEMM's
(deep_kernels.heuristics.fp8_gemm: waves of work units, a K block bound by the larger of math and loads, DRAM,
multicast, split-K), with what the BF16 kind changes:

* A K block is 64 bf16 columns deep: the same 128 bytes a row as an FP8 block of 128 columns, and, at half the
  FP8 tensor rate, the same tensor time. So a BF16 K block costs what an FP8 block of equal tile costs, less
  the promotion: the accumulators are the result, and one wgmma group stays in flight across K blocks, so only
  BF16_CONSTANT_SHARE of the FP8 block's constant term (the group's wait and the barrier waits) remains.
* A stage holds no sfa; operands move 2 bytes an element from DRAM.
* Tiles may be as wide as one wgmma (256 columns) with one 64-row wave per warpgroup: no partial accumulator
  sets take registers. 256-row tiles (two waves) stay at most 128 wide, Normal kind only.
* No pipelined flag (the K loop always keeps a group in flight) and no epilogue overlap.
* Split-K may run a tile's two splits as one cluster (the FP8 kind's splits in a cluster: the leader adds the other's
  partial sums from its shared memory, CLUSTER_SPLIT_SECONDS in place of the workspace round trip), where one M block
  holds every row, a tile has at least MIN_CLUSTER_SPLIT_K_BLOCKS K blocks and the tiles x 2 jobs fit the SMs (dense
  only; CLUSTER_SPLIT_FACTOR: measured).
* Dense 64-row tiles where M is one such tile take at most MAX_DENSE_STAGES_64_ROWS stages (measured).
* An N-major B (bf16_gemm_nn / tn) is loaded as 64-column boxes: BLOCK_N a multiple of 64.
* Masked kind at 1-4 experts: where a tile was measured faster than the model's pick (MEASURED_MASKED_TILES), that
  tile; the model's terms miss the last wave's fill of the drawn rows there.

Candidates are enumerated in a fixed order (larger tiles first) and ties keep the first, so the choice is
deterministic.
"""

from dataclasses import dataclass, replace

from deep_kernels.heuristics import fp8_gemm
from deep_kernels.heuristics.fp8_gemm import CandidateKernel, Fp8GemmConfig
from deep_kernels.heuristics.grouped_fp8_gemm import check_grouped_problem, modelled_rows

BLOCK_K = 64
OPERAND_BYTES = 2
BLOCK_MS = (64, 128, 256)
BLOCK_NS = tuple(range(16, 257, 16))
MAX_TWO_WAVE_BLOCK_N = 128
MIN_STAGES = fp8_gemm.MIN_STAGES
# Share of the FP8 K block's constant term (fp8_gemm.MATH_SECONDS_PER_K_BLOCK) that a BF16 K block pays: no
# promotion, and the next block's group is issued before the previous one is waited for (as the FP8 pipelined
# K loop of one math warpgroup, fp8_gemm.PIPELINED_CONSTANT_SHARE[64]).
BF16_CONSTANT_SHARE = 0.4
OPERANDS = "bf16"
DRAM_BYTES_PER_S = fp8_gemm.DRAM_BYTES_PER_S
SPLIT_SECONDS = fp8_gemm.SPLIT_SECONDS
CLUSTER_SPLIT_SECONDS = fp8_gemm.CLUSTER_SPLIT_SECONDS
OVERLAP_LOSS = fp8_gemm.OVERLAP_LOSS
# Two splits in a cluster are offered where one M block holds every row and a tile has at least
# MIN_CLUSTER_SPLIT_K_BLOCKS K blocks, their estimate scaled by CLUSTER_SPLIT_FACTOR. Fitted on the H200 (2026-12-02,
# 32ecc4f, timed in turns with the previous picks): they ran 1.05-1.10x faster at 64x2112x7168 (64x32 tiles),
# 64x4096x7168 (64x64), 128x4096x7168 (128x64) and 64x7168x16384 (64x112), 1.00x at 128x7168x16384 (128x112), but
# 0.81-0.88x at K = 2048 (64x7168x2048, 128x7168x2048: 32 K blocks) and 0.93x over two 64-row M blocks (128x2112x7168).
MIN_CLUSTER_SPLIT_K_BLOCKS = 64
CLUSTER_SPLIT_FACTOR = 0.88
# Dense 64-row tiles at least 64 columns wide where M is one such tile take at most this many stages (the FP8 kind's
# rule, fp8_gemm.MAX_DENSE_STAGES_64_ROWS): on the H200 (same run) 8 stages ran 1.04x faster than 13 at 64x2112x7168
# (64x64, 4 splits) and 64x7168x2048 (64x64).
MAX_DENSE_STAGES_64_ROWS = 8
# Masked kind: the rows per group the model averages over, as shares of expected_m. masked_m varies around the hint,
# and a tile whose wave count steps up just past expected_m ran up to 1.18x slower than the next-best one (H200,
# bf16_gemm suite's masked shapes, 2026-12-02).
MASKED_ROW_SHARES = (0.9, 1.0, 1.1)
# Masked kind, few experts: tiles measured faster than the model's picks, by (N, K, experts) -> (expected_m the
# measurement drew masked_m around, (BLOCK_M, BLOCK_N)); taken with every stage that fits where the hint lies in
# [expected_m, MEASURED_MASKED_HINT_SHARE x expected_m] (the suite passes int(1.2 x expected_m)) on MEASURED_NUM_SMS
# SMs. On the H200 (2026-12-02, masked_m of each expert expected_m x U(0.7, 1.3), L2 flushed before each run, timed in
# turns with the model's pick; two runs over three and five draws) they ran, against its 128x176 / 128x192 / 128x192 /
# 128x224:
#   4096 x 7168, 1 expert of 1024: 128x160 1.083-1.107x;  4 experts of 256: 128x160 1.130-1.150x;
#   7168 x 2048, 2 experts of 512: 128x128 1.093-1.138x (0.918x on a draw of ten 128-row blocks, 4.2 waves);
#                4 experts of 256: 128x112 1.070-1.258x.
# (At 4096 x 7168 with 2 experts of 512, 128x144 ran 1.06-1.08x on draws of nine blocks but 0.76x on one of ten.) The
# model's terms (fitted to dense tiles) miss these by the last wave's fill of the drawn rows and the short pipelines
# (3 stages) of the widest tiles at K = 2048.
MEASURED_MASKED_TILES = {
    (4096, 7168, 1): (1024, (128, 160)),
    (4096, 7168, 4): (256, (128, 160)),
    (7168, 2048, 2): (512, (128, 128)),
    (7168, 2048, 4): (256, (128, 112)),
}
MEASURED_MASKED_HINT_SHARE = 1.25
MEASURED_NUM_SMS = 132


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def smem_bytes(block_m: int, block_n: int, num_stages: int, out_dtype_bytes: int,
               streamed_store: bool = False) -> int:
    """Dynamic shared memory of the kernel's carve-up for bf16 stages: D staging, then per stage A and B (128
    bytes a row), then the barriers. D staging: the whole tile, or with streamed_store (the k-grouped kind's FP32 D)
    two chunks of 64 rows per math warpgroup."""
    if streamed_store:
        d_bytes = _ceil_div(fp8_gemm.num_math_warpgroups(block_m) * 2 * 64 *
                            fp8_gemm.swizzle_d_bytes(block_n, out_dtype_bytes), 1024) * 1024
    else:
        d_bytes = _ceil_div(block_m * block_n * out_dtype_bytes, 1024) * 1024
    stage_bytes = (block_m + block_n) * BLOCK_K * OPERAND_BYTES
    return d_bytes + num_stages * stage_bytes + 2 * num_stages * 8


def max_stages(block_m: int, block_n: int, out_dtype_bytes: int,
               smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES, streamed_store: bool = False) -> int:
    fixed = smem_bytes(block_m, block_n, 0, out_dtype_bytes, streamed_store)
    per_stage = smem_bytes(block_m, block_n, 1, out_dtype_bytes, streamed_store) - fixed
    return min(fp8_gemm.MAX_STAGES, (smem_capacity - fixed) // per_stage)


def is_legal_tile(block_m: int, block_n: int, grouped: bool = False, mn_major_b: bool = False) -> bool:
    """Whether the kernel takes the tiling: 256-row tiles only for the Normal kind, at most 128 columns; with an
    N-major B, whole 64-column boxes."""
    if block_m not in BLOCK_MS or block_n not in BLOCK_NS or (mn_major_b and block_n % 64):
        return False
    return block_m != 256 or (not grouped and block_n <= MAX_TWO_WAVE_BLOCK_N)


def make_config(block_m: int, block_n: int, num_tma_multicast: int = 1, multicast_on_a: bool = False,
                out_dtype_bytes: int = 2, num_stages: int = None, num_splits: int = 1,
                smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES, streamed_store: bool = False,
                splits_in_cluster: bool = False) -> Fp8GemmConfig:
    """A BF16 config of the given tiling with as many stages as fit (or num_stages); streamed_store: the k-grouped
    kind's FP32 D staging (smem_bytes); splits_in_cluster: a tile's splits as one cluster (module docstring)."""
    if not is_legal_tile(block_m, block_n):
        raise ValueError(f"no BF16 kernel for {block_m}x{block_n} tiles: block_m in {BLOCK_MS}, block_n a multiple "
                         f"of 16 up to 256 (at most {MAX_TWO_WAVE_BLOCK_N} with 256 rows)")
    if num_splits != 1 and (num_tma_multicast != 1 or block_m == 256):
        raise ValueError("split-K needs num_tma_multicast == 1 and block_m <= 128")
    stages = num_stages or max_stages(block_m, block_n, out_dtype_bytes, smem_capacity, streamed_store)
    if stages < MIN_STAGES:
        raise ValueError(f"a {block_m}x{block_n} BF16 tile fits only {stages} stages")
    # NOTE: with splits in a cluster a tile's FP32 partial sums wait in the stage buffers; with bf16 stages they fit
    # in any MIN_STAGES of a legal tile.
    if splits_in_cluster and not 2 <= num_splits <= 8:
        raise ValueError("splits in a cluster need 2..8 splits")
    return Fp8GemmConfig(block_m=block_m, block_n=block_n, num_stages=stages, num_tma_multicast=num_tma_multicast,
                         multicast_on_a=multicast_on_a,
                         swizzle_d_bytes=fp8_gemm.swizzle_d_bytes(block_n, out_dtype_bytes),
                         smem_bytes=smem_bytes(block_m, block_n, stages, out_dtype_bytes, streamed_store),
                         block_k=BLOCK_K,
                         num_splits=num_splits, pipelined=False, overlap_epilogue=False,
                         splits_in_cluster=splits_in_cluster)


def estimate_seconds(config: Fp8GemmConfig, m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2,
                     with_accumulation: bool = False, num_groups: int = 1) -> float:
    """The model's run-time estimate (module docstring; the terms are fp8_gemm.estimate_seconds')."""
    units = fp8_gemm.num_work_units(config, m, n, num_sms, num_groups)
    ctas = fp8_gemm.grid_size(config, m, n, num_sms, num_groups)
    clusters = ctas // config.num_tma_multicast
    active_ctas = min(ctas, units * config.num_tma_multicast)
    k_blocks = _ceil_div(k, BLOCK_K)

    a, b = fp8_gemm.MATH_SECONDS_PER_K_BLOCK[config.block_m]
    math_s = a * BF16_CONSTANT_SHARE + b * max(config.block_n, 64)
    a_bytes, b_bytes = config.block_m * BLOCK_K * OPERAND_BYTES, config.block_n * BLOCK_K * OPERAND_BYTES
    stage_bytes = l2_bytes = a_bytes + b_bytes
    if config.num_tma_multicast == 2:
        l2_bytes -= (a_bytes if config.multicast_on_a else b_bytes) / 2
    load_s = max(stage_bytes / fp8_gemm.SM_INGEST_BYTES_PER_S,
                 l2_bytes * active_ctas / fp8_gemm.AGGREGATE_INGEST_BYTES_PER_S)
    k_block_s = max(math_s, load_s)
    epilogue_s = fp8_gemm.EPILOGUE_SECONDS[config.block_m]
    tile_s = k_blocks * k_block_s + epilogue_s
    busiest_cta_s = _ceil_div(units, clusters) * tile_s
    if config.num_splits > 1:
        unsplit = fp8_gemm.num_unsplit_tiles(config, m, n, num_sms)
        partial_bytes = config.block_m * config.block_n * 4
        # Splits in a cluster: the leader reads the other splits' partial sums, no workspace round trip.
        split_s, partials_read = ((CLUSTER_SPLIT_SECONDS, config.num_splits - 1) if config.splits_in_cluster
                                  else (SPLIT_SECONDS, config.num_splits))
        job_s = (_ceil_div(k_blocks, config.num_splits) * k_block_s + epilogue_s + split_s +
                 partials_read * partial_bytes / fp8_gemm.SM_INGEST_BYTES_PER_S)
        busiest_cta_s = unsplit // clusters * tile_s + _ceil_div(units - unsplit, clusters) * job_s

    d_passes = 2 if with_accumulation else 1
    dram_bytes = num_groups * ((m + n) * k * OPERAND_BYTES + d_passes * m * n * out_dtype_bytes)
    dram_s = dram_bytes / DRAM_BYTES_PER_S
    seconds = (fp8_gemm.LAUNCH_SECONDS + max(busiest_cta_s, dram_s) +
               OVERLAP_LOSS * min(busiest_cta_s, dram_s))
    if config.splits_in_cluster:
        seconds *= CLUSTER_SPLIT_FACTOR
    return seconds * (fp8_gemm.MULTICAST_FACTOR[config.block_m] if config.num_tma_multicast == 2 else 1.0)


def _multicast_options(m: int, n: int, block_m: int, block_n: int, num_sms: int):
    yield 1, False
    if num_sms < 2:
        return
    if _ceil_div(n, block_n) % 2 == 0:
        yield 2, True
    if _ceil_div(m, block_m) % 2 == 0:
        yield 2, False


def _split_options(m: int, n: int, k: int, block_m: int, block_n: int, num_tma_multicast: int, num_sms: int):
    """1, and (no multicast, at most 128 rows) the split counts that fit one wave of jobs (fp8_gemm's rule over
    64-deep K blocks)."""
    yield 1
    if num_tma_multicast != 1 or block_m == 256:
        return
    tiles = _ceil_div(m, block_m) * _ceil_div(n, block_n)
    k_blocks = _ceil_div(k, BLOCK_K)
    if tiles < num_sms:
        yield from range(2, min(k_blocks, num_sms // tiles) + 1)
    elif tiles % num_sms:
        yield from range(2, min(k_blocks, num_sms // (tiles % num_sms), fp8_gemm.MAX_TAIL_SPLITS) + 1)


def candidate_configs(m: int, n: int, num_sms: int, smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES,
                      out_dtype_bytes: int = 2, k: int = None, grouped: bool = False, mn_major_b: bool = False,
                      streamed_store: bool = False):
    """Every legal BF16 config, larger tiles first (the tie order); split-K options only when k is given;
    streamed_store: the k-grouped kind's FP32 D staging, whose 256-row tiles run in 2-CTA clusters only (the
    kernel's static_assert)."""
    for block_m in sorted(BLOCK_MS, reverse=True):
        for block_n in reversed(BLOCK_NS):
            if not is_legal_tile(block_m, block_n, grouped, mn_major_b):
                continue
            if max_stages(block_m, block_n, out_dtype_bytes, smem_capacity, streamed_store) < MIN_STAGES:
                continue
            for num_tma_multicast, multicast_on_a in _multicast_options(m, n, block_m, block_n, num_sms):
                if streamed_store and block_m == 256 and num_tma_multicast == 1:
                    continue
                splits = (1,) if k is None else _split_options(m, n, k, block_m, block_n, num_tma_multicast, num_sms)
                for num_splits in splits:
                    config = make_config(block_m, block_n, num_tma_multicast, multicast_on_a, out_dtype_bytes,
                                         num_splits=num_splits, smem_capacity=smem_capacity,
                                         streamed_store=streamed_store)
                    if k is not None and not grouped and block_m == 64 and m <= 64 and block_n >= 64:
                        stages = min(config.num_stages, MAX_DENSE_STAGES_64_ROWS)
                        yield make_config(block_m, block_n, num_tma_multicast, multicast_on_a, out_dtype_bytes,
                                          num_stages=stages, num_splits=num_splits)
                    else:
                        yield config
                    # NOTE: after the workspace split of the same tiles (a tie keeps it), with every stage that fits.
                    if (1 < num_splits <= fp8_gemm.MAX_CLUSTER_SPLITS and not grouped and m <= block_m and
                            _ceil_div(k, BLOCK_K) >= MIN_CLUSTER_SPLIT_K_BLOCKS and
                            _ceil_div(n, block_n) * num_splits <= num_sms):
                        yield replace(config, splits_in_cluster=True)


def ranked_configs(m: int, n: int, k: int, num_sms: int, smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES,
                   out_dtype_bytes: int = 2, with_accumulation: bool = False, mn_major_b: bool = False) -> list:
    """Every dense candidate (split-K included) with its modelled time, fastest first (ties: enumeration order)."""
    fp8_gemm.check_problem(n, k, num_sms)
    m = max(m, 1)
    timed = [(estimate_seconds(config, m, n, k, num_sms, out_dtype_bytes, with_accumulation), config)
             for config in candidate_configs(m, n, num_sms, smem_capacity, out_dtype_bytes, k, mn_major_b=mn_major_b)]
    if not timed:
        raise ValueError(f"no BF16 GEMM config fits {smem_capacity} bytes of shared memory")
    timed.sort(key=lambda pair: pair[0])
    return timed


def get_bf16_gemm_config(m: int, n: int, k: int, num_sms: int, smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES,
                         out_dtype_bytes: int = 2, with_accumulation: bool = False,
                         mn_major_b: bool = False) -> Fp8GemmConfig:
    """The config with the lowest modelled time for D[m, n] = A[m, k] * B[n, k]^T with bf16 A and B.

    Args:
        m: rows of A (0 allowed); n, k: multiples of 16; num_sms: SMs the persistent grid may use;
        smem_capacity: dynamic shared memory per block; out_dtype_bytes: 2 (bf16 D) or 4 (FP32 D);
        with_accumulation: D += A * B^T; mn_major_b: B is N-major (tiles of whole 64-column boxes).

    Returns:
        A frozen Fp8GemmConfig with block_k 64; equal inputs give equal configs.
    """
    return ranked_configs(m, n, k, num_sms, smem_capacity, out_dtype_bytes, with_accumulation, mn_major_b)[0][1]


def measured_masked_tile(expected_m: int, n: int, k: int, num_groups: int, num_sms: int):
    """(BLOCK_M, BLOCK_N) of MEASURED_MASKED_TILES for a masked problem it covers (hint in [expected_m,
    MEASURED_MASKED_HINT_SHARE x expected_m] of the measured rows, MEASURED_NUM_SMS SMs), else None."""
    measured = MEASURED_MASKED_TILES.get((n, k, num_groups))
    if measured is None or num_sms != MEASURED_NUM_SMS:
        return None
    rows, tile = measured
    return tile if rows <= expected_m <= MEASURED_MASKED_HINT_SHARE * rows else None


def get_grouped_bf16_gemm_config(gemm_type: str, m: int, n: int, k: int, num_groups: int, num_sms: int,
                                 smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES) -> Fp8GemmConfig:
    """The grouped kinds' config (bf16 D): a measured masked tile (measured_masked_tile) where one applies, else
    modelled_grouped_config's."""
    check_grouped_problem(gemm_type, m, n, k, num_groups, num_sms)
    tile = measured_masked_tile(m, n, k, num_groups, num_sms) if gemm_type == "m_grouped_masked" else None
    if tile is not None and max_stages(*tile, 2, smem_capacity) >= MIN_STAGES:
        return make_config(*tile, smem_capacity=smem_capacity)
    return modelled_grouped_config(gemm_type, m, n, k, num_groups, num_sms, smem_capacity)


def modelled_grouped_config(gemm_type: str, m: int, n: int, k: int, num_groups: int, num_sms: int,
                            smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES) -> Fp8GemmConfig:
    """The model's grouped config (bf16 D), as heuristics.grouped_fp8_gemm models the groups: m is the total rows
    (contiguous) or the expected valid rows per group (masked: ceil(rows / BLOCK_M) blocks per group, the time
    averaged over MASKED_ROW_SHARES of m)."""
    check_grouped_problem(gemm_type, m, n, k, num_groups, num_sms)
    rows = modelled_rows(gemm_type, m, num_groups, 0, half_block_spread=False)
    candidates = list(candidate_configs(rows, n, num_sms, smem_capacity, grouped=True))
    if not candidates:
        raise ValueError(f"no BF16 GEMM config fits {smem_capacity} bytes of shared memory")

    def modelled_seconds(config) -> float:
        if gemm_type == "m_grouped_masked":
            return sum(estimate_seconds(config, max(round(rows * share), 1), n, k, num_sms, num_groups=num_groups)
                       for share in MASKED_ROW_SHARES)
        return estimate_seconds(config, rows, n, k, num_sms, num_groups=num_groups)

    return min(candidates, key=modelled_seconds)


def template_args(config: Fp8GemmConfig, n: int, k: int, out_dtype, with_accumulation: bool,
                  gemm_type: str = "normal", mn_major_a: bool = False, mn_major_b: bool = False) -> list:
    """The engine's template arguments for a BF16 config (operands K-major unless mn_major_a / mn_major_b)."""
    return fp8_gemm.template_args(config, n, k, out_dtype, with_accumulation, gemm_type, OPERANDS, mn_major_a,
                                  mn_major_b)


REPRESENTATIVE_MS = fp8_gemm.REPRESENTATIVE_MS
REPRESENTATIVE_NKS = fp8_gemm.REPRESENTATIVE_NKS
REPRESENTATIVE_TRANSPOSED_NKS = ((4096, 7168), (7168, 2048))


@dataclass(frozen=True)
class Bf16CandidateKernel(CandidateKernel):
    mn_major_a: bool = False
    mn_major_b: bool = False

    def template_args(self) -> list:
        return template_args(self.config, self.n, self.k, self.out_dtype, self.with_accumulation, self.gemm_type,
                             self.mn_major_a, self.mn_major_b)


def all_candidate_kernels(num_sms: int = 132) -> list:
    """Every distinct kernel the BF16 heuristics pick over the representative shapes: dense with bf16 D and with
    FP32 accumulation, and both grouped kinds (bf16 D)."""
    from deep_kernels.heuristics import grouped_fp8_gemm

    kernels = {}

    def add(kernel):
        kernels.setdefault(tuple(kernel.template_args()), kernel)

    for out_dtype, with_accumulation in fp8_gemm.REPRESENTATIVE_OUTPUTS:
        out_bytes = 2 if out_dtype == "bfloat16" else 4
        for n, k in REPRESENTATIVE_NKS:
            for m in REPRESENTATIVE_MS:
                config = get_bf16_gemm_config(m, n, k, num_sms, out_dtype_bytes=out_bytes,
                                              with_accumulation=with_accumulation)
                add(Bf16CandidateKernel(config, n, k, out_dtype, with_accumulation))
    for gemm_type, m, n, k, g in grouped_fp8_gemm.representative_problems():
        config = get_grouped_bf16_gemm_config(gemm_type, m, n, k, g, num_sms)
        add(Bf16CandidateKernel(config, n, k, "bfloat16", False, gemm_type))
    # The transposed layouts at large M: NN (B N-major), TN (both MN-major; the weight gradient), TT (A M-major).
    for n, k in REPRESENTATIVE_TRANSPOSED_NKS:
        for mn_major_a, mn_major_b in ((False, True), (True, True), (True, False)):
            config = get_bf16_gemm_config(4096, n, k, num_sms, mn_major_b=mn_major_b)
            add(Bf16CandidateKernel(config, n, k, "bfloat16", False, "normal", mn_major_a, mn_major_b))
    return list(kernels.values())
