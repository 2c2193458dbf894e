"""prepare_fp4_weights (deep_kernels.fp4_weights) and fp8_fp4_gemm_nt with prepared weights.

CPU: the prepared layout, decoded here as its docstring states (independently of the module's code: each thread's
code words and scale word read at their documented offsets, nibbles and sign bits placed back, table shift and
promotion scale applied), gives the dequantized weights exactly wherever the expansion is exact; the 128 x 128 block
check accepts and refuses the cases it should; bad input raises before any launch.
GPU: the decode kernel on prepared weights against the float64 product of the dequantized operands (outputs
poisoned, deep_kernels.testing.gemm.assert_gemm_close), bitwise equal to the same kernel on the unprepared weights
(the same numerics), tiles past N and split-K included; FP32 accumulation in place; determinism; the prefill
expansion (block-scaled and per row) exact against the dequantized weights, and the prefill GEMM on it; planted
bugs (one wrong table offset, one code word's nibbles out of order) that the same checks reject.
"""

import pytest
import torch

import deep_kernels
from deep_kernels import fp4_gemm, fp4_weights
from deep_kernels.heuristics import fp8_fp4_swap_ab as swap_ab
from deep_kernels.reference import fp4_gemm as reference
from deep_kernels.testing import assert_bitwise_equal, poison_
from deep_kernels.testing.fp4_gemm import make_fp4_gemm_inputs, mxfp4_weights
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close
from dataclasses import replace

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _decode_prepared(prepared: torch.Tensor, tile_scaled: bool = False) -> torch.Tensor:
    """float64 [ceil(N / 64) * 64, K] of the prepared layout as the module docstring states it, one chunk element at a time (in
    vectorized form): the e4m3 value e2m1 * 2^(6 - shift) (exact for shift <= 14) times 2^(e_max - 133) (tile_scaled:
    the tile-scaled words' shifts and E)."""
    tiles, k_blocks, _ = prepared.shape
    out = torch.empty(tiles * 64, k_blocks * 128, dtype=torch.float64)
    data = prepared.cpu().long()
    magnitude_values = torch.tensor(E2M1, dtype=torch.float64)
    for w in range(4):
        for h in range(2):
            for g in range(8):
                row = 16 * w + 8 * h + g
                word = data[:, :, 4096 + 4 * (2 * (8 * w + g) + h):][:, :, :4]  # [tile, K block, byte s]
                e_max = sum((word[..., s] & 3) << (2 * s) for s in range(4))
                shift = word >> 3
                if tile_scaled:
                    word = sum(word[..., i] << (8 * i) for i in range(4))
                    e_max = (word & 0xF) + ((word >> 12) & 0xF) * 16 + 6
                    pairs = ((word >> 4) & 0x3F, (word >> 20) & 0x3F)
                    shift = torch.stack([pairs[s // 2] // 8 if s % 2 == 0 else pairs[s // 2] % 8 for s in range(4)], -1)
                for q in range(4):
                    thread = 32 * w + 4 * g + q
                    for s in range(4):
                        offset = 2048 * h + 16 * thread + 4 * s
                        code_word = sum(data[:, :, offset + i] << (8 * i) for i in range(4))
                        nibbles = [(code_word >> (4 * j)) & 0xF for j in range(8)]
                        for i in range(4):
                            for half, magnitude, sign in ((0, nibbles[i] & 7, nibbles[2 * i + 1] >> 3),
                                                          (1, nibbles[4 + i] & 7, nibbles[2 * i] >> 3)):
                                value = magnitude_values[magnitude] * (1 - 2 * sign.double())
                                value = value * torch.exp2(6 - shift[..., s].double()) * torch.exp2(e_max.double() - 133)
                                column = 32 * s + 16 * half + 4 * q + i
                                out.view(tiles, 64, k_blocks, 128)[:, row, :, column] = value
    return out


@pytest.mark.parametrize("n,k", [(64, 128), (80, 256), (200, 512)])
def test_prepared_layout_decodes_to_the_weights(n, k):
    codes, scales = mxfp4_weights(n, k, device="cpu", max_shift=14)
    prepared = deep_kernels.prepare_fp4_weights(codes, scales)
    assert prepared.data.shape == (-(-n // 64), k // 128, 4352) and prepared.data.dtype == torch.uint8
    assert (prepared.n, prepared.k) == (n, k)
    decoded = _decode_prepared(prepared.data)
    assert torch.equal(decoded[:n], reference.dequantize_mxfp4(codes, scales))
    assert not decoded[n:].any()


def test_decoding_catches_a_wrong_layout():
    codes, scales = mxfp4_weights(64, 128, device="cpu", max_shift=14)
    prepared = deep_kernels.prepare_fp4_weights(codes, scales).data
    expected = reference.dequantize_mxfp4(codes, scales)
    wrong_shift = prepared.clone()
    wrong_shift[0, 0, 4096 + 5] += 8  # one sub-block's table one shift further
    swapped = prepared.clone()
    swapped[0, 0, 16:32] = prepared[0, 0, 32:48]
    swapped[0, 0, 32:48] = prepared[0, 0, 16:32]  # two threads' code words exchanged
    for wrong in (wrong_shift, swapped):
        assert not torch.equal(_decode_prepared(wrong), expected)


def _folding_weights(n: int, k: int, spread: int, device="cpu", seed: int = 3) -> tuple:
    """Uniform random codes; every scale exponent in 127 - spread .. 127, the spread reached in every 128-row
    block."""
    generator = torch.Generator(device=device).manual_seed(seed)
    codes = torch.randint(0, 256, (n, k // 2), generator=generator, device=device, dtype=torch.uint8)
    exponents = torch.randint(127 - spread, 128, (n, k // 32), generator=generator, device=device)
    exponents[::128, 0], exponents[1::128, 0] = 127, 127 - spread
    return codes, exponents.to(torch.uint8)


def test_tile_scaled_layout_decodes_to_the_weights():
    codes, scales = _folding_weights(200, 512, 7)
    prepared = deep_kernels.prepare_fp4_weights(codes, scales)
    assert prepared.tile_scaled and prepared.folds_into_blocks
    decoded = _decode_prepared(prepared.data, tile_scaled=True)
    assert torch.equal(decoded[:200], reference.dequantize_mxfp4(codes, scales))
    # every row's word holds its tile's exponent E (127 here) as E - 6 in bits 0-3 and 12-15
    words = prepared.data[..., 4096:].contiguous().view(torch.int32).long()
    assert ((words & 0xF) + ((words >> 12) & 0xF) * 16 == 121).all()
    assert not (words & 0xFC0F0C00).any()
    assert not deep_kernels.prepare_fp4_weights(*mxfp4_weights(200, 512, device="cpu", max_shift=7)).tile_scaled


def test_tile_check_takes_64_row_tiles():
    codes, scales = _folding_weights(256, 256, 5)
    scales[64:128] -= 5  # each 64-row tile spans 5 exponents, each 128-row block 10
    assert fp4_weights.folds_into_tiles(codes, scales) and not fp4_weights.folds_into_blocks(codes, scales, 128, 7)
    prepared = deep_kernels.prepare_fp4_weights(codes, scales)
    assert prepared.tile_scaled and prepared.folds_into_blocks
    assert torch.equal(_decode_prepared(prepared.data, tile_scaled=True), reference.dequantize_mxfp4(codes, scales))
    spread = scales.clone()
    spread[30, 2] = 127 - 8  # 2^8 below its tile's largest, with nonzero codes
    assert not fp4_weights.folds_into_tiles(codes, spread)
    codes[30, 32:48] = 0x88  # ... only zeros (of either sign): the shift is clamped, the tile still folds
    assert fp4_weights.folds_into_tiles(codes, spread)
    assert torch.equal(_decode_prepared(deep_kernels.prepare_fp4_weights(codes, spread).data, tile_scaled=True),
                       reference.dequantize_mxfp4(codes, spread))
    tiny = (scales.int() - 121).clamp(min=0).to(torch.uint8)
    assert not fp4_weights.folds_into_tiles(codes, tiny)  # E = 6: 2^(E - 133) would be subnormal
    nan = scales.clone()
    nan[3, 3] = 255
    assert not fp4_weights.folds_into_tiles(codes, nan)


def test_block_check_accepts_exact_blocks_only():
    codes, scales = _folding_weights(200, 512, 14)
    assert fp4_weights.folds_into_blocks(codes, scales)
    codes, scales = _folding_weights(200, 512, 15)
    assert not fp4_weights.folds_into_blocks(codes, scales)
    # the one sub-block 2^15 below holds only zeros (of either sign): exact again
    codes, scales = _folding_weights(200, 512, 14)
    scales[130, 5] = 127 - 15
    assert not fp4_weights.folds_into_blocks(codes, scales)
    codes[130, 80:96] = 0x88
    assert fp4_weights.folds_into_blocks(codes, scales)
    scales[7, 3] = 255
    assert not fp4_weights.folds_into_blocks(codes, scales)
    assert not deep_kernels.prepare_fp4_weights(*mxfp4_weights(256, 512, device="cpu")).folds_into_blocks


@pytest.mark.parametrize("codes,scales,error,match", [
    (torch.zeros(64, 64, dtype=torch.int8), torch.zeros(64, 4, dtype=torch.uint8), TypeError, "codes must be"),
    (torch.zeros(64, 64, dtype=torch.uint8), torch.zeros(64, 4, dtype=torch.float32), TypeError, "scales must be"),
    (torch.zeros(64, 48, dtype=torch.uint8), torch.zeros(64, 3, dtype=torch.uint8), ValueError, "multiple of 128"),
    (torch.zeros(64, 64, dtype=torch.uint8), torch.zeros(64, 2, dtype=torch.uint8), ValueError, r"\[N, K / 32\]"),
    (torch.zeros(0, 64, dtype=torch.uint8), torch.zeros(0, 4, dtype=torch.uint8), ValueError, "codes must be"),
])
def test_prepare_rejects_bad_input(codes, scales, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.prepare_fp4_weights(codes, scales)


def _cpu_call(m=8, n=256, k=256):
    a = (torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128))
    codes = torch.zeros(n, k // 2, dtype=torch.uint8)
    scales = torch.full((n, k // 32), 127, dtype=torch.uint8)
    return a, deep_kernels.prepare_fp4_weights(codes, scales), torch.empty(m, n, dtype=torch.bfloat16)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, p, d: (a, replace(p, data=p.data[:, :1]), d), ValueError,
     r"N = 256, K = 256 must be contiguous of shape \(4, 2, 4352\)"),
    (lambda a, p, d: (a, replace(p, data=p.data[:3]), d), ValueError, r"\(4, 2, 4352\) .*, got shape \(3, 2, 4352\)"),
    (lambda a, p, d: (a, replace(p, data=p.data.view(torch.int8)), d), TypeError, "data must be a uint8"),
    (lambda a, p, d: (a, replace(p, k=384), d), ValueError, "K = 256 columns but the prepared weights K = 384"),
    (lambda a, p, d: (a, p, d[:, :128]), ValueError, "d must be a contiguous"),
    (lambda a, p, d: (a, replace(p, n=200), d[:, :200]), ValueError, "multiple of 16"),
    (lambda a, p, d: (a[0], p, d), TypeError, "pair"),
    (lambda a, p, d: (a, p, d), ValueError, "must be a CUDA tensor"),
])
def test_gemm_rejects_bad_prepared_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.fp8_fp4_gemm_nt(*mutate(*_cpu_call()))


# ---- GPU ----

def _run(a, b, n, config=None) -> torch.Tensor:
    d = poison_(torch.empty((a[0].shape[0], n), device="cuda", dtype=torch.bfloat16))
    return fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, d)


def _reference(a, b, c=None) -> torch.Tensor:
    m, n = a[0].shape[0], b[0].shape[0]
    return reference.fp8_fp4_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64), c=c)


@pytest.mark.gpu
# (m, n, k, tokens a tile, math warpgroups, splits, CTAs an SM); None: the model's pick
@pytest.mark.parametrize("m,n,k,config", [
    (1, 2112, 7168, None), (16, 24576, 1536, None), (64, 7168, 2048, None), (128, 4096, 7168, None),
    (13, 1040, 1024, (16, 2, 3, 1)), (100, 1040, 1024, (128, 1, 2, 1)), (5, 2112, 7168, (16, 1, 8, 2)),
    (32, 32768, 512, (32, 1, 1, 1)), (64, 4096, 7168, (64, 2, 56, 1)), (20, 176, 512, (32, 2, 4, 1)),
    (5, 2112, 7168, (16, 1, 4, 4)), (40, 1040, 1024, (64, 1, 2, 3)), (17, 4096, 1536, (32, 1, 3, 3)),
    (90, 4096, 1024, (96, 1, 2, 2)),
])
def test_prepared_matches_reference_and_the_unprepared_kernel(m, n, k, config):
    a, b = make_fp4_gemm_inputs(m, n, k)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    kwargs = {}
    if config is not None:
        block_t, warpgroups, splits, ctas = config
        kwargs["config"] = swap_ab.make_config(block_t, warpgroups, num_splits=splits, ctas_per_sm=ctas)
    actual = _run(a, prepared, n, **kwargs)
    assert_gemm_close(actual, _reference(a, b))
    # The unprepared kernel of the same config (the pick's without the pipelined promotion, which only prepared
    # weights run: the same sums in the same order).
    plan = kwargs.get("config") or swap_ab.get_config(m, n, k, _num_sms(), prepared=True)
    assert_bitwise_equal(actual, _run(a, b, n, config=replace(plan, pipelined=False)))


def _num_sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.gpu
# (m, n, k, tokens a tile, math warpgroups, splits, CTAs an SM): splits of one, two and three K blocks (the pipelined
# loop's first block, its last, and both at once), a second warpgroup's tile past N, two to four CTAs an SM, one
# math warpgroup of 128 tokens; row- and tile-scaled weights
@pytest.mark.parametrize("m,n,k,config", [
    (13, 1040, 1024, (16, 2, 8, 1)), (16, 2112, 768, (16, 2, 3, 1)), (5, 2112, 7168, (16, 1, 8, 2)),
    (32, 4096, 1536, (32, 1, 3, 3)), (5, 2112, 1536, (16, 1, 4, 4)), (20, 176, 512, (32, 2, 2, 1)),
    (64, 7168, 2048, (64, 2, 2, 1)), (50, 1040, 2048, (64, 1, 5, 1)), (90, 4096, 1024, (96, 2, 1, 1)),
    (128, 2112, 1536, (128, 1, 4, 1)),
])
@pytest.mark.parametrize("tile_scaled", [False, True])
def test_pipelined_promotion_is_bitwise_the_plain_loop(m, n, k, config, tile_scaled):
    a = make_fp4_gemm_inputs(m, 16, k)[0]
    b = _folding_weights(n, k, 7, "cuda") if tile_scaled else make_fp4_gemm_inputs(16, n, k)[1]
    prepared = deep_kernels.prepare_fp4_weights(*b)
    assert prepared.tile_scaled == tile_scaled
    block_t, warpgroups, splits, ctas = config
    pipelined = swap_ab.make_config(block_t, warpgroups, num_splits=splits, ctas_per_sm=ctas, pipelined=True)
    actual = _run(a, prepared, n, config=pipelined)
    assert_gemm_close(actual, _reference(a, b))
    assert_bitwise_equal(actual, _run(a, prepared, n, config=replace(pipelined, pipelined=False)))
    assert_bitwise_equal(_run(a, prepared, n, config=pipelined), actual, "second run")


@pytest.mark.gpu
# (m, n, k, tokens a tile, math warpgroups, splits, CTAs an SM, pipelined): two to eight splits in one cluster, some of
# one K block, a second warpgroup's tile past N, one to four CTAs an SM
@pytest.mark.parametrize("m,n,k,config", [
    (1, 2112, 7168, (16, 1, 8, 2, False)), (16, 7168, 2048, (16, 2, 2, 1, True)), (64, 4096, 1024, (64, 2, 8, 1, True)),
    (20, 176, 384, (32, 2, 3, 1, False)), (5, 2112, 1536, (16, 1, 4, 4, False)), (128, 1040, 512, (128, 1, 4, 1, False)),
    (100, 2112, 1024, (128, 2, 2, 1, False)),
])
@pytest.mark.parametrize("prepared", [True, False])
def test_splits_in_a_cluster_are_bitwise_the_workspace_split(m, n, k, config, prepared):
    a, b = make_fp4_gemm_inputs(m, n, k)
    weights = deep_kernels.prepare_fp4_weights(*b) if prepared else b
    block_t, warpgroups, splits, ctas, pipelined = config
    clustered = swap_ab.make_config(block_t, warpgroups, num_splits=splits, ctas_per_sm=ctas,
                                    pipelined=pipelined and prepared, splits_in_cluster=True)
    actual = _run(a, weights, n, config=clustered)
    assert_gemm_close(actual, _reference(a, b))
    assert_bitwise_equal(actual, _run(a, weights, n, config=replace(clustered, splits_in_cluster=False)))
    c = accumulator_like(_reference(a, b))
    d = c.clone()
    fp4_gemm.fp8_fp4_gemm_nt_with_config(clustered, a, weights, d, c=d)
    assert_gemm_close(d, _reference(a, b, c))


def test_splits_in_a_cluster_are_checked():
    assert swap_ab.make_config(16, 2, num_splits=8, splits_in_cluster=True).splits_in_cluster
    for splits in (1, 9):
        with pytest.raises(ValueError, match="splits in a cluster"):
            swap_ab.make_config(16, 2, num_splits=splits, splits_in_cluster=True)
    config = swap_ab.make_config(16, 2, num_splits=2, splits_in_cluster=True)
    for splits in (1, 9):  # a config made by replace (as with_splits_in_cluster makes them) is checked too
        with pytest.raises(ValueError, match="splits in a cluster"):
            replace(config, num_splits=splits)
    assert swap_ab.template_args(config, "bfloat16", False, prepared=True)[-1] == "2"
    with pytest.raises(ValueError, match="no split-K"):
        swap_ab.template_args(config, "bfloat16", False, prepared=True, masked=True)
    assert fp4_gemm.FP8_FP4_SWAP_AB_GEMM.cluster_size(fp4_gemm.swap_ab_kernel_spec(config, torch.bfloat16, False)) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("max_shift", [14, 24, 40])
def test_prepared_sub_block_shifts(max_shift):
    a, b = make_fp4_gemm_inputs(64, 2048, 2048, max_shift=max_shift)
    actual = _run(a, deep_kernels.prepare_fp4_weights(*b), 2048)
    assert_gemm_close(actual, _reference(a, b))
    assert_bitwise_equal(actual, _run(a, b, 2048))


@pytest.mark.gpu
# (m, n, k, exponent spread); the tile-scaled kernel against the float64 product and, bitwise, the unprepared kernel
@pytest.mark.parametrize("m,n,k,spread,config", [
    (1, 2112, 7168, 7, None), (16, 24576, 1536, 3, None), (64, 7168, 2048, 7, None), (128, 4096, 7168, 5, None),
    (40, 1040, 1024, 7, None), (20, 176, 512, 7, (32, 2, 4, 1)),  # the last CTA's second warpgroup past N
])
def test_tile_scaled_matches_reference_and_the_unprepared_kernel(m, n, k, spread, config):
    a = make_fp4_gemm_inputs(m, 16, k)[0]
    b = _folding_weights(n, k, spread, "cuda")
    prepared = deep_kernels.prepare_fp4_weights(*b)
    assert prepared.tile_scaled
    if config is None:
        config = swap_ab.get_config(m, n, k, _num_sms(), prepared=True)
    else:
        block_t, warpgroups, splits, ctas = config
        config = swap_ab.make_config(block_t, warpgroups, num_splits=splits, ctas_per_sm=ctas)
    actual = _run(a, prepared, n, config=config)
    assert_gemm_close(actual, _reference(a, b))
    assert_bitwise_equal(actual, _run(a, b, n, config=replace(config, pipelined=False)))


def with_undocumented_word_bits(data: torch.Tensor) -> torch.Tensor:
    """Tile-scaled prepared data with every scale word bit that the layout leaves zero set (bits 10-11, 16-19 and
    26-31: 0xFC0F0C00, the module docstring)."""
    data = data.clone()
    words = data[..., 4096:].unflatten(-1, (-1, 4))
    words[..., 1] |= 0x0C
    words[..., 2] |= 0x0F
    words[..., 3] |= 0xFC
    return data


@pytest.mark.gpu
# (m, n, k, tokens a tile, math warpgroups, splits, CTAs an SM): a two-warpgroup CTA's second tile past N, four CTAs
# an SM, the model's pick; and prefill (the expansion kernel reads the same words)
@pytest.mark.parametrize("m,n,k,config", [
    (20, 176, 512, (32, 2, 4, 1)), (5, 2112, 1536, (16, 1, 4, 4)), (64, 7168, 2048, None), (4096, 1040, 1024, None),
])
def test_tile_scaled_kernels_read_only_the_words_documented_bits(m, n, k, config):
    # The pair tables' offsets are masked to their span: a word that is not a tile-scaled one (a stale chunk past
    # N, row-scaled data flagged tile-scaled) must not address shared memory past the tables.
    a = make_fp4_gemm_inputs(m, 16, k)[0]
    b = _folding_weights(n, k, 7, "cuda")
    prepared = deep_kernels.prepare_fp4_weights(*b)
    assert prepared.tile_scaled
    kwargs = {}
    if config is not None:
        block_t, warpgroups, splits, ctas = config
        kwargs["config"] = swap_ab.make_config(block_t, warpgroups, num_splits=splits, ctas_per_sm=ctas)
    expected = _run(a, prepared, n, **kwargs)
    assert_gemm_close(expected, _reference(a, b))
    dirty = replace(prepared, data=with_undocumented_word_bits(prepared.data))
    assert not torch.equal(dirty.data, prepared.data)
    actual = _run(a, dirty, n, **kwargs)
    torch.cuda.synchronize()
    assert_bitwise_equal(actual, expected)


@pytest.mark.gpu
def test_prepared_accumulates_in_place_and_is_deterministic():
    a, b = make_fp4_gemm_inputs(64, 2112, 1536)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    config = swap_ab.make_config(64, 2, num_splits=3)
    c = accumulator_like(_reference(a, b))
    expected = _reference(a, b, c)
    d = poison_(torch.empty(64, 2112, device="cuda"))
    assert_gemm_close(fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, prepared, d, c=c), expected)
    d = c.clone()
    assert_gemm_close(fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, prepared, d, c=d), expected)
    first = _run(a, prepared, 2112)
    assert_bitwise_equal(_run(a, prepared, 2112), first)


@pytest.mark.gpu
@pytest.mark.parametrize("spread", [14, 5, None])  # folds into 128 x 128 blocks (5: tile-scaled too); does not
def test_prefill_expansion_is_exact(spread):
    n, k = 1040, 1024
    b = _folding_weights(n, k, spread, "cuda") if spread else mxfp4_weights(n, k, max_shift=14)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    assert prepared.folds_into_blocks == (spread is not None) and prepared.tile_scaled == (spread == 5)
    q, scales = fp4_gemm._expanded_prepared_weights(prepared)
    if prepared.folds_into_blocks:
        assert scales.shape == (9, 8)
        per_element = scales.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    else:
        per_element = scales.repeat_interleave(128, 1)
    assert torch.equal(q.double() * per_element.double(), reference.dequantize_mxfp4(*b))


@pytest.mark.gpu
@pytest.mark.parametrize("spread", [14, 5, None])
def test_prepared_weights_past_the_decode_sizes(spread):
    m, n, k = 4096, 1040, 1024
    a = make_fp4_gemm_inputs(m, 16, k)[0]
    b = _folding_weights(n, k, spread, "cuda") if spread else mxfp4_weights(n, k)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    assert prepared.folds_into_blocks == (spread is not None) and prepared.tile_scaled == (spread == 5)
    expected = _reference(a, b)
    actual = _run(a, prepared, n)
    assert_gemm_close(actual, expected)
    assert_bitwise_equal(_run(a, prepared, n), actual)
    wrong = prepared.data.clone()
    # Sub-block 1 of tile 9's rows one shift further, every K block: byte 1 of a row-scaled word (8 a shift); a
    # tile-scaled word's d_1, bits 4-6 (spread 5 leaves it below 7, so the add does not carry into d_0).
    if prepared.tile_scaled:
        wrong[9, :, 4096::4] += 16
    else:
        wrong[9, :, 4096 + 1::4] += 8
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, replace(prepared, data=wrong), n), expected)


@pytest.mark.gpu
def test_prepared_check_rejects_planted_bugs():
    a, b = make_fp4_gemm_inputs(64, 1024, 1024)
    expected = _reference(a, b)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    assert_gemm_close(_run(a, prepared, 1024), expected)
    wrong_shift = prepared.data.clone()
    wrong_shift[5, :, 4096 + 4 * 37 + 2] += 8  # row 362's third sub-block one shift further, every K block
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, replace(prepared, data=wrong_shift), 1024), expected)
    swapped = prepared.data.clone()
    word = swapped[9, :, 1000:1004].clone()
    swapped[9, :, 1000:1004] = (word >> 4) | (word << 4)  # one code word's nibbles exchanged in pairs, every K block
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, replace(prepared, data=swapped), 1024), expected)


def test_prepared_smem_bytes_is_the_kernels_carve_up(tmp_path):
    # nvcc checks that the host's shared memory is the traits' kSmemBytes for the kernel on prepared weights (and the
    # masked layout's A box its kMaskedABoxRows).
    from deep_kernels.jit import compiler

    configs = [swap_ab.make_config(t, w) for t in swap_ab.BLOCK_TS for w in (1, 2)]
    configs += [swap_ab.make_config(t, 1, ctas_per_sm=c) for t in (16, 32, 64) for c in (2, 3)]
    configs += [swap_ab.make_config(t, 1, ctas_per_sm=4) for t in (16, 32)]
    configs += [swap_ab.make_config(t, 1, ctas_per_sm=2) for t in (80, 96)]
    checks = [f"static_assert(deep_kernels::sm90_fp8_fp4_swap_ab_detail::Sm90Fp8Fp4SwapAbTraits<"
              f"{', '.join(swap_ab.template_args(c, 'bfloat16', False, prepared=True))}>::kSmemBytes == "
              f"{c.smem_bytes});" for c in configs]
    tile_configs = [swap_ab.for_tile_scaled(c) for c in configs]
    assert all(t.num_stages >= c.num_stages - 1 and t.smem_bytes_of(True) <= swap_ab.smem_capacity(c.ctas_per_sm)
               for c, t in zip(configs, tile_configs))
    checks += [f"static_assert(deep_kernels::sm90_fp8_fp4_swap_ab_detail::Sm90Fp8Fp4SwapAbTraits<"
               f"{', '.join(swap_ab.template_args(c, 'bfloat16', False, prepared=True, tile_scaled=True))}>::kSmemBytes"
               f" == {c.smem_bytes_of(True)});" for c in tile_configs]
    masked = [swap_ab.make_config(t, 1, ctas_per_sm=c) for t, c in ((16, 4), (32, 4), (32, 3), (64, 3), (64, 2), (80, 2))]
    masked.append(swap_ab.make_config(96, 2))
    checks += [f"static_assert(deep_kernels::sm90_fp8_fp4_swap_ab_detail::Sm90Fp8Fp4SwapAbTraits<"
               f"{', '.join(swap_ab.template_args(c, 'bfloat16', False, prepared=True, masked=True))}>::kMaskedABoxRows"
               f" == {swap_ab.masked_a_box_rows(c)});" for c in masked]
    checks.append(f"static_assert(deep_kernels::sm90_fp8_fp4_swap_ab_detail::kMaskedTokenStep == "
                  f"{swap_ab.MASKED_TOKEN_STEP});")
    checks.append(f"static_assert(deep_kernels::fp4_prepared::kTilePairTableBytes == {swap_ab.TILE_PAIR_TABLE_BYTES});")
    checks.append(f"static_assert(deep_kernels::fp4_prepared::kTileMaxShift == {fp4_weights.MAX_TILE_SHIFT});")
    checks.append(f"static_assert(deep_kernels::sm90_fp8_fp4_swap_ab_detail::kPreparedChunkBytes == "
                  f"{fp4_weights.CHUNK_BYTES});")
    checks.append(f"static_assert(deep_kernels::sm90_fp4_prepared_expand_detail::kKBlocksPerCta == "
                  f"{fp4_gemm.PREPARED_EXPAND_K_BLOCKS});")
    source = tmp_path / "prepared_smem_check.cu"
    source.write_text('#include "kernels/sm90_fp8_fp4_gemm_swap_ab.cuh"\n#include "kernels/sm90_fp4_prepared_expand.cuh"\n' +
                      "\n".join(checks) + "\n")
    command = compiler.compile_command(source, tmp_path / "prepared_smem_check.cubin", "90a")
    compiler.run_compile(command)
    source.write_text(source.read_text().replace(f"== {configs[0].smem_bytes});", f"== {configs[0].smem_bytes + 1});", 1))
    with pytest.raises(RuntimeError, match="static assertion failed"):
        compiler.run_compile(command)


def test_prepared_picks_are_legal():
    for m in (1, 16, 64, 128):
        for n, k in [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]:
            config = swap_ab.get_config(m, n, k, 132, prepared=True)
            assert config.block_t >= m and 1 <= config.num_splits <= k // 128
            assert config.smem_bytes <= swap_ab.smem_capacity(config.ctas_per_sm)
            assert swap_ab.estimate_seconds(config, m, n, k, 132, prepared=True) < swap_ab.estimate_seconds(config, m, n, k, 132)
            assert config.pipelined == (config.num_math_warpgroups == 2 and
                                        config.block_t <= swap_ab.PIPELINED_MAX_TOKENS)
            assert swap_ab.can_pipeline(config.block_t, config.num_math_warpgroups, config.ctas_per_sm) or not config.pipelined
            assert config.num_stages >= 3 or not config.pipelined
            assert config.splits_in_cluster == (config.pipelined and config.num_splits == 2)
            assert not swap_ab.get_config(m, n, k, 132).pipelined


def test_pipelined_configs_are_checked():
    assert swap_ab.make_config(16, 2, pipelined=True).num_chains == 4
    assert swap_ab.make_config(64, 2, pipelined=True).num_chains == 1
    assert swap_ab.make_config(16, 1, ctas_per_sm=4, pipelined=True).num_chains == 1
    with pytest.raises(ValueError, match="pipelined promotion of 128 tokens"):
        swap_ab.make_config(128, 2, pipelined=True)
    with pytest.raises(ValueError, match="pipelined promotion of 64 tokens"):
        swap_ab.make_config(64, 1, ctas_per_sm=2, pipelined=True)
    with pytest.raises(ValueError, match="at least 3"):
        swap_ab.make_config(16, 2, num_stages=2, pipelined=True)
    with pytest.raises(ValueError, match="accumulator chains"):
        swap_ab.make_config(32, 2, num_chains=4, pipelined=True)
    with pytest.raises(ValueError, match="prepared weights"):
        swap_ab.template_args(swap_ab.make_config(16, pipelined=True), "bfloat16", False, prepared=False)
