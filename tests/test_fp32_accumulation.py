"""FP32 accumulation into C, exact where the arithmetic is: fp8_gemm_nt under both recipes, fp8_fp4_gemm_nt (MXFP4,
NVFP4 and prepared weights), bf16_gemm_nt and the k-grouped FP8 and BF16 GEMMs, with C separate from D and with C as
D.

The operands hold -1, 0 and 1 with unit scales, so every product, every 128-deep block sum of the tensor cores and
every FP32 partial sum is an integer of at most K; C holds multiples of 2^-10 below 2^8 in magnitude. Every sum of
these, in any order, is then exact in FP32 (at most 24 significant bits), so each kind must return fl32(C + A B^T)
bit for bit. A C dropped, added twice, or read at less than FP32 precision changes nearly every element, where
calc_diff against testing.gemm.FP32_BOUND sees a C read as bf16 (about 7e-7 on random inputs) at 3 to 3.5 times the
bound only. CPU: that the expected bits are those of any order of FP32 additions, and that such planted bugs change
them. GPU: every kind against them.
"""

import pytest
import torch

import deep_kernels
from deep_kernels.testing import assert_bitwise_equal, poison_

SCALE_BLOCK = 128


def _unit_operand(rows: int, k: int, dtype, generator: torch.Generator, device: str) -> torch.Tensor:
    """[rows, k] of -1, 0 and 1 (exact in e4m3 and bf16)."""
    return torch.randint(-1, 2, (rows, k), generator=generator, device=device).float().to(dtype)


def _fine_c(shape: tuple, generator: torch.Generator, device: str) -> torch.Tensor:
    """FP32 multiples of 2^-10 below 2^8 in magnitude: bits down to 2^-10, which bf16 (8 significant bits) drops."""
    whole = torch.randint(-255, 256, shape, generator=generator, device=device)
    return (whole + torch.randint(0, 1024, shape, generator=generator, device=device) / 1024).float()


# The e2m1 codes of -1, 0 and 1.
E2M1_CODES = (0b1010, 0b0000, 0b0010)


def _unit_fp4_weights(n: int, k: int, generator: torch.Generator, device: str) -> tuple:
    """(codes [n, k / 2] float4_e2m1fn_x2, their values [n, k]): -1, 0 and 1, each byte's two codes equal (so no
    packing order is assumed)."""
    values = torch.randint(-1, 2, (n, k // 2), generator=generator, device=device)
    nibbles = torch.tensor(E2M1_CODES, device=device)[values + 1]
    codes = (nibbles | nibbles << 4).to(torch.uint8).view(torch.float4_e2m1fn_x2)
    return codes, values.repeat_interleave(2, dim=1).float()


def _exact_sum(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fl32(C + A B^T) for [.., M, K] a and [.., N, K] b: the float64 sum is exact, so one rounding to FP32."""
    return (c.double() + a.double() @ b.double().transpose(-1, -2)).float()


def _problem(m: int, n: int, k: int, dtype, device: str = "cuda", seed: int = 0) -> tuple:
    generator = torch.Generator(device=device).manual_seed(seed)
    a, b = (_unit_operand(rows, k, dtype, generator, device) for rows in (m, n))
    return a, b, _fine_c((m, n), generator, device)


# ---- the arithmetic (CPU) ----

def test_any_order_of_fp32_additions_gives_the_expected_bits():
    a, b, c = _problem(64, 96, 7168, torch.float8_e4m3fn, device="cpu")
    expected = _exact_sum(c, a, b)
    blocks = [(a[:, i:i + SCALE_BLOCK].float() @ b[:, i:i + SCALE_BLOCK].float().T)
              for i in range(0, a.shape[1], SCALE_BLOCK)]
    assert all(torch.equal(block, block.round()) and block.abs().max() <= SCALE_BLOCK for block in blocks)
    promoted = torch.zeros_like(c)  # blocks promoted into FP32 registers, then added to C (the TMA reduce-add)
    for block in blocks:
        promoted += block
    assert_bitwise_equal(c + promoted, expected, "C + promoted blocks")
    seeded = c.clone()  # C first, then each block (an accumulator seeded from C)
    for block in reversed(blocks):
        seeded += block
    assert_bitwise_equal(seeded, expected, "C seeded, blocks in reverse")
    splits = [sum(blocks[i::3]) for i in range(3)]  # split-K partial sums, then their sum
    assert_bitwise_equal(c + (splits[0] + splits[1] + splits[2]), expected, "split-K sums")


def test_unit_fp4_codes_decode_to_their_values():
    from deep_kernels.reference.quant import mxfp4_cast_back

    codes, values = _unit_fp4_weights(8, 256, torch.Generator().manual_seed(0), "cpu")
    scales = torch.full((8, 256 // 32), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)  # 2^0
    assert torch.equal(mxfp4_cast_back(codes, scales, torch.float32), values)
    assert set(values.unique().tolist()) == {-1.0, 0.0, 1.0}


@pytest.mark.parametrize("bug", ["C read as bf16", "C dropped", "C added twice", "C read as fp16"])
def test_planted_accumulation_bugs_change_nearly_every_element(bug):
    a, b, c = _problem(64, 96, 2048, torch.bfloat16, device="cpu")
    product = (a.double() @ b.double().T).float()
    wrong = {"C read as bf16": c.bfloat16().float() + product, "C dropped": product,
             "C added twice": c + c + product, "C read as fp16": c.half().float() + product}[bug]
    assert (wrong != _exact_sum(c, a, b)).float().mean() > 0.9


# ---- every FP32-accumulating kind (GPU) ----

def _ones(*shape) -> torch.Tensor:
    return torch.ones(shape, device="cuda")


def _accumulate(call, c: torch.Tensor, in_place: bool) -> torch.Tensor:
    """call(d, c) with C separate from a poisoned D, or with C as D; returns D."""
    if in_place:
        d = c.clone()
        return call(d, d)
    return call(poison_(torch.empty_like(c)), c)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [(1, 128, 128), (1, 1, 128)])
@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (256, 1536, 1024), (1024, 4096, 2048)])
@pytest.mark.parametrize("in_place", [False, True])
def test_fp8_gemm_accumulates_c_exactly(recipe, m, n, k, in_place):
    a, b, c = _problem(m, n, k, torch.float8_e4m3fn)
    sfb = _ones(-(-n // 128), k // 128) if recipe == (1, 128, 128) else _ones(n, k // 128)
    call = lambda d, c: deep_kernels.fp8_gemm_nt((a, _ones(m, k // 128)), (b, sfb), d, c=c, recipe=recipe)
    assert_bitwise_equal(_accumulate(call, c, in_place), _exact_sum(c, a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["mxfp4", "nvfp4", "mxfp4_prepared"])
@pytest.mark.parametrize("m", [16, 128, 256])  # the decode kernels (A and B swapped), and prefill
@pytest.mark.parametrize("in_place", [False, True])
def test_fp8_fp4_gemm_accumulates_c_exactly(weights, m, in_place):
    n, k = 2048, 7168
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = _unit_operand(m, k, torch.float8_e4m3fn, generator, "cuda")
    codes, b = _unit_fp4_weights(n, k, generator, "cuda")
    c = _fine_c((m, n), generator, "cuda")
    if weights == "nvfp4":  # E4M3 group scales and a global scale of 1
        scales = torch.full((n, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        operand_b = (codes, scales, torch.ones(1, device="cuda"))
    else:  # UE8M0 scales of 2^0
        operand_b = (codes, torch.full((n, k // 32), 127, dtype=torch.uint8, device="cuda").view(torch.float8_e8m0fnu))
        if weights == "mxfp4_prepared":
            operand_b = deep_kernels.prepare_fp4_weights(*operand_b)
    call = lambda d, c: deep_kernels.fp8_fp4_gemm_nt((a, _ones(m, k // 128)), operand_b, d, c=c)
    assert_bitwise_equal(_accumulate(call, c, in_place), _exact_sum(c, a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (256, 1536, 1024), (1024, 4096, 2048)])
@pytest.mark.parametrize("n_major_b", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_bf16_gemm_accumulates_c_exactly(m, n, k, n_major_b, in_place):
    a, b, c = _problem(m, n, k, torch.bfloat16)
    operand_b = b.t().contiguous().t() if n_major_b else b
    call = lambda d, c: deep_kernels.bf16_gemm_nt(a, operand_b, d, c=c)
    assert_bitwise_equal(_accumulate(call, c, in_place), _exact_sum(c, a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_k_grouped_gemms_accumulate_c_exactly(bf16, in_place):
    # Group 1 is empty: its D is C.
    ks, m, n = [256, 0, 384, 1024], 256, 512
    generator = torch.Generator(device="cuda").manual_seed(0)
    dtype = torch.bfloat16 if bf16 else torch.float8_e4m3fn
    a, b = (_unit_operand(rows, sum(ks), dtype, generator, "cuda") for rows in (m, n))
    c = _fine_c((len(ks), m, n), generator, "cuda")
    ks_tensor = torch.tensor(ks, dtype=torch.int32, device="cuda")
    starts = [sum(ks[:g]) for g in range(len(ks))]
    expected = torch.stack([_exact_sum(c[g], a[:, s:s + kg], b[:, s:s + kg]) for g, (s, kg) in
                            enumerate(zip(starts, ks))])
    if bf16:  # the tn layout's operands as nt transposes (M- and N-major)
        a_in, b_in = a.t().contiguous().t(), b.t().contiguous().t()
        call = lambda d, c: deep_kernels.k_grouped_bf16_gemm_nt_contiguous(a_in, b_in, d, ks, ks_tensor, c=c)
    else:
        scales = [_ones(rows, sum(ks) // 128) for rows in (m, n)]
        call = lambda d, c: deep_kernels.k_grouped_fp8_gemm_nt_contiguous((a, scales[0]), (b, scales[1]), d, ks,
                                                                          ks_tensor, c=c)
    assert_bitwise_equal(_accumulate(call, c, in_place), expected)
