"""Config choice for the grouped (MoE) FP8 GEMMs: the SM90 FP8 GEMM kernel's contiguous and masked kinds.

Pure functions of the problem and the device: no GPU calls, no torch. They reuse the dense model of
deep_kernels.heuristics.fp8_gemm with the problem cut into groups, which is what the scheduler walks:

* masked: the host cannot read masked_m without a sync, so the model sees num_groups GEMMs around the hint
  expected_m, a partly filled block costing as much as a full one. B is read once per group. Several groups'
  M-blocks add up near their expected count, with each group's rows spread as the masked targets draw them
  (MASKED_ROWS_SPREAD: expected_m x U(0.7 / 1.2, 1.3 / 1.2)), so the model counts E[ceil(rows / BLOCK_M)] blocks
  per group; one group's count is a single draw, and the model plans for the hint's rows, ceil(expected_m /
  BLOCK_M). (Half a block more per group, as this model once counted, was a second block where one holds every
  group: on the H200 it steered 16 x 64-row groups to 64-row tiles, 1.20x slower than 128-row ones. The
  expected count, where ceil(expected_m / BLOCK_M) had counted 5 blocks for 2 groups of about 512 rows and 3 for
  4 groups of about 256, picks 128 x 144 tiles (1.06-1.07x the 128 x 160 ones) and 128 x 160 (1.07-1.09x 128 x 192)
  at N = 4096, K = 7168, and 128 x 128 (1.01-1.04x 128 x 192) for 2 groups at N = 7168, K = 2048; grouped_gemm
  suite draws, two runs, 2026-12-02.) Groups of about 64 rows, where the model has 128 x 192 (plain K loop) and
  128 x 128 or 128 x 112 (pipelined) within 1%, measured both ways (2026-12-03, two runs): the pipelined tiles ran
  1.015-1.037x at 8 and 16 groups (N = 7168, K = 2048), 1.00x at 32 groups (N = 1536, K = 7168) and 0.974-0.977x at
  64 (N = 4096, K = 7168) and 256 groups (N = 7168, K = 2048); the model's picks stay.
* contiguous: the total M is known; the rows are split evenly over the groups (each segment a multiple of
  the alignment), so the tile count is that of the total M while B is read num_groups times.

BLOCK_M 64 and 128 divide the contiguous layout's segment alignment (128, deep_kernels.moe.layout's
CONTIGUOUS_ALIGNMENT; tests/test_grouped_gemm.py checks it), so no M-block spans two segments; 256-row tiles start
on 128-row halves, one more tile where a segment starts on an odd half (csrc/scheduler.cuh), which the model leaves
out (a segment of an odd count of halves adds half a tile).
"""

from deep_kernels.heuristics import fp8_gemm
from deep_kernels.heuristics.fp8_gemm import CandidateKernel, Fp8GemmConfig

GEMM_TYPES = ("m_grouped_contiguous", "m_grouped_masked")


# Tile heights the grouped model offers: 256-row tiles (which the kernel takes, DK_FP8_GEMM_CONFIG block_m=256) ran
# 1.08-1.16x the 128 x 192 tiles' time on the contiguous suite shapes and lost on every masked one (H200, 2026-12-02).
# Unicast with the epilogue overlap they ran 0.978-1.018x the picks there over three runs (H200, 2026-12-03), within the
# runs' spread: the contiguous kernel runs them 2.0-4.1% behind the dense one on the same rows, and all of its added
# instructions are per-tile code (the scheduler's walk, the store's row checks).
GROUPED_BLOCK_MS = (64, 128)


def modelled_rows(gemm_type: str, m: int, num_groups: int, block_m: int, half_block_spread: bool = True) -> int:
    """The rows per group the model sees for a tile height (see the module docstring): with half_block_spread, masked
    groups get half a block more for the spread of masked_m (what the FP8 x FP4 grouped model, not re-measured, still
    counts); the FP8 and BF16 models pass False."""
    if gemm_type == "m_grouped_masked":
        return max(m, 1) + (block_m // 2 if half_block_spread else 0)
    return max(-(-m // num_groups), 1)


# The rows of a masked group as the model spreads them: the masked targets' convention (valid rows per group
# expected_m x U(0.7, 1.3), the host hint int(1.2 x expected_m)), i.e. uniform over hint x [0.7 / 1.2, 1.3 / 1.2].
MASKED_ROWS_SPREAD = (0.7 / 1.2, 1.3 / 1.2)


def expected_masked_blocks(hint: int, block_m: int) -> float:
    """E[ceil(rows / block_m)] for a masked group's rows uniform over hint x MASKED_ROWS_SPREAD."""
    low, high = (max(hint, 1) * share for share in MASKED_ROWS_SPREAD)
    blocks = 0.0
    for j in range(int(low // block_m), -(-int(high) // block_m) + 1):
        blocks += (j + 1) * max(0.0, min(high, (j + 1) * block_m) - max(low, j * block_m))
    return blocks / (high - low)


def check_grouped_problem(gemm_type: str, m: int, n: int, k: int, num_groups: int, num_sms: int) -> None:
    """A grouped problem the heuristics take (m: total rows, or expected rows per group when masked), else a clear
    ValueError."""
    if gemm_type not in GEMM_TYPES:
        raise ValueError(f"gemm_type must be one of {GEMM_TYPES}, got {gemm_type!r}")
    if not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive integer, got {num_groups!r}")
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    fp8_gemm.check_problem(n, k, num_sms)


def ranked_grouped_configs(gemm_type: str, m: int, n: int, k: int, num_groups: int, num_sms: int,
                           smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES) -> list:
    """Every candidate of a grouped GEMM with bf16 D with its modelled seconds, fastest first (ties keep
    fp8_gemm.candidate_configs' order): the model's pick first, then what measured tuning times next. Arguments
    as for get_grouped_fp8_gemm_config."""
    check_grouped_problem(gemm_type, m, n, k, num_groups, num_sms)
    rows = modelled_rows(gemm_type, m, num_groups, 0)
    # NOTE: several masked groups' blocks add up near their expected count; one group's count is a single draw, planned
    # for at the hint's rows.
    spread = gemm_type == "m_grouped_masked" and num_groups > 1
    timed = [(fp8_gemm.estimate_seconds(config, modelled_rows(gemm_type, m, num_groups, config.block_m, False), n, k,
                                        num_sms, num_groups=num_groups,
                                        num_m_blocks=expected_masked_blocks(m, config.block_m) if spread else None),
              config)
             for config in fp8_gemm.candidate_configs(rows, n, num_sms, smem_capacity, grouped=True,
                                                      block_ms=GROUPED_BLOCK_MS)]
    if not timed:
        raise ValueError(f"no FP8 GEMM config fits {smem_capacity} bytes of shared memory")
    timed.sort(key=lambda pair: pair[0])
    return timed


def get_grouped_fp8_gemm_config(gemm_type: str, m: int, n: int, k: int, num_groups: int, num_sms: int,
                                smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES) -> Fp8GemmConfig:
    """The config with the lowest modelled time for a grouped GEMM with bf16 D (ties: the first candidate
    of fp8_gemm.candidate_configs' order).

    Args:
        gemm_type: "m_grouped_contiguous" or "m_grouped_masked".
        m: total rows of A (contiguous) or the expected valid rows per group (masked); 0 is allowed.
        n, k: columns of D and the reduction depth (both multiples of 16).
        num_groups: G >= 1.
        num_sms: SMs the persistent grid may use.
        smem_capacity: dynamic shared memory per block, bytes.

    Returns:
        A frozen Fp8GemmConfig; equal inputs give equal configs.
    """
    return ranked_grouped_configs(gemm_type, m, n, k, num_groups, num_sms, smem_capacity)[0][1]


def grid_size(gemm_type: str, config: Fp8GemmConfig, m: int, n: int, num_sms: int) -> int:
    """CTAs to launch. Contiguous: as for a dense GEMM of the total M (padding blocks are skipped, never
    added). Masked: the work depends on masked_m on the device, so every SM, rounded down to the cluster
    size; CTAs without work exit at once."""
    if gemm_type == "m_grouped_masked":
        return num_sms // config.num_tma_multicast * config.num_tma_multicast
    return fp8_gemm.grid_size(config, m, n, num_sms)


# (G, rows per group, N, K) of the contiguous layout and (G, expected M) x (N, K) of the masked one: the
# benchmark's shapes and the DeepSeek-V3 expert shapes at prefill and decode sizes.
REPRESENTATIVE_CONTIGUOUS = ((4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168),
                             (8, 4096, 7168, 2048), (32, 256, 4096, 7168), (256, 128, 7168, 2048))
REPRESENTATIVE_MASKED_GM = ((1, 1024), (2, 512), (4, 256), (16, 64), (32, 32), (256, 8))
REPRESENTATIVE_MASKED_NK = ((4096, 7168), (7168, 2048))


def representative_problems():
    """(gemm_type, m as get_grouped_fp8_gemm_config takes it, n, k, num_groups) of the shapes above."""
    for g, rows, n, k in REPRESENTATIVE_CONTIGUOUS:
        yield "m_grouped_contiguous", g * rows, n, k, g
    for n, k in REPRESENTATIVE_MASKED_NK:
        for g, expected_m in REPRESENTATIVE_MASKED_GM:
            yield "m_grouped_masked", expected_m, n, k, g


def all_candidate_kernels(num_sms: int = 132) -> list:
    """Every distinct kernel the grouped heuristics pick over the representative shapes (bf16 D)."""
    kernels = {}
    for gemm_type, m, n, k, g in representative_problems():
        config = get_grouped_fp8_gemm_config(gemm_type, m, n, k, g, num_sms)
        kernel = CandidateKernel(config, n, k, "bfloat16", False, gemm_type)
        kernels.setdefault(tuple(kernel.template_args()), kernel)
    return list(kernels.values())
