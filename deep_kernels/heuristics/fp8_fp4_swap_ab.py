"""Config choice for the FP8 x MXFP4 GEMM with A and B swapped (decode sizes, M <= 128 tokens): the weights are
wgmma's register operand, expanded in registers, the tokens its N (csrc/kernels/sm90_fp8_fp4_gemm_swap_ab.cuh).

Pure functions of the problem and the device: no GPU calls, no torch. A CTA computes 64 weight rows per math
warpgroup (one or two) over one share of K (split-K across CTAs; one CTA an SM, or two to four with one math
warpgroup); the model prices the busiest SM's K blocks (the expansion's integer work bounds an SM), bounded below by
B's bytes (4.25 bits a weight) at DRAM speed. The masked grouped layout (get_masked_config) picks by a measured rule.
"""

from dataclasses import dataclass, replace

from deep_kernels.heuristics.fp8_gemm import BLOCK_K, DRAM_BYTES_PER_S, SMEM_CAPACITY_BYTES

KERNEL_HEADER = "kernels/sm90_fp8_fp4_gemm_swap_ab.cuh"
# Token tiles (wgmma's N) and the most tokens the kernel takes.
BLOCK_TS = (16, 32, 64, 128)
MAX_TOKENS = BLOCK_TS[-1]
# The token tiles the kernel takes (wgmma's N in steps of 16); the masked layout picks from all of them.
ALL_BLOCK_TS = tuple(range(16, MAX_TOKENS + 1, 16))
# The masked layout's token granularity where its work items narrow (the kernel's kMaskedTokenStep; masked_a_box_rows).
MASKED_TOKEN_STEP = 16
B_BITS_PER_WEIGHT = 4.25
EXPAND_TABLE_BYTES = 256
# The pair tables of tile-scaled prepared weights (gemm/fp4_prepared.cuh: kTilePairTableBytes).
TILE_PAIR_TABLE_BYTES = 1024
MAX_STAGES = 12
MIN_STAGES = 2
# The split-K counts offered (those the model was fitted over). Every tile's split is equal: a stream-K cut (all
# tiles' K blocks laid end to end in equal shares, one per CTA slot, a tile cut among several CTAs summed through the
# workspace) was measured on the H200 (2026-12-03, prepared tile-scaled weights, every decode shape, in turns) at
# 0.78-0.99x the picks at N x K 7168 x 16384 (whose 56 or 112 tiles leave 20 SMs idle) and 0.53-0.99x elsewhere but
# at 64 x 2112 x 7168 (1.06x, one-warpgroup CTAs); at 16 x 7168 x 16384 its 132 CTAs ran only 1.014x its 112, so
# those idle SMs are not what bounds that shape.
SPLITS = (1, 2, 4, 8)
# What the model charges, fitted on the H200 (2026-12-02) to 255 timings of the kernel over the 24 decode shapes (1 to
# 16 splits, one or two math warpgroups, one or two CTAs an SM; 13% mean error): an SM expands a 64-row K block in a
# time that grows with the token tile (its integer pipe is the limit, so a second CTA on it adds no throughput), by
# math warpgroups of the CTA; each wave of CTAs an SM runs one after another costs its pipeline fill; a split adds
# its partial store, ticket and sum; and a fixed cost per launch. An SM with one math warpgroup alone (one-warpgroup
# CTAs, no more of them than SMs) is latency- rather than throughput-bound, and a two-warpgroup CTA's pipeline fill
# (twice the codes a stage) costs twice: those two factors were chosen on the same timings, where they bring the
# model's picks to 2% (geometric mean; at most 9%) of the fastest measured config, from 5% (34%).
ROW_BLOCK_SECONDS = {1: (0.205e-6, 0.00291e-6), 2: (0.222e-6, 0.00174e-6)}  # (constant, per token)
# On prepared weights (prepare_fp4_weights) the row block's cost alone, refitted (the other costs kept) on the H200
# (2026-12-02, b0c4870) to 253 timings over the 24 decode shapes (1 to 8 splits, one or two math warpgroups, one or
# two CTAs an SM; RMS log error 0.20): the picks are within 1.8% of the fastest measured config (geometric mean;
# at most 14%, at 64 tokens).
PREPARED_ROW_BLOCK_SECONDS = {1: (0.115e-6, 0.003e-6), 2: (0.095e-6, 0.002e-6)}
LONE_WARPGROUP_FACTOR = 1.1
WAVE_SECONDS = {1: 1.47e-6, 2: 2.94e-6}  # by math warpgroups
SPLIT_SECONDS = 2.16e-6
FIXED_SECONDS = 2.75e-6


@dataclass(frozen=True)
class SwapAbConfig:
    """One instantiation: token tile, math warpgroups (64 weight rows each), stages; and the launch's split-K."""

    block_t: int
    num_math_warpgroups: int
    num_stages: int
    num_splits: int = 1
    ctas_per_sm: int = 1
    num_chains: int = 1
    # Prepared weights: each K block's promotion overlapped with the next block's wgmma group (two accumulator sets).
    pipelined: bool = False
    # The splits (2 to MAX_CLUSTER_SPLITS) of a tile in one cluster, summed through distributed shared memory.
    splits_in_cluster: bool = False

    def __post_init__(self):
        # NOTE: here rather than in make_config, so that configs made by dataclasses.replace are checked too.
        if self.splits_in_cluster and not 2 <= self.num_splits <= MAX_CLUSTER_SPLITS:
            raise ValueError(f"splits in a cluster: 2 to {MAX_CLUSTER_SPLITS} of them, got {self.num_splits}")

    @property
    def block_w(self) -> int:
        return 64 * self.num_math_warpgroups

    @property
    def num_threads(self) -> int:
        return num_threads(self.num_math_warpgroups, self.ctas_per_sm, self.block_t)

    @property
    def smem_bytes(self) -> int:
        return smem_bytes(self.block_t, self.num_math_warpgroups, self.num_stages)

    def smem_bytes_of(self, tile_scaled: bool) -> int:
        """The shared memory of the kernel on row- or tile-scaled prepared weights (the pair tables' size)."""
        return smem_bytes(self.block_t, self.num_math_warpgroups, self.num_stages, tile_scaled)


# The most splits one cluster takes (the portable cluster size).
MAX_CLUSTER_SPLITS = 8

# The most CTAs an SM runs at once (one math warpgroup each; from three on the producer is one warp).
MAX_CTAS_PER_SM = 4


def num_threads(num_math_warpgroups: int, ctas_per_sm: int, block_t: int) -> int:
    """A CTA's threads (the kernel's swap_ab_num_threads): the math warpgroups and a producer warpgroup, or a
    producer warp with three or more CTAs an SM, or two of more than 64 tokens."""
    one_warp = num_math_warpgroups == 1 and (ctas_per_sm >= 3 or (ctas_per_sm == 2 and block_t > 64))
    return 128 * num_math_warpgroups + (32 if one_warp else 128)


def smem_capacity(ctas_per_sm: int) -> int:
    """Dynamic shared memory of each of ctas_per_sm CTAs on one SM (the kernel's max_smem_bytes_per_cta)."""
    return SMEM_CAPACITY_BYTES if ctas_per_sm == 1 else (233472 - ctas_per_sm * 1024) // ctas_per_sm


def can_share_sm(block_t: int, num_math_warpgroups: int, ctas_per_sm: int = 2, wide: bool = False) -> bool:
    """Whether ctas_per_sm (two or more) CTAs fit an SM without spilling (128 registers a thread with two, 136 with
    three, 102 with four): one math warpgroup, up to 64 tokens (32 with four); wide: also two CTAs of 80 or 96
    tokens (a one-warp producer, 168 registers)."""
    limit = {2: 96 if wide else 64, 3: 64}.get(ctas_per_sm, 32)
    return num_math_warpgroups == 1 and block_t <= limit


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def _stage_bytes(block_t: int, num_math_warpgroups: int) -> int:
    block_w = 64 * num_math_warpgroups
    return block_t * BLOCK_K + block_w * BLOCK_K // 2 + _align(block_t * 4, 128) + block_w * 4


def smem_bytes(block_t: int, num_math_warpgroups: int, num_stages: int, tile_scaled: bool = False) -> int:
    """The kernel's carve-up (Sm90Fp8Fp4SwapAbTraits::kSmemBytes): the stages, the expansion tables (tile_scaled:
    the pair tables), the barriers."""
    tables = TILE_PAIR_TABLE_BYTES if tile_scaled else EXPAND_TABLE_BYTES
    return num_stages * _stage_bytes(block_t, num_math_warpgroups) + tables + 16 * num_stages


def for_tile_scaled(config: SwapAbConfig) -> SwapAbConfig:
    """config on tile-scaled prepared weights: its stages, less those that the larger pair tables leave no room for
    (one, in a few configs)."""
    stages = config.num_stages
    while smem_bytes(config.block_t, config.num_math_warpgroups, stages, True) > smem_capacity(config.ctas_per_sm):
        stages -= 1
    return replace(config, num_stages=stages)


def max_stages(block_t: int, num_math_warpgroups: int, ctas_per_sm: int = 1) -> int:
    """As many stages as fit (up to MAX_STAGES)."""
    stages = (smem_capacity(ctas_per_sm) - EXPAND_TABLE_BYTES) // (_stage_bytes(block_t, num_math_warpgroups) + 16)
    return min(stages, MAX_STAGES)


def max_chains(block_t: int, num_math_warpgroups: int, ctas_per_sm: int = 1, pipelined: bool = False) -> int:
    """The most independent wgmma accumulator chains of a K block whose accumulators (BLOCK_T / 2 registers a set,
    two sets of chains when pipelined) fit: up to 64 registers of sets (32 with two or three CTAs an SM, 16 with
    four)."""
    budget = {1: 64, 2: 32, 3: 32}.get(ctas_per_sm, 16)
    sets = 2 if pipelined else 1
    return max(c for c in (1, 2, 4) if c == 1 or sets * c * block_t // 2 <= budget)


def can_pipeline(block_t: int, num_math_warpgroups: int, ctas_per_sm: int = 1) -> bool:
    """Whether the pipelined promotion (two accumulator sets) fits the registers without spilling (ptxas, CUDA 13.0):
    up to 128 tokens with one math warpgroup alone on an SM, 96 with two, 32 with two or three CTAs an SM, 16 with
    four."""
    if ctas_per_sm == 1:
        return block_t <= (128 if num_math_warpgroups == 1 else 96)
    return block_t <= {2: 32, 3: 32}.get(ctas_per_sm, 16)


def block_t_for(m: int) -> int:
    """The smallest token tile holding m tokens."""
    if not 0 < m <= MAX_TOKENS:
        raise ValueError(f"the swapped kernel takes 1 to {MAX_TOKENS} tokens, got m = {m}")
    return next(t for t in BLOCK_TS if t >= m)


def make_config(block_t: int, num_math_warpgroups: int = 2, num_stages: int = None, num_splits: int = 1,
                ctas_per_sm: int = 1, num_chains: int = None, pipelined: bool = False,
                splits_in_cluster: bool = False) -> SwapAbConfig:
    """A config of the given tiling (as many stages as fit unless given), for overrides and tests (pipelined: the
    pipelined promotion, prepared weights only; splits_in_cluster: the splits in one cluster)."""
    if block_t not in ALL_BLOCK_TS or num_math_warpgroups not in (1, 2):
        raise ValueError(f"no swapped FP4 kernel for {block_t} tokens and {num_math_warpgroups} math warpgroups")
    if not 1 <= ctas_per_sm <= MAX_CTAS_PER_SM or (
            ctas_per_sm > 1 and not can_share_sm(block_t, num_math_warpgroups, ctas_per_sm, wide=True)):
        raise ValueError(f"{ctas_per_sm} CTAs an SM: one to {MAX_CTAS_PER_SM}; two or more need one math warpgroup "
                         f"and at most 96 tokens with two, 64 with three, 32 with four")
    stages = num_stages or max_stages(block_t, num_math_warpgroups, ctas_per_sm)
    if not MIN_STAGES <= stages or smem_bytes(block_t, num_math_warpgroups, stages) > smem_capacity(ctas_per_sm):
        raise ValueError(f"{stages} stages of {block_t} tokens do not fit")
    if num_splits < 1:
        raise ValueError(f"num_splits must be positive, got {num_splits}")
    if pipelined and (stages < 3 or not can_pipeline(block_t, num_math_warpgroups, ctas_per_sm)):
        raise ValueError(f"the pipelined promotion of {block_t} tokens does not fit {num_math_warpgroups} math "
                         f"warpgroup(s) and {ctas_per_sm} CTA(s) an SM, or {stages} stages (at least 3)")
    chains = num_chains or max_chains(block_t, num_math_warpgroups, ctas_per_sm, pipelined)
    if chains not in (1, 2, 4) or chains > max_chains(block_t, num_math_warpgroups, ctas_per_sm, pipelined):
        raise ValueError(f"{chains} accumulator chains do not fit the registers of {block_t} tokens")
    return SwapAbConfig(block_t, num_math_warpgroups, stages, num_splits, ctas_per_sm, chains, pipelined,
                        splits_in_cluster)


def estimate_seconds(config: SwapAbConfig, m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2,
                     prepared: bool = False) -> float:
    """The model's run-time estimate (ROW_BLOCK_SECONDS and the costs after it): the busiest SM's 64-row K blocks,
    the waves of CTAs, the splits, at least B's bytes at DRAM speed."""
    tiles = -(-n // config.block_w)
    units = tiles * config.num_splits
    k_blocks = -(-(k // BLOCK_K) // config.num_splits)
    busiest_row_blocks = -(-units // num_sms) * config.num_math_warpgroups * k_blocks
    waves = -(-units // (num_sms * config.ctas_per_sm))
    constant, per_token = (PREPARED_ROW_BLOCK_SECONDS if prepared else ROW_BLOCK_SECONDS)[config.num_math_warpgroups]
    row_block_s = constant + per_token * config.block_t
    if config.num_math_warpgroups == 1 and units <= num_sms:
        row_block_s *= LONE_WARPGROUP_FACTOR
    compute_s = (busiest_row_blocks * row_block_s + waves * WAVE_SECONDS[config.num_math_warpgroups] +
                 (SPLIT_SECONDS if config.num_splits > 1 else 0.0))
    dram_s = (n * k * B_BITS_PER_WEIGHT / 8 + m * k + m * n * out_dtype_bytes) / DRAM_BYTES_PER_S
    return FIXED_SECONDS + max(compute_s, dram_s)


# One-warpgroup CTAs three and four an SM, offered on prepared weights: measured on the H200 (2026-12-02, 52463a5,
# 18 decode shapes against the picks of the model without them), the model picks them at five shapes (N x K 24576 x
# 1536 and 32768 x 512, one wave of CTAs instead of two), each measured 1.16-1.40x faster than the previous pick;
# the other 13 picks are unchanged.
PREPARED_SHARED_SM_CTAS = (2, 3, 4)


def candidate_configs(m: int, n: int, k: int, num_sms: int, prepared: bool = False):
    block_t = block_t_for(m)
    shared = PREPARED_SHARED_SM_CTAS if prepared else (2,)
    for num_math_warpgroups, ctas_per_sm in ((2, 1), (1, 1)) + tuple((1, c) for c in shared):
        if ctas_per_sm > 1 and not can_share_sm(block_t, num_math_warpgroups, ctas_per_sm):
            continue
        stages = max_stages(block_t, num_math_warpgroups, ctas_per_sm)
        chains = max_chains(block_t, num_math_warpgroups, ctas_per_sm)
        for num_splits in (splits for splits in SPLITS if splits <= k // BLOCK_K):
            yield SwapAbConfig(block_t, num_math_warpgroups, stages, num_splits, ctas_per_sm, chains)


# On prepared weights the dense picks of two math warpgroups and up to this many tokens run the pipelined promotion
# (with_pipelined_promotion). Measured on the H200 (2026-12-03, the decode shapes, tile-scaled weights, timed in turns
# with the unpipelined pick on three fresh weight draws, every output checked against float64): 1.00-1.05x the
# unpipelined pick at those picks (N x K 7168 x 16384 at 1, 16 and 64 tokens, 4096 x 7168 at 64); one-warpgroup
# CTAs gained nothing (0.98-1.01x, one to four an SM), nor did 128 tokens with one math warpgroup (0.97-1.00x).
PIPELINED_MAX_TOKENS = 64


def with_pipelined_promotion(config: SwapAbConfig) -> SwapAbConfig:
    """config with the pipelined promotion (and the most accumulator chains that fit both sets) where it has two math
    warpgroups and at most PIPELINED_MAX_TOKENS tokens; else config."""
    if config.num_math_warpgroups != 2 or config.block_t > PIPELINED_MAX_TOKENS:
        return config
    chains = max_chains(config.block_t, config.num_math_warpgroups, config.ctas_per_sm, pipelined=True)
    return replace(config, pipelined=True, num_chains=chains)


# The pipelined picks of two splits put them in one cluster. Measured on the H200 (2026-12-03, prepared tile-scaled
# weights, in turns with the workspace split on two weight draws, bitwise equal): 1.024-1.037x at N x K 7168 x 16384
# (1, 16 and 64 tokens). Not elsewhere: clusters of four and eight splits ran 0.54-0.67x (not profiled; a cluster's
# CTAs must share a GPC), and two splits of 128 tokens 0.96x. Nor at 1 and 16 tokens on the other decode shapes
# (H200, 2026-12-05, 30 configs of one or two math warpgroups, one to four CTAs an SM, two to eight splits in a
# cluster, pipelined or not, timed in turns with the pick): the best of them ran 0.65-1.02x the pick on each of the
# 12 problems; at 16 x 7168 x 2048 (Nsight Compute) the pick keeps 32% of issue slots busy, its warps stalled on
# fixed-latency dependencies and loads, DRAM 23% busy.
def with_splits_in_cluster(config: SwapAbConfig) -> SwapAbConfig:
    """config with its splits in one cluster where it is pipelined and has two splits; else config."""
    return replace(config, splits_in_cluster=True) if config.pipelined and config.num_splits == 2 else config


def get_config(m: int, n: int, k: int, num_sms: int, out_dtype_bytes: int = 2, prepared: bool = False) -> SwapAbConfig:
    """The swapped kernel's config with the lowest modelled time for D[m, n] = A[m, k] * B[n, k]^T (prepared: the
    weights in prepare_fp4_weights's layout, and the pipelined promotion and splits in a cluster where
    with_pipelined_promotion and with_splits_in_cluster give them)."""
    if k % BLOCK_K != 0 or k <= 0 or n % 16 != 0 or n <= 0:
        raise ValueError(f"k must be a positive multiple of 128 and n of 16, got k = {k}, n = {n}")
    best = min(candidate_configs(m, n, k, num_sms, prepared),
               key=lambda config: estimate_seconds(config, m, n, k, num_sms, out_dtype_bytes, prepared))
    return with_splits_in_cluster(with_pipelined_promotion(best)) if prepared else best


def is_preferred(m: int, n: int, k: int, num_sms: int) -> bool:
    """Whether the dense GEMM runs the swapped kernel: up to MAX_TOKENS tokens. (The other way to feed the tensor cores,
    the Fp8Mxfp4 kind expanding B into shared memory, ran 0.22-0.81x the swapped picks at 64 and 128 tokens on the
    H200, its model's best three configs and 64- or 128-row tiles with 1 to 4 splits on the six DeepSeek-V3 N x K,
    timed in turns, 2026-12-04.)"""
    return 0 < m <= MAX_TOKENS


def template_args(config: SwapAbConfig, out_dtype, with_accumulation: bool, prepared: bool = False,
                  masked: bool = False, tile_scaled: bool = False) -> list:
    """The kernel's C++ template arguments, in declaration order (out_dtype "bfloat16" / "float32" or a torch
    dtype; prepared: the weights in prepare_fp4_weights's layout; masked: the masked grouped layout, prepared bf16
    only; tile_scaled: prepared weights of one block exponent a tile, PreparedFp4Weights.tile_scaled)."""
    name = str(out_dtype).removeprefix("torch.")
    cpp_type = {"bfloat16": "__nv_bfloat16", "float32": "float"}.get(name)
    if cpp_type is None:
        raise ValueError(f"out_dtype must be bfloat16 or float32, got {out_dtype!r}")
    if with_accumulation != (cpp_type == "float"):
        raise ValueError("FP32 D with accumulation, bf16 D without")
    if masked and (not prepared or cpp_type != "__nv_bfloat16" or config.num_splits != 1):
        raise ValueError("the masked layout takes prepared weights, bf16 D and no split-K")
    if tile_scaled and not prepared:
        raise ValueError("tile_scaled takes prepared weights")
    if config.pipelined and not prepared:
        raise ValueError("the pipelined promotion takes prepared weights")
    return [str(config.block_t), str(config.num_math_warpgroups), str(config.num_stages), cpp_type,
            "true" if with_accumulation else "false", str(config.ctas_per_sm), str(config.num_chains),
            "true" if prepared else "false", "true" if masked else "false", "true" if tile_scaled else "false",
            "true" if config.pipelined else "false", str(config.num_splits if config.splits_in_cluster else 1)]


def masked_a_box_rows(config: SwapAbConfig) -> int:
    """The rows of the masked layout's A tensor-map box (the kernel's kMaskedABoxRows). With three or more CTAs an SM
    each work item runs its valid tokens rounded up to MASKED_TOKEN_STEP (its A rows and wgmma N; one box per step),
    else BLOCK_T (one box). A token of tile costs: on 64 experts of at most 16 rows, 16-token tiles ran 1.10-1.11x
    32-token ones (N x K 4096 x 7168 and 7168 x 2048). Measured on the H200 (2026-12-04, 16 and 64 experts of 16, 32
    and 64 rows and 256 of 16 rows, both N x K, each timed in turns with our FP8 masked GEMM, against the kernel
    without narrowing in the same run): 1.04-1.06x at 64 and 256 experts of 16 and 32 rows, 0.99-1.02x at 16 experts,
    1.00x with two CTAs an SM (80-token tiles), which stay one width: narrowed there they ran 0.94-1.03x (a CTA that
    runs out of items early leaves a lone, latency-bound warpgroup on its SM).
    """
    return MASKED_TOKEN_STEP if config.ctas_per_sm >= 3 else config.block_t


def get_masked_config(expected_m: int, n: int, k: int, num_groups: int, num_sms: int) -> SwapAbConfig:
    """The masked layout's config for experts of about expected_m valid rows: the smallest token tile holding them
    (a multiple of 16); one-warpgroup CTAs, four an SM up to 32 tokens, three up to 64, two up to 96, else two math
    warpgroups. Measured on the H200 (2026-12-02; 16 to 256 experts of 16, 32 and 64 expected rows, N x K 4096 x
    7168 and 7168 x 2048, 6 problems each; tiles by expected_m 16 / 32 / 64: 32, 48 and 80 tokens): at 32 tokens
    four CTAs an SM were the fastest config offered in 6 of 6 problems (1.07-1.12x two), at 48 tokens three CTAs in 5
    of 6 (1.03-1.08x two; 0.96x at 16 experts of N 4096; 7ca794f), at 80 tokens two one-warpgroup CTAs in 6 of 6
    (1.03-1.07x one two-warpgroup CTA, which was 1.08-1.21x the 128-token tile; 2cdd726). Configs outside the rule,
    re-measured on the H200 (2026-12-04, 18 problems of 16, 64 and 256 experts, in turns with the rule's pick): the
    pipelined promotion, two math warpgroups and fewer CTAs an SM ran 0.63-1.01x the picks, except at 16 experts of
    32 rows (N x K 4096 x 7168), where two CTAs an SM ran 1.065x and one two-warpgroup CTA 1.05x (one problem: not
    taken)."""
    if k % BLOCK_K != 0 or k <= 0 or n % 16 != 0 or n <= 0 or num_groups <= 0:
        raise ValueError(f"k must be a positive multiple of 128, n of 16 and num_groups positive, got k = {k}, "
                         f"n = {n}, num_groups = {num_groups}")
    block_t = next(t for t in ALL_BLOCK_TS if t >= min(max(expected_m, 1), MAX_TOKENS))
    for ctas_per_sm in (4, 3, 2):
        if can_share_sm(block_t, 1, ctas_per_sm, wide=True):
            return make_config(block_t, 1, ctas_per_sm=ctas_per_sm)
    return make_config(block_t, 2)
