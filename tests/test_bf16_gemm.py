"""BF16 GEMMs (the GEMM engine's Bf16 kind): validation, heuristics and compiled code (CPU), and the kernels against
a float64 reference (GPU).

Inputs are testing.gemm's bf16 activations (each row and 128-column group its own power-of-two magnitude) and
weights (each 128 x 128 block its own), so that a wrong K block, row or expert moves the result far past the bound.
The check is testing.gemm.assert_gemm_close (every element: outputs are poisoned before each launch; the whole
matrix, every 128 x 128 tile and every row within BF16_BOUND / FP32_BOUND, NaN and inf where the reference has
them) plus the issue's whole-matrix bound for bf16 D, calc_diff <= 2e-6 (bf16 rounding alone gives about 1.4e-6).
The planted-bug tests hand the real kernel one wrong K block of B and one row of the wrong expert, and show that the
same check rejects each result.
"""

import re

import pytest
import torch

import deep_kernels
from deep_kernels import bf16_gemm
from deep_kernels.heuristics import bf16_gemm as heuristics
from deep_kernels.heuristics import fp8_gemm as fp8_heuristics
from deep_kernels.heuristics import grouped_fp8_gemm
from deep_kernels.reference import bf16_gemm as reference
from deep_kernels.testing import assert_bitwise_equal, calc_diff, one_row_of_wider_rows, poison_
from deep_kernels.testing.gemm import (
    BF16_BOUND, accumulator_like, assert_gemm_close, gemm_activations, gemm_errors, gemm_weights,
)
from deep_kernels.testing.grouped import contiguous_layout
from deep_kernels.validation import check_no_overlap

from conftest import FULL

# The bound on the whole bf16 matrix (FP32 D: testing.gemm.FP32_BOUND).
WHOLE_BF16_BOUND = 2e-6
NUM_SMS = 132


def _inputs(m: int, n: int, k: int, device="cuda", seed: int = 0) -> tuple:
    return gemm_activations(m, k, device, seed), gemm_weights(n, k, device, seed + 1)


def _reference(a, b, c=None) -> torch.Tensor:
    return reference.bf16_gemm_nt(a, b, torch.empty((a.shape[0], b.shape[0]), dtype=torch.float64, device=a.device), c)


def _assert_close(d: torch.Tensor, expected: torch.Tensor) -> dict:
    errors = assert_gemm_close(d, expected)
    if d.dtype == torch.bfloat16:
        assert errors["whole"] <= WHOLE_BF16_BOUND, f"calc_diff {errors['whole']:.3g} > {WHOLE_BF16_BOUND:g}"
    return errors


# ---- validation (CPU) ----

def _cpu_operands(m=8, n=256, k=256):
    return torch.zeros(m, k, dtype=torch.bfloat16), torch.zeros(n, k, dtype=torch.bfloat16), torch.empty(
        m, n, dtype=torch.bfloat16)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d: (a.half(), b, d), TypeError, "a must be torch.bfloat16"),
    (lambda a, b, d: (a, b.float(), d), TypeError, "b must be torch.bfloat16"),
    (lambda a, b, d: (a[None], b, d), ValueError, "a must be 2-D"),
    (lambda a, b, d: (a, b[:, :128], d), ValueError, "K differs"),
    (lambda a, b, d: (a[:, :200], b[:, :200], d), ValueError, r"K \(the columns of a and b\) must be"),
    (lambda a, b, d: (a, b[:200], d[:, :200]), ValueError, r"N \(the rows of b, the columns of d\) must"),
    (lambda a, b, d: (a, b, d.half()), TypeError, "d must be torch.bfloat16 or torch.float32"),
    (lambda a, b, d: (a, b, d[:, :128]), ValueError, "d must be a contiguous"),
    (lambda a, b, d: (a, b, d.t().contiguous().t()), ValueError, "d must be a contiguous"),
    (lambda a, b, d: (torch.zeros(8, 512, dtype=torch.bfloat16)[:, ::2], b, d), ValueError,
     r"a \[M, K\] must be K-major .* or M-major .* pass a.contiguous"),
    (lambda a, b, d: (a, torch.zeros(256, 512, dtype=torch.bfloat16)[:, ::2], d), ValueError,
     r"b \[N, K\] must be K-major .* or N-major"),
    (lambda a, b, d: (torch.zeros(256, 12, dtype=torch.bfloat16)[:, :8].t(), b, d), ValueError,
     "a is M-major: its K rows must be 16-byte aligned"),
    (lambda a, b, d: (torch.zeros(8, 260, dtype=torch.bfloat16)[:, :256], b, d), ValueError, "16-byte aligned"),
    (lambda a, b, d: (torch.zeros(8 * 256 + 1, dtype=torch.bfloat16)[1:].view(8, 256), b, d), ValueError,
     "16-byte aligned"),
    (lambda a, b, d: (a, b, d), ValueError, "a must be a CUDA tensor"),
])
def test_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.bf16_gemm_nt(*mutate(*_cpu_operands()))


def test_accumulation_needs_fp32():
    a, b, d = _cpu_operands()
    with pytest.raises(TypeError, match="d must be torch.float32"):
        deep_kernels.bf16_gemm_nt(a, b, d, c=torch.zeros(8, 256))
    with pytest.raises(TypeError, match="c must be torch.float32"):
        deep_kernels.bf16_gemm_nt(a, b, d.float(), c=torch.zeros(8, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="c must have shape"):
        deep_kernels.bf16_gemm_nt(a, b, d.float(), c=torch.zeros(8, 128))


def test_transposed_forms_take_either_major_and_grouped_ones_refuse_mn_major():
    # NN / TN / TT pass row-major [K, M] / [K, N] operands (MN-major after the transpose) and K-major views alike.
    a, b, d = _cpu_operands()
    for call, args in ((deep_kernels.bf16_gemm_nn, (a, b.t().contiguous(), d)), (deep_kernels.bf16_gemm_nn, (a, b.t(), d)),
                       (deep_kernels.bf16_gemm_tn, (a.t().contiguous(), b.t().contiguous(), d)),
                       (deep_kernels.bf16_gemm_tt, (a.t().contiguous(), b, d)), (deep_kernels.bf16_gemm_tt, (a.t(), b, d))):
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            call(*args)
    assert bf16_gemm.is_mn_major(a.t().contiguous().t(), "a", "M") and not bf16_gemm.is_mn_major(a, "a", "M")
    a, b, d, m_indices = _cpu_grouped()
    with pytest.raises(ValueError, match=r"a is M-major .* grouped BF16 GEMMs read a \[M_total, K\] K-major"):
        deep_kernels.m_grouped_bf16_gemm_nt_contiguous(a.t().contiguous().t(), b, d, m_indices)


def _cpu_grouped(num_groups=3, m=256, n=64, k=128):
    a = torch.zeros(m, k, dtype=torch.bfloat16)
    b = torch.zeros(num_groups, n, k, dtype=torch.bfloat16)
    return a, b, torch.empty(m, n, dtype=torch.bfloat16), torch.zeros(m, dtype=torch.int32)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d, i: (a[:200], b, d[:200], i[:200]), ValueError, "multiple of"),
    (lambda a, b, d, i: (a, b[:, :, :64], d, i), ValueError, "K differs"),
    (lambda a, b, d, i: (a, b[0], d, i), ValueError, "b must be 3-D"),
    (lambda a, b, d, i: (a, b.transpose(1, 2).contiguous().transpose(1, 2), d, i), ValueError, "b is N-major"),
    (lambda a, b, d, i: (a, b, d, i.long()), TypeError, "m_indices must be torch.int32"),
    (lambda a, b, d, i: (a, b, d, i[:128]), ValueError, "m_indices must be a contiguous int32 tensor of shape"),
    (lambda a, b, d, i: (a, b, d.float(), i), TypeError, "d must be torch.bfloat16"),
    (lambda a, b, d, i: (a, b, d, i), ValueError, "a must be a CUDA tensor"),
])
def test_contiguous_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.m_grouped_bf16_gemm_nt_contiguous(*mutate(*_cpu_grouped()))


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d, mm, e: (a[:2], b, d[:2], mm, e), ValueError, "a has G = 2 groups but b has 3"),
    (lambda a, b, d, mm, e: (a, b, d, mm, 0), ValueError, "expected_m must be an integer in"),
    (lambda a, b, d, mm, e: (a, b, d, mm, 2.0), ValueError, "expected_m must be an integer in"),
    (lambda a, b, d, mm, e: (a, b, d, mm[:2], e), ValueError, "masked_m must be a contiguous int32 tensor"),
    (lambda a, b, d, mm, e: (a, b, d[:, :8], mm, e), ValueError, "d must be a contiguous bf16 tensor of shape"),
    (lambda a, b, d, mm, e: (a, b, d, mm, e), ValueError, "a must be a CUDA tensor"),
])
def test_masked_rejects_bad_input(mutate, error, match):
    a = torch.zeros(3, 16, 128, dtype=torch.bfloat16)
    b = torch.zeros(3, 64, 128, dtype=torch.bfloat16)
    d = torch.empty(3, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(error, match=match):
        deep_kernels.m_grouped_bf16_gemm_nt_masked(*mutate(a, b, d, torch.zeros(3, dtype=torch.int32), 4))


def test_an_output_must_not_overlap_the_operands_which_may_share_memory():
    x = torch.zeros(64, 128, dtype=torch.bfloat16)
    check_no_overlap([("d", torch.zeros(64, 64, dtype=torch.bfloat16))], [("a", x), ("b", x)], "d and the operands")
    with pytest.raises(ValueError, match="d and the operands must not overlap: d and b do"):
        check_no_overlap([("d", x[:, 64:])], [("a", torch.zeros(4, 128)), ("b", x)], "d and the operands")


@pytest.mark.gpu
def test_gemm_into_its_own_operand_is_refused():
    a, b = _inputs(64, 256, 256)
    with pytest.raises(ValueError, match="d and the operands must not overlap: d and a do"):
        deep_kernels.bf16_gemm_nt(a, b, a)


def test_reference_matches_float64_matmul():
    a, b = _inputs(64, 256, 512, device="cpu")
    d = _reference(a, b)
    # The sums written out as products over K, apart from the reference's matmul.
    assert calc_diff(d, (a.double()[:, None, :] * b.double()[None, :, :]).sum(dim=-1)) < 1e-15
    assert calc_diff(reference.bf16_gemm_nn(a, b.T, torch.empty_like(d)), d) == 0
    assert calc_diff(reference.bf16_gemm_tn(a.T, b.T, torch.empty_like(d)), d) == 0


def test_check_rejects_a_wrong_k_block_on_cpu():
    # One 64-deep K block of B's second 128 rows read from the next K block (a wrong K offset): the tiles it touches
    # move far past the bound.
    a, b = _inputs(64, 1040, 512, device="cpu")
    expected = _reference(a, b)
    assert _assert_close(expected.bfloat16(), expected)["whole"] < WHOLE_BF16_BOUND
    errors = gemm_errors(_reference(a, _planted_k_block(b)).bfloat16(), expected)
    assert errors["tile"][0] > 100 * BF16_BOUND


def _planted_k_block(b: torch.Tensor) -> torch.Tensor:
    """b with rows 128..255, K block 1 (columns 64..127), holding K block 2's values."""
    wrong = b.clone()
    wrong[128:256, 64:128] = b[128:256, 128:192]
    return wrong


# ---- heuristics (CPU) ----

DENSE_PROBLEMS = [(m, n, k, out_bytes, accumulate) for n, k in heuristics.REPRESENTATIVE_NKS
                  for m in (1, 64, 128, 4001, 4096, 8192) for out_bytes, accumulate in ((2, False), (4, False), (4, True))]


def test_config_choice_is_legal():
    # (Its determinism across processes: test_fp8_gemm_heuristics.py.)
    picks = [heuristics.get_bf16_gemm_config(m, n, k, NUM_SMS, out_dtype_bytes=o, with_accumulation=acc)
             for m, n, k, o, acc in DENSE_PROBLEMS]
    for (m, n, k, out_bytes, _), config in zip(DENSE_PROBLEMS, picks):
        assert config.block_k == 64 and not config.pipelined and not config.overlap_epilogue
        assert heuristics.is_legal_tile(config.block_m, config.block_n)
        assert config.smem_bytes == heuristics.smem_bytes(config.block_m, config.block_n, config.num_stages, out_bytes)
        assert config.smem_bytes <= fp8_heuristics.SMEM_CAPACITY_BYTES
        assert heuristics.MIN_STAGES <= config.num_stages
        assert 1 <= config.num_splits <= -(-k // 64)
        assert config.num_splits == 1 or (config.num_tma_multicast == 1 and config.block_m <= 128)
        assert 0 < fp8_heuristics.grid_size(config, m, n, NUM_SMS) <= NUM_SMS


def test_model_picks_what_the_tiles_suggest():
    # Large M: 128-row (or wider) tiles that are wide; decode: split K to fill the SMs.
    large = heuristics.get_bf16_gemm_config(4096, 7168, 2048, NUM_SMS)
    assert large.block_m >= 128 and large.block_n >= 128
    decode = heuristics.get_bf16_gemm_config(64, 2112, 7168, NUM_SMS)
    assert decode.num_splits > 1
    # BF16 K blocks are half as deep as FP8's: the model costs twice as many for the same K.
    config = heuristics.make_config(128, 128)
    assert (heuristics.estimate_seconds(config, 4096, 4096, 8192, NUM_SMS) >
            1.8 * heuristics.estimate_seconds(config, 4096, 4096, 4096, NUM_SMS) - 1e-5)


def test_grouped_configs_are_legal():
    for gemm_type, m, n, k, g in grouped_fp8_gemm.representative_problems():
        config = heuristics.get_grouped_bf16_gemm_config(gemm_type, m, n, k, g, NUM_SMS)
        assert config.num_splits == 1 and config.block_m in (64, 128)
        assert heuristics.is_legal_tile(config.block_m, config.block_n, grouped=True)
    with pytest.raises(ValueError, match="gemm_type"):
        heuristics.get_grouped_bf16_gemm_config("normal", 64, 256, 256, 1, NUM_SMS)


def test_masked_measured_tiles_apply_to_their_problems_only():
    for (n, k, g), (rows, tile) in heuristics.MEASURED_MASKED_TILES.items():
        for hint in (rows, int(1.2 * rows)):
            config = heuristics.get_grouped_bf16_gemm_config(bf16_gemm.MASKED, hint, n, k, g, NUM_SMS)
            assert (config.block_m, config.block_n) == tile
            assert config.num_stages == heuristics.max_stages(*tile, 2) and config.num_splits == 1
        # Outside the measured rows, on another SM count and for the contiguous kind: the model's choice.
        masked, contiguous = bf16_gemm.MASKED, bf16_gemm.CONTIGUOUS
        for hint, num_sms, gemm_type in ((rows - 1, NUM_SMS, masked), (int(1.3 * rows), NUM_SMS, masked),
                                         (rows, NUM_SMS - 18, masked), (g * rows, NUM_SMS, contiguous)):
            assert (heuristics.get_grouped_bf16_gemm_config(gemm_type, hint, n, k, g, num_sms) ==
                    heuristics.modelled_grouped_config(gemm_type, hint, n, k, g, num_sms))
    assert heuristics.measured_masked_tile(1024, 7168, 2048, 1, NUM_SMS) is None


def test_make_config_rejects_illegal_tiles():
    for args in ((256, 192), (96, 128), (128, 264)):
        with pytest.raises(ValueError, match="no BF16 kernel"):
            heuristics.make_config(*args)
    assert heuristics.is_legal_tile(128, 192, mn_major_b=True) and not heuristics.is_legal_tile(128, 160, mn_major_b=True)
    for n, k in heuristics.REPRESENTATIVE_NKS:
        assert heuristics.get_bf16_gemm_config(4096, n, k, NUM_SMS, mn_major_b=True).block_n % 64 == 0
    with pytest.raises(ValueError, match="split-K needs"):
        heuristics.make_config(128, 128, 2, True, num_splits=2)
    with pytest.raises(ValueError, match="splits in a cluster need"):
        heuristics.make_config(128, 128, splits_in_cluster=True)


def test_cluster_splits_are_offered_where_every_job_gets_a_cta():
    # Two splits only, each tile's pair of jobs one cluster: tiles x 2 fit the SMs, one M block, long K; never for the
    # grouped kinds.
    for m, n, k in ((64, 2112, 7168), (128, 4096, 7168), (64, 7168, 16384)):
        clustered = [c for c in heuristics.candidate_configs(m, n, NUM_SMS, k=k) if c.splits_in_cluster]
        assert clustered
        for config in clustered:
            assert config.num_splits == 2 and config.num_tma_multicast == 1 and m <= config.block_m <= 128
            assert fp8_heuristics.has_splits_in_cluster(config, m, n, NUM_SMS)
            assert config.block_m * config.block_n * 4 <= config.num_stages * (config.block_m + config.block_n) * 128
            twin = heuristics.make_config(config.block_m, config.block_n, num_splits=2)
            assert (heuristics.estimate_seconds(config, m, n, k, NUM_SMS) <
                    heuristics.estimate_seconds(twin, m, n, k, NUM_SMS))
    assert not any(c.splits_in_cluster for c in heuristics.candidate_configs(4096, 7168, NUM_SMS, k=2048))
    assert not any(c.splits_in_cluster for c in heuristics.candidate_configs(64, 7168, NUM_SMS, k=2048))
    assert not any(c.splits_in_cluster for c in heuristics.candidate_configs(64, 7168, NUM_SMS, grouped=True))


def test_one_block_64_row_dense_tiles_take_at_most_8_stages():
    for m, n, k in ((64, 7168, 2048), (64, 2112, 7168), (1, 4096, 7168)):
        for config in heuristics.candidate_configs(m, n, NUM_SMS, k=k):
            if config.block_m == 64 and config.block_n >= 64 and not config.splits_in_cluster:
                assert config.num_stages <= heuristics.MAX_DENSE_STAGES_64_ROWS
                assert config.smem_bytes == heuristics.smem_bytes(64, config.block_n, config.num_stages, 2)
    # Two M blocks of 64 rows (M = 128) keep every stage that fits.
    for config in heuristics.candidate_configs(128, 2112, NUM_SMS, k=7168):
        if config.block_m == 64:
            assert config.num_stages == heuristics.max_stages(64, config.block_n, 2)


def test_template_args_name_the_bf16_kind():
    args = heuristics.template_args(heuristics.make_config(128, 256), 4096, 7168, torch.bfloat16, False)
    named = dict(zip(bf16_gemm.FP8_GEMM.template, args))
    assert named["kOperands"] == "deep_kernels::GemmOperands::Bf16" and named["BLOCK_K"] == "64"
    assert named["kPipelined"] == named["kOverlapEpilogue"] == "false"


# ---- compiled code (CPU: nvcc for sm_90a, no GPU) ----

def test_smem_bytes_is_the_kernels_carve_up(tmp_path):
    # The host's shared-memory size must be the traits' kSmemBytes for BF16 stages (no sfa, 128-byte rows).
    from deep_kernels.jit import compiler

    kernels = heuristics.all_candidate_kernels() + [
        heuristics.Bf16CandidateKernel(heuristics.make_config(64, 256, out_dtype_bytes=4), 7168, 2048, "float32", True)]
    checks = []
    for kernel in kernels:
        args = kernel.template_args()
        traits_args = ", ".join(args[:6] + args[8:])
        checks.append(f"static_assert(deep_kernels::sm90_fp8_gemm_detail::Sm90Fp8GemmTraits<{traits_args}>::kSmemBytes "
                      f"== {kernel.config.smem_bytes});")
    source = tmp_path / "smem_check.cu"
    source.write_text('#include "gemm/sm90_fp8_gemm_traits.cuh"\n' + "\n".join(checks) + "\n")
    command = compiler.compile_command(source, tmp_path / "smem_check.cubin", "90a")
    compiler.run_compile(command)
    source.write_text(source.read_text().replace(f"== {kernels[0].config.smem_bytes});",
                                                 f"== {kernels[0].config.smem_bytes + 1});", 1))
    with pytest.raises(RuntimeError, match="static assertion failed"):
        compiler.run_compile(command)


# Representative kinds: two-warpgroup 128 x 256 tiles, 256-row tiles (two waves) with multicast, a split-K decode
# tile of one warpgroup, a tile's splits in one cluster, and the masked kind's row-predicated store.
SASS_KERNELS = [
    heuristics.Bf16CandidateKernel(heuristics.make_config(128, 256), 4096, 7168, "bfloat16", False),
    heuristics.Bf16CandidateKernel(heuristics.make_config(256, 128, 2, True), 7168, 2048, "bfloat16", False),
    heuristics.Bf16CandidateKernel(heuristics.make_config(64, 64, out_dtype_bytes=4, num_splits=4), 2112, 7168,
                                   "float32", True),
    heuristics.Bf16CandidateKernel(heuristics.make_config(128, 112, num_splits=2, splits_in_cluster=True), 7168, 2048,
                                   "bfloat16", False),
    heuristics.Bf16CandidateKernel(heuristics.make_config(128, 192), 7168, 2048, "bfloat16", False,
                                   "m_grouped_masked"),
    # TN (both MN-major) with multicast of A, and NN (B N-major) of one warpgroup.
    heuristics.Bf16CandidateKernel(heuristics.make_config(256, 128, 2, True), 7168, 2048, "bfloat16", False, "normal",
                                   True, True),
    heuristics.Bf16CandidateKernel(heuristics.make_config(64, 192), 4096, 7168, "bfloat16", False, "normal", False,
                                   True),
]


@pytest.fixture(scope="module")
def compiled_sass(tmp_path_factory):
    from deep_kernels.jit import cache
    from deep_kernels.jit.precompile import precompile
    from deep_kernels.testing import sass

    from conftest import cache_dir_set_to

    with cache_dir_set_to(tmp_path_factory.mktemp("cache")):
        specs = [bf16_gemm.FP8_GEMM.spec(*kernel.template_args()) for kernel in SASS_KERNELS]
        entries = precompile(specs, arch="90a", progress=False)
        yield [(spec, entry / cache.BINARY_NAME, sass.sass(entry / cache.BINARY_NAME)) for spec, entry in
               zip(specs, entries)]


def test_compiled_kernels_use_hgmma_with_a_group_in_flight(compiled_sass):
    from deep_kernels.testing import sass

    for spec, cubin, text in compiled_sass:
        assert sass.kernel_problems(spec.name, cubin, required=("HGMMA",)) == [], spec
        assert "QGMMA" not in text
        # The K loop waits for the previous K block's group only (ptxas would wait for all if it lost track).
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in text, spec
        assert re.search(r"HGMMA\.64x\d+x16\.F32\.BF16", text), spec


# ---- kernels against the reference (GPU) ----

FORCED_SHAPE = (1000, 2112, 1600)
FORCED_CONFIGS = [(256, 128, 2, True, 1), (256, 112, 2, False, 1), (128, 256, 1, False, 1), (128, 144, 2, False, 1),
                  (64, 176, 1, False, 1), (128, 96, 1, False, 3)]
ACCUMULATION_CASES = [(100, 2112, 7168, "c"), (4096, 7168, 2048, "c_is_d"), (64, 4096, 7168, "fp32")]
CONTIGUOUS_CASES = [([300, 0, 1000, 77], 4096, 7168), ([1, 128, 255, 0, 513, 64, 64, 200], 7168, 2048)]
WRONG_EXPERT_CASE = ([200, 100, 300], 2112, 1024)
TRANSPOSED_SHAPES = [(300, 2112, 1040), (4096, 7168, 2048)]
# (block_m, block_n, multicast, on A, splits, A M-major, B N-major)
MN_MAJOR_FORCED = [(256, 128, 2, True, 1, True, True), (128, 192, 2, False, 1, False, True),
                   (64, 256, 1, False, 1, True, False), (128, 128, 1, False, 3, True, True)]
MASKED_CASES = [([0, 17, 256, 100], 256, 100, 4096, 7168), ([1, 64, 63, 0, 8, 33], 64, 32, 7168, 2048),
                # measured tiles (heuristics.MEASURED_MASKED_TILES): 128 x 160 and 128 x 128
                ([200, 300, 0, 257], 384, 307, 4096, 7168), ([392, 528], 640, 614, 7168, 2048)]
# (m, n, k, block_m, block_n, output): two splits in a cluster against the workspace split of the same tiles; "c":
# FP32 D with c added.
CLUSTER_SPLIT_CASES = [(64, 2112, 7168, 64, 64, "bf16"), (128, 7168, 2048, 128, 112, "bf16"),
                       (100, 2112, 7168, 64, 64, "c"), (3, 1040, 528, 64, 16, "bf16")]


def _cluster_split_configs(block_m: int, block_n: int, mode: str) -> tuple:
    """(workspace split, splits in a cluster) of two splits."""
    out_bytes = 4 if mode == "c" else 2
    return tuple(heuristics.make_config(block_m, block_n, out_dtype_bytes=out_bytes, num_splits=2,
                                        splits_in_cluster=in_cluster) for in_cluster in (False, True))


def _gpu_test_kernels(num_sms: int) -> list:
    """The kernels the GPU tests below launch (so that they compile in parallel, up front)."""
    dense = [(m, n, k, 2, False, num_sms) for m, n, k in _dense_shapes() + [(300, 1040, 512), (64, 2112, 7168)]]
    dense += [(1000, 2112, 7168, 2, False, 60)]
    dense += [(m, n, k, 4, mode != "fp32", num_sms) for m, n, k, mode in ACCUMULATION_CASES]
    kernels = [heuristics.Bf16CandidateKernel(
        heuristics.get_bf16_gemm_config(m, n, k, sms, out_dtype_bytes=out_bytes, with_accumulation=accumulate), n, k,
        "bfloat16" if out_bytes == 2 else "float32", accumulate) for m, n, k, out_bytes, accumulate, sms in dense]
    kernels += [heuristics.Bf16CandidateKernel(heuristics.make_config(bm, bn, mc, on_a, num_splits=splits),
                                               *FORCED_SHAPE[1:], "bfloat16", False)
                for bm, bn, mc, on_a, splits in FORCED_CONFIGS]
    kernels += [heuristics.Bf16CandidateKernel(heuristics.make_config(bm, bn, mc, on_a, num_splits=splits),
                                               *FORCED_SHAPE[1:], "bfloat16", False, "normal", mn_a, mn_b)
                for bm, bn, mc, on_a, splits, mn_a, mn_b in MN_MAJOR_FORCED]
    kernels += [heuristics.Bf16CandidateKernel(config, n, k, "float32" if mode == "c" else "bfloat16", mode == "c")
                for m, n, k, block_m, block_n, mode in CLUSTER_SPLIT_CASES
                for config in _cluster_split_configs(block_m, block_n, mode)]
    for m, n, k in TRANSPOSED_SHAPES:
        for mn_a, mn_b in ((False, True), (True, True), (True, False)):
            config = heuristics.get_bf16_gemm_config(m, n, k, num_sms, mn_major_b=mn_b)
            kernels.append(heuristics.Bf16CandidateKernel(config, n, k, "bfloat16", False, "normal", mn_a, mn_b))
        kernels.append(heuristics.Bf16CandidateKernel(heuristics.get_bf16_gemm_config(m, n, k, num_sms), n, k,
                                                      "bfloat16", False))
    grouped = [(bf16_gemm.CONTIGUOUS, sum(-(-size // 128) * 128 for size in s), n, k, len(s))
               for s, n, k in CONTIGUOUS_CASES + [WRONG_EXPERT_CASE]]
    grouped += [(bf16_gemm.MASKED, expected_m, n, k, len(masked)) for masked, _, expected_m, n, k in MASKED_CASES]
    kernels += [heuristics.Bf16CandidateKernel(heuristics.get_grouped_bf16_gemm_config(t, m, n, k, g, num_sms), n, k,
                                               "bfloat16", False, t) for t, m, n, k, g in grouped]
    return kernels


@pytest.fixture(scope="module")
def built_kernels():
    import os

    from deep_kernels.jit.precompile import precompile

    kernels = _gpu_test_kernels(deep_kernels.get_num_sms())
    precompile([bf16_gemm.FP8_GEMM.spec(*kernel.template_args()) for kernel in kernels], jobs=os.cpu_count(),
               progress=False)

def _run(a, b, out_dtype=torch.bfloat16, config=None) -> torch.Tensor:
    d = poison_(torch.empty((a.shape[0], b.shape[0]), device="cuda", dtype=out_dtype))
    return bf16_gemm._launch_dense(a, b, d, None, config)


def _dense_shapes():
    # Decode (split-K), one and two math warpgroups, large M, odd M, a partial last N block (576), one 16-column N
    # block (1040), K not a multiple of 64 (zero-filled last K block) and the longest K.
    shapes = [(1, 2112, 7168), (64, 7168, 2048), (128, 4096, 7168), (4096, 7168, 2048), (4001, 24576, 1536),
              (129, 576, 7168), (777, 7168, 16384), (3, 1040, 528)]
    if FULL:
        shapes += [(8192, 4096, 7168), (4096, 32768, 512), (1000, 2112, 7168)]
    return shapes


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
@pytest.mark.parametrize("m,n,k", _dense_shapes())
def test_matches_reference(m, n, k):
    a, b = _inputs(m, n, k)
    d = _run(a, b)
    _assert_close(d, _reference(a, b))
    assert_bitwise_equal(_run(a, b), d, "d (second run)")


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
def test_one_row_views_of_wider_rows():
    # With one row the row stride is never stepped over: no alignment is asked of it (TMA's included).
    a, b = _inputs(1, 2112, 7168)
    d = one_row_of_wider_rows(torch.empty((1, 2112), device="cuda", dtype=torch.bfloat16), 4, poisoned=True)
    deep_kernels.bf16_gemm_nt(one_row_of_wider_rows(a, 4), b, d)
    _assert_close(d, _reference(a, b))


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
@pytest.mark.parametrize("block_m,block_n,multicast,on_a,splits", FORCED_CONFIGS)
def test_forced_tiles_match_reference(block_m, block_n, multicast, on_a, splits):
    # Tile heights and widths (past FP8's 192), multicast of either operand and split-K, whatever the model picks.
    m, n, k = FORCED_SHAPE
    a, b = _inputs(m, n, k)
    config = heuristics.make_config(block_m, block_n, multicast, on_a, num_splits=splits)
    _assert_close(_run(a, b, config=config), _reference(a, b))


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
@pytest.mark.parametrize("m,n,k,block_m,block_n,mode", CLUSTER_SPLIT_CASES)
def test_splits_in_cluster_match_reference_and_the_workspace_split(m, n, k, block_m, block_n, mode):
    # The leader adds the other split's partial sums in split order, as the workspace split's last job does: the same
    # bits.
    a, b = _inputs(m, n, k)
    c = torch.randn((m, n), device="cuda") if mode == "c" else None
    results = []
    for config in _cluster_split_configs(block_m, block_n, mode):
        d = poison_(torch.empty((m, n), device="cuda", dtype=torch.float32 if c is not None else torch.bfloat16))
        results.append(bf16_gemm._launch_dense(a, b, d, c, config))
    _assert_close(results[1], _reference(a, b, c))
    assert_bitwise_equal(results[1], results[0], "d (splits in a cluster against the workspace split)")


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
@pytest.mark.parametrize("m,n,k,mode", ACCUMULATION_CASES)
def test_fp32_output_and_accumulation(m, n, k, mode):
    a, b = _inputs(m, n, k)
    product = _reference(a, b)
    if mode == "fp32":
        _assert_close(_run(a, b, torch.float32), product)
        return
    c = accumulator_like(product)
    d = c.clone() if mode == "c_is_d" else poison_(torch.empty((m, n), device="cuda"))
    deep_kernels.bf16_gemm_nt(a, b, d, c=d if mode == "c_is_d" else c)
    _assert_close(d, product + c.double())


def _row_major_transposed(t: torch.Tensor) -> torch.Tensor:
    """t [R, K] as a row-major [K, R] tensor whose rows are padded to 16 bytes (R need not be a multiple of 8)."""
    padded = torch.empty((t.shape[1], -(-t.shape[0] // 8) * 8), device=t.device, dtype=t.dtype)
    return padded[:, :t.shape[0]].copy_(t.t())


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
@pytest.mark.parametrize("m,n,k", TRANSPOSED_SHAPES)
def test_transposed_forms_match_reference(m, n, k):
    # NN (B N-major), TN (both MN-major: the weight gradient's layout) and TT (A M-major), read transposed by wgmma;
    # M not a multiple of 64 (partial boxes) and K not a multiple of 64 (zero-filled K rows).
    a, b = _inputs(m, n, k)
    expected = _reference(a, b)
    a_t, b_t = _row_major_transposed(a), _row_major_transposed(b)
    for call, args in ((deep_kernels.bf16_gemm_nn, (a, b_t)), (deep_kernels.bf16_gemm_tn, (a_t, b_t)),
                       (deep_kernels.bf16_gemm_tt, (a_t, b))):
        d = poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
        _assert_close(call(*args, d), expected)
    # The K-major views are the NT call itself.
    d = poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
    assert_bitwise_equal(deep_kernels.bf16_gemm_nn(a, b.t(), d), _run(a, b), "bf16_gemm_nn of a K-major view")


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
@pytest.mark.parametrize("block_m,block_n,multicast,on_a,splits,mn_major_a,mn_major_b", MN_MAJOR_FORCED)
def test_mn_major_forced_tiles_match_reference(block_m, block_n, multicast, on_a, splits, mn_major_a, mn_major_b):
    m, n, k = FORCED_SHAPE
    a, b = _inputs(m, n, k)
    a_arg = _row_major_transposed(a).t() if mn_major_a else a
    b_arg = _row_major_transposed(b).t() if mn_major_b else b
    config = heuristics.make_config(block_m, block_n, multicast, on_a, num_splits=splits)
    _assert_close(_run(a_arg, b_arg, config=config), _reference(a, b))


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
def test_check_rejects_a_wrong_k_block():
    m, n, k = 300, 1040, 512
    a, b = _inputs(m, n, k)
    expected = _reference(a, b)
    _assert_close(_run(a, b), expected)
    planted = _run(a, _planted_k_block(b))
    assert torch.isfinite(planted).all()
    with pytest.raises(AssertionError, match="calc_diff"):
        _assert_close(planted, expected)


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
def test_empty_m_limited_sms_and_graph_replay():
    a, b = _inputs(0, 2112, 7168)
    d = torch.empty((0, 2112), device="cuda", dtype=torch.bfloat16)
    assert deep_kernels.bf16_gemm_nt(a, b, d) is d
    m, n, k = 1000, 2112, 7168
    a, b = _inputs(m, n, k)
    previous = deep_kernels.get_num_sms()
    deep_kernels.set_num_sms(60)
    try:
        _assert_close(_run(a, b), _reference(a, b))
    finally:
        deep_kernels.set_num_sms(previous)
    # A decode shape (split-K workspace) captured after one eager call, replayed with new activations.
    a, b = _inputs(64, 2112, 7168)
    d = torch.empty((64, 2112), device="cuda", dtype=torch.bfloat16)
    deep_kernels.bf16_gemm_nt(a, b, d)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.bf16_gemm_nt(a, b, d)
    a.copy_(gemm_activations(64, 7168, seed=7))
    poison_(d)
    graph.replay()
    _assert_close(d, _reference(a, b))


# ---- grouped kernels (GPU) ----

def _contiguous_inputs(sizes, n, k, seed=0):
    m_indices, _ = contiguous_layout(sizes)
    a = gemm_activations(m_indices.numel(), k, seed=seed)
    b = gemm_weights(n, k, seed=seed + 1, num_groups=len(sizes))
    return a, b, m_indices


def _check_grouped_rows(d, expected, written):
    """Rows the kernel writes against the reference; the rest still poisoned (NaN)."""
    _assert_close(d[written], expected[written])
    assert torch.isnan(d[~written].float()).all(), "a row the kernel must not write was written"


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
@pytest.mark.parametrize("sizes,n,k", CONTIGUOUS_CASES)
def test_contiguous_matches_reference(sizes, n, k):
    a, b, m_indices = _contiguous_inputs(sizes, n, k)
    d = poison_(torch.empty((a.shape[0], n), device="cuda", dtype=torch.bfloat16))
    deep_kernels.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices)
    expected = reference.m_grouped_bf16_gemm_nt_contiguous(a, b, torch.zeros_like(d, dtype=torch.float64), m_indices)
    _check_grouped_rows(d, expected, m_indices >= 0)
    again = poison_(torch.empty_like(d))
    assert_bitwise_equal(deep_kernels.m_grouped_bf16_gemm_nt_contiguous(a, b, again, m_indices), d, "d (second run)")


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
def test_contiguous_check_rejects_a_row_of_the_wrong_expert():
    sizes, n, k = WRONG_EXPERT_CASE
    a, b, m_indices = _contiguous_inputs(sizes, n, k)
    expected = reference.m_grouped_bf16_gemm_nt_contiguous(
        a, b, torch.zeros((a.shape[0], n), device="cuda", dtype=torch.float64), m_indices)
    wrong = m_indices.clone()
    wrong[5] = 1  # row 5 is expert 0's
    d = poison_(torch.empty((a.shape[0], n), device="cuda", dtype=torch.bfloat16))
    deep_kernels.m_grouped_bf16_gemm_nt_contiguous(a, b, d, wrong)
    # The kernel skips a row whose expert is not its block's (left poisoned) or computes it with the wrong expert.
    with pytest.raises(AssertionError, match="differ in being NaN|calc_diff"):
        _check_grouped_rows(d, expected, m_indices >= 0)


@pytest.mark.gpu
@pytest.mark.usefixtures("built_kernels")
@pytest.mark.parametrize("masked,m_max,expected_m,n,k", MASKED_CASES)
def test_masked_matches_reference_and_replays(masked, m_max, expected_m, n, k):
    num_groups = len(masked)
    a = gemm_activations(num_groups * m_max, k).view(num_groups, m_max, k)
    b = gemm_weights(n, k, seed=1, num_groups=num_groups)
    masked_m = torch.tensor(masked, dtype=torch.int32, device="cuda")
    d = poison_(torch.empty((num_groups, m_max, n), device="cuda", dtype=torch.bfloat16))
    deep_kernels.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)
    written = torch.arange(m_max, device="cuda")[None, :] < masked_m[:, None]

    def check():
        expected = reference.m_grouped_bf16_gemm_nt_masked(a, b, torch.zeros_like(d, dtype=torch.float64), masked_m,
                                                           expected_m)
        _check_grouped_rows(d.flatten(0, 1), expected.flatten(0, 1), written.flatten())

    check()
    # Captured once, replayed with other masked_m and activations.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)
    masked_m.copy_(masked_m.flip(0))
    written = torch.arange(m_max, device="cuda")[None, :] < masked_m[:, None]
    a.copy_(gemm_activations(num_groups * m_max, k, seed=5).view(num_groups, m_max, k))
    poison_(d)
    graph.replay()
    check()


def test_benchmark_suite_is_registered():
    from deep_kernels.benchmarks import bf16_gemm as suite
    from deep_kernels.benchmarks import suites

    assert "bf16_gemm" in suites() and callable(suite.run)
