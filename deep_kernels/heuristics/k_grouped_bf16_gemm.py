"""Config choice for the k-grouped BF16 GEMM (MoE weight gradients in BF16): the SM90 GEMM engine's KGrouped kind
with Bf16 operands and FP32 D (deep_kernels/k_grouped_bf16_gemm.py).

Pure functions of the problem and the device: no GPU calls, no torch. The model is the BF16 one of
deep_kernels.heuristics.bf16_gemm with the problem cut into groups as the k-grouped FP8 kind's model cuts it
(heuristics.k_grouped_fp8_gemm): every group has the same M x N tiles, so the busiest CTA runs
ceil(G x tiles / CTAs) tiles of the average K, and A, B and D are moved once per group. The candidates are the
BF16 ones with FP32 D staged by the streamed store (two 64-row chunks per math warpgroup, so wide tiles keep their
stages), without split-K; 256-row tiles take part in 2-CTA clusters; with an N-major B, whole 64-column boxes.
"""

from deep_kernels.heuristics import bf16_gemm, fp8_gemm
from deep_kernels.heuristics.bf16_gemm import Bf16CandidateKernel
from deep_kernels.heuristics.fp8_gemm import Fp8GemmConfig
from deep_kernels.heuristics.k_grouped_fp8_gemm import modelled_problem

GEMM_TYPE = "k_grouped"
OUT_DTYPE_BYTES = 4
BLOCK_K = bf16_gemm.BLOCK_K


def candidate_configs(m: int, n: int, num_sms: int, smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES,
                      mn_major_b: bool = False):
    """The kind's legal configs, larger tiles first (ties keep the first)."""
    return bf16_gemm.candidate_configs(m, n, num_sms, smem_capacity, OUT_DTYPE_BYTES, mn_major_b=mn_major_b,
                                       streamed_store=True)


def get_k_grouped_bf16_gemm_config(m: int, n: int, total_k: int, num_groups: int, num_sms: int,
                                   with_accumulation: bool = False, mn_major_b: bool = False,
                                   smem_capacity: int = fp8_gemm.SMEM_CAPACITY_BYTES) -> Fp8GemmConfig:
    """The config with the lowest modelled time for D[g] = A_g B_g^T (+ C[g]), g < num_groups, A [m, total_k],
    B [n, total_k] bf16, D [num_groups, m, n] FP32.

    Args:
        m, n: rows and columns of each D[g] (n a multiple of 16).
        total_k: the sum of the groups' K (a multiple of 64; 0 allowed).
        num_groups: G >= 1.
        num_sms: SMs the persistent grid may use.
        with_accumulation: D += A_g B_g^T (D is read and written).
        mn_major_b: B is N-major (tiles of whole 64-column boxes).
        smem_capacity: dynamic shared memory per block, bytes.

    Returns:
        A frozen Fp8GemmConfig with block_k 64; equal inputs give equal configs.
    """
    rows, k = modelled_problem(m, n, total_k, num_groups, num_sms, BLOCK_K)
    candidates = list(candidate_configs(rows, n, num_sms, smem_capacity, mn_major_b))
    if not candidates:
        raise ValueError(f"no BF16 GEMM config fits {smem_capacity} bytes of shared memory")
    return min(candidates, key=lambda config: bf16_gemm.estimate_seconds(
        config, rows, n, k, num_sms, OUT_DTYPE_BYTES, with_accumulation, num_groups))


def grid_size(config: Fp8GemmConfig, m: int, n: int, num_groups: int, num_sms: int) -> int:
    """CTAs to launch: one per SM at most, a whole number of clusters, no more than the G x tiles need."""
    return fp8_gemm.grid_size(config, m, n, num_sms, num_groups)


def template_args(config: Fp8GemmConfig, n: int, with_accumulation: bool, mn_major_a: bool = False,
                  mn_major_b: bool = False) -> list:
    """The engine's template arguments (SHAPE_K 0: the groups' K come from the device)."""
    return bf16_gemm.template_args(config, n, 0, "float32", with_accumulation, GEMM_TYPE, mn_major_a, mn_major_b)


# (G, M, N, average K per group) of MoE weight gradients: DeepSeek-V3's expert shapes (out x in = 4096 x 7168 and
# 7168 x 2048) at 2048 to 8192 tokens per expert.
REPRESENTATIVE_PROBLEMS = tuple((g, m, n, k) for g in (4, 8, 16) for m, n in ((4096, 7168), (7168, 2048))
                                for k in (2048, 4096, 8192))


def all_candidate_kernels(num_sms: int = 132) -> list:
    """Every distinct kernel the k-grouped BF16 heuristics pick over the representative shapes: the tn layout's
    (both operands MN-major, token-major tensors as they are) accumulating or not, and the nt layout's (K-major)
    accumulating."""
    kernels = {}
    for g, m, n, k in REPRESENTATIVE_PROBLEMS:
        for mn_major, accumulate in ((True, False), (True, True), (False, True)):
            config = get_k_grouped_bf16_gemm_config(m, n, g * k, g, num_sms, accumulate, mn_major_b=mn_major)
            kernel = Bf16CandidateKernel(config, n, 0, "float32", accumulate, GEMM_TYPE, mn_major, mn_major)
            kernels.setdefault(tuple(kernel.template_args()), kernel)
    return list(kernels.values())
