"""Config choice for the k-grouped FP8 GEMM (MoE weight gradients): the SM90 FP8 GEMM kernel's KGrouped kind with
per-channel scales on both operands (deep_kernels/k_grouped_gemm.py).

Pure functions of the problem and the device: no GPU calls, no torch. The model is the dense one of
deep_kernels.heuristics.fp8_gemm with the problem cut into groups, as the scheduler walks it: every group has the
same M x N tiles, so the busiest CTA runs ceil(G x tiles / CTAs) tiles of the average K (the host knows the
total K, not how the device's per-group sizes spread it; uneven groups cost a little more than modelled), and
A, B and D are moved once per group. The candidates are the dense ones with FP32 D, without split-K (the kind has
none), with the epilogue overlap where the kind has it (128-row tiles: the next tile's first K block is issued before
the store unless that tile's group is empty) and the plain K loop where a tile is too wide for the pipelined one
(not the pipelined halves); 256-row tiles take part. 128-row tiles in
2-CTA clusters sharing B run at their own measured factor (B_MULTICAST_FACTOR_128).

The model prices 256-row tiles above what they measure, but still below the picks: on the H200 (2026-12-03, six of
the suite's rows, 4 to 16 experts, both expert shapes, timed in turns, bitwise equal) 256 x 128 in 2-CTA clusters
multicasting A or B, lockstep or ping-pong, ran 0.89-0.93x the 128 x 192 picks (modelled 0.94-0.96x), and the picks
without their B multicast 0.965-0.984x. The picks' tiles with the ping-pong schedule (the kind's candidates do not
offer it) ran 0.90-0.94x them at 4 and 16 experts of N = 7168.
"""

import dataclasses

from deep_kernels.heuristics import fp8_gemm
from deep_kernels.heuristics.fp8_gemm import CandidateKernel, Fp8GemmConfig

GEMM_TYPE = "k_grouped"
OPERANDS = "fp8_channel_scaled"
OUT_DTYPE_BYTES = 4
BLOCK_K = fp8_gemm.BLOCK_K


# Time of a 128-row config whose 2-CTA cluster shares B (two M blocks of a group) over its estimate without the cluster,
# in place of the dense kinds' fp8_gemm.MULTICAST_FACTOR[128]: on the H200 (2026-12-02, timed in turns with the same
# tiles unclustered, 128 x 192 with the epilogue overlap) 0.967-0.998 over eight of the suite's shapes (4 to 16 experts,
# 2048 to 8192 tokens per expert on average, both expert shapes; 0.961 and 0.988 in an earlier run of two of them).
B_MULTICAST_FACTOR_128 = 0.985
# 128-row tiles with the plain K loop copy sfb into their stages thread-major (Fp8GemmConfig.thread_major_sfb): on the
# H200 (2026-12-02, 128 x 192 with B multicast and the epilogue overlap, the picks, timed in turns with the TMA-loaded
# stage in two runs) 1.001-1.009 times as fast over six of the suite's rows (4 to 16 experts, both expert shapes).
# (The dense kind's picks ran 0.95-1.03 times as fast with it, so they keep the TMA-loaded stage.)
THREAD_MAJOR_SFB_BLOCK_M = 128


def candidate_configs(m: int, n: int, num_sms: int, smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES):
    """The kind's legal configs, in the dense enumeration order (ties keep the first)."""
    for config in fp8_gemm.candidate_configs(m, n, num_sms, smem_capacity, OUT_DTYPE_BYTES, operands=OPERANDS):
        # NOTE: candidates of the pipelined halves take the plain loop instead (the kernel takes the halves up to 160
        # columns; wider ones spill). On the H200 (2026-12-03, five of the suite's rows, 4 to 16
        # experts, both expert shapes, timed in turns, bitwise equal) 128 x 160 with the halves, their first sfb pairs
        # loaded ahead, ran 0.935-0.949x the 128 x 192 picks (plain loop, thread-major sfb, B multicast) with B
        # multicast, 0.957-0.971x without it, 0.953-0.969x with it and thread-major sfb, while the dense weight gradient
        # at 4096 x 7168 ran 128 x 192 at 0.94-0.95x its 128 x 160 pick (the halves). The tile counts differ: there 1216
        # tiles of 128 x 192 fill 9.2 of 10 waves on 132 SMs and 1440 of 128 x 160 10.9 of 11, while the k-grouped kind
        # runs its G problems' tiles as one stream.
        if config.pipelined and fp8_gemm.can_pipeline_halves(config.block_m, config.block_n, OPERANDS,
                                                             config.num_splits):
            config = dataclasses.replace(config, pipelined=False)
        if config.block_m == THREAD_MAJOR_SFB_BLOCK_M and not config.pipelined:
            config = dataclasses.replace(config, thread_major_sfb=True)
        yield with_kind_overlap(config)


def with_kind_overlap(config: Fp8GemmConfig) -> Fp8GemmConfig:
    """The config with the epilogue overlap where the kind has it (the grouped kinds' rule)."""
    overlap = fp8_gemm.has_epilogue_overlap(config.block_m, config.block_n, config.num_splits, grouped=True,
                                            operands=OPERANDS)
    return dataclasses.replace(config, overlap_epilogue=config.overlap_epilogue and overlap)


def modelled_problem(m: int, n: int, total_k: int, num_groups: int, num_sms: int, block_k: int) -> tuple:
    """(rows, K) of the one group the model times for a k-grouped problem (the FP8 and BF16 kinds'): at least one
    row, and the average group's K in whole K blocks of block_k, at least one; a clear ValueError for a problem the
    heuristics do not take."""
    if not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive integer, got {num_groups!r}")
    if m < 0 or total_k < 0 or total_k % block_k:
        raise ValueError(f"m must be >= 0 and total_k a non-negative multiple of {block_k}, got m={m}, "
                         f"total_k={total_k}")
    k = max(-(-total_k // num_groups // block_k), 1) * block_k
    fp8_gemm.check_problem(n, k, num_sms)
    return max(m, 1), k


def get_k_grouped_fp8_gemm_config(m: int, n: int, total_k: int, num_groups: int, num_sms: int,
                                  with_accumulation: bool = False,
                                  smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES) -> Fp8GemmConfig:
    """The config with the lowest modelled time for D[g] = A_g B_g^T (+ C[g]), g < num_groups, A [m, total_k],
    B [n, total_k], D [num_groups, m, n] FP32.

    Args:
        m, n: rows and columns of each D[g] (n a multiple of 16).
        total_k: the sum of the groups' K (a multiple of 128; 0 allowed).
        num_groups: G >= 1.
        num_sms: SMs the persistent grid may use.
        with_accumulation: D += A_g B_g^T (D is read and written).
        smem_capacity: dynamic shared memory per block, bytes.

    Returns:
        A frozen Fp8GemmConfig; equal inputs give equal configs.
    """
    rows, k = modelled_problem(m, n, total_k, num_groups, num_sms, BLOCK_K)
    candidates = list(candidate_configs(rows, n, num_sms, smem_capacity))
    if not candidates:
        raise ValueError(f"no FP8 GEMM config fits {smem_capacity} bytes of shared memory")
    return min(candidates, key=lambda config: estimate_seconds(config, rows, n, k, num_sms, with_accumulation,
                                                               num_groups))


def estimate_seconds(config: Fp8GemmConfig, m: int, n: int, k: int, num_sms: int, with_accumulation: bool,
                     num_groups: int) -> float:
    """The dense model's estimate of the groups' problem (k: the average group's), 128-row clusters sharing B at the
    kind's measured factor (B_MULTICAST_FACTOR_128)."""
    seconds = fp8_gemm.estimate_seconds(config, m, n, k, num_sms, OUT_DTYPE_BYTES, with_accumulation, num_groups,
                                        OPERANDS)
    if config.block_m == 128 and config.num_tma_multicast == 2 and not config.multicast_on_a:
        seconds *= B_MULTICAST_FACTOR_128 / fp8_gemm.MULTICAST_FACTOR[128]
    return seconds


def grid_size(config: Fp8GemmConfig, m: int, n: int, num_groups: int, num_sms: int) -> int:
    """CTAs to launch: one per SM at most, a whole number of clusters, no more than the G x tiles need."""
    return fp8_gemm.grid_size(config, m, n, num_sms, num_groups)


# (G, M, N, average K per group) of MoE weight gradients: DeepSeek-V3's expert shapes (out x in = 4096 x 7168 and
# 7168 x 2048) at 2048 to 8192 tokens per expert.
REPRESENTATIVE_PROBLEMS = tuple((g, m, n, k) for g in (4, 8, 16) for m, n in ((4096, 7168), (7168, 2048))
                                for k in (2048, 4096, 8192))


def all_candidate_kernels(num_sms: int = 132) -> list:
    """Every distinct kernel the k-grouped heuristics pick over the representative shapes (accumulating or not)."""
    kernels = {}
    for g, m, n, k in REPRESENTATIVE_PROBLEMS:
        for accumulate in (False, True):
            config = get_k_grouped_fp8_gemm_config(m, n, g * k, g, num_sms, accumulate)
            kernel = CandidateKernel(config, n, 0, "float32", accumulate, GEMM_TYPE, OPERANDS)
            kernels.setdefault(tuple(kernel.template_args()), kernel)
    return list(kernels.values())
