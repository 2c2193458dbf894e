"""Inputs and the output check of the FP8 GEMM tests (dense and grouped; the grouped_gemm benchmark takes its inputs
from testing.grouped, built on these).

Inputs make every scale choice visible: each 128 x 128 weight block has its own power-of-two magnitude 2^e,
e in [-8, 8], and each activation row its own 2^e, e in [-8, 8], times 2^f per 128-column group (f in
[-2, 2]), so using a neighbouring block's or row's scale changes the product by a factor of 2 or more.

The check (assert_gemm_close) compares D with the float64 reference of the same quantized inputs on the whole
matrix, on every 128 x 128 tile and on every row, with the error calc_diff = 1 - 2 sum(xy) / sum(x^2 + y^2)
(computed as sum((x - y)^2) / sum(x^2 + y^2), the same value without cancellation), and requires NaN and inf
at the same positions (with the same signs). Bounds:
    bf16 D: rounding to bf16 moves each value by at most 2^-8 of itself, so it alone gives at most
            (2^-8)^2 / 2 = 7.6e-6 in any region, whatever the values (1.4e-6 measured over whole matrices);
            the FP32 accumulation adds orders of magnitude less. BF16_BOUND = 1e-5.
    FP32 D: no output rounding; what is left is the tensor cores' accumulation inside each 128-deep K block
            (about 2^-14 of a block's partial sum): 1.6e-8 to 2.1e-8 over whole matrices on the H200 (the
            wgrad_gemm and k_grouped_gemm suites' FP8 rows, benchmarks/results/nvidia-h200), 1.2e-11 for BF16
            operands. FP32_BOUND = 2e-7, ten times that: a C read as bf16 gives 5.8e-7 to 7e-7 over whole matrices
            of these inputs (tests/test_fp8_gemm.py), a C dropped or doubled far more.
A wrong scale on one weight block or one activation row gives 1e-3 to 0.5 on the tiles or rows it touches.
"""

import torch

from deep_kernels.reference.quant import pack_scales, per_block_cast_to_fp8, per_token_cast_to_fp8
from deep_kernels.testing import poison_

BF16_BOUND = 1e-5
FP32_BOUND = 2e-7
TILE = 128
# While a list, assert_gemm_close appends each comparison to it as (output dtype, bound, gemm_errors()), failing
# ones too: the errors the kernels really make, to set the bounds by (tests/conftest.py, DK_GEMM_ERRORS_OUT).
recorded_errors = None
SCALE_FORMATS = ("fp32", "ue8m0")


def _generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def gemm_activations(m: int, k: int, device="cuda", seed: int = 0) -> torch.Tensor:
    """bf16 [m, k]: normal values times 2^(e + f), e per row in [-8, 8], f per row and 128 columns in [-2, 2]."""
    generator = _generator(device, seed)
    x = torch.randn((m, k), generator=generator, device=device)
    row = torch.randint(-8, 9, (m, 1), generator=generator, device=device)
    group = torch.randint(-2, 3, (m, -(-k // TILE)), generator=generator, device=device)
    exponent = (row + group).repeat_interleave(TILE, dim=1)[:, :k]
    return (x * torch.exp2(exponent.float())).bfloat16()


def gemm_weights(n: int, k: int, device="cuda", seed: int = 1, num_groups: int = None) -> torch.Tensor:
    """bf16 [n, k] (or [num_groups, n, k]): normal values times 2^e, e in [-8, 8] per 128 x 128 block."""
    generator = _generator(device, seed)
    lead = () if num_groups is None else (num_groups,)
    w = torch.randn((*lead, n, k), generator=generator, device=device)
    blocks = torch.randint(-8, 9, (*lead, -(-n // TILE), -(-k // TILE)), generator=generator, device=device)
    exponent = blocks.repeat_interleave(TILE, dim=-2)[..., :n, :].repeat_interleave(TILE, dim=-1)[..., :k]
    return (w * torch.exp2(exponent.float())).bfloat16()


def cast_activations(x: torch.Tensor, scale_format: str = "fp32") -> tuple:
    """(a e4m3, sfa): FP32 MN-major scales, or with "ue8m0" power-of-two scales packed as the GEMM reads them.
    On the GPU the package's cast (its exactness is tested elsewhere: the GEMM check uses whatever it wrote)."""
    ue8m0 = scale_format == "ue8m0"
    layout = "packed_ue8m0" if ue8m0 else "mn_major"
    if x.is_cuda:
        import deep_kernels

        return deep_kernels.per_token_cast_to_fp8(x, ue8m0=ue8m0, scale_layout=layout)
    return per_token_cast_to_fp8(x, ue8m0=ue8m0, scale_layout=layout)


def cast_weights(w: torch.Tensor, scale_format: str = "fp32") -> tuple:
    """(b e4m3 [n, k], sfb [ceil(n / 128), ceil(k / 128)] FP32, or power-of-two scales packed UE8M0 int32)."""
    ue8m0 = scale_format == "ue8m0"
    q, scales = per_block_cast_to_fp8(w, ue8m0=ue8m0)
    return q, pack_scales(scales, "packed_ue8m0").contiguous() if ue8m0 else scales


def make_gemm_inputs(m: int, n: int, k: int, scale_format: str = "fp32", device="cuda", seed: int = 0) -> tuple:
    """((a, sfa), (b, sfb)) of fp8_gemm_nt, from gemm_activations and gemm_weights. K not a multiple of 128 (but of
    16): cast at K rounded up to 128 with the columns past K zero, then cut to K, so the last scale group covers
    the K % 128 columns left."""
    padded_k = -(-k // TILE) * TILE
    x = gemm_activations(m, padded_k, device, seed)
    w = gemm_weights(n, padded_k, device, seed + 1)
    if padded_k == k:
        return cast_activations(x, scale_format), cast_weights(w, scale_format)
    x[:, k:] = 0
    w[:, k:] = 0
    (qa, sfa), (qb, sfb) = cast_activations(x, scale_format), cast_weights(w, scale_format)
    return (qa[:, :k].contiguous(), sfa), (qb[:, :k].contiguous(), sfb)


def forced_config_product(config, a: tuple, b: tuple, c: torch.Tensor = None) -> torch.Tensor:
    """fp8_gemm_nt of (a, sfa), (b, sfb) with `config` (the heuristics' FP8GemmConfig, gemm.forced_config_call):
    bf16 D into a poisoned tensor, or with c, FP32 D = c + A B^T into a copy of c."""
    from deep_kernels import gemm

    if c is None:
        d = poison_(torch.empty((a[0].shape[0], b[0].shape[0]), device=a[0].device, dtype=torch.bfloat16))
    else:
        d = c.clone()
    gemm.forced_config_call(config, a, b, d, c=d if c is not None else None)()
    return d


def untaken_override_fields(config, override: dict) -> dict:
    """The fields of a DK_FP8_GEMM_CONFIG override (gemm.parse_config_override's names) that `config` does not
    have, as {field: (asked, planned)}: gemm.apply_config_override drops what a tiling cannot take, and a test that
    forces a schedule to compare it with another compares nothing if it was dropped."""
    from deep_kernels import gemm
    from deep_kernels.heuristics.fp8_gemm import config_fields

    fields = config_fields(config)
    planned = {key: fields[gemm.OVERRIDE_FIELDS[key]] for key in override}
    return {key: (value, planned[key]) for key, value in override.items() if int(planned[key]) != int(value)}


def accumulator_like(product: torch.Tensor, seed: int = 2) -> torch.Tensor:
    """FP32 C for D = A B^T + C with each row's magnitude that of the product's row, so that a kernel that drops
    C (or adds it twice) is off by far more than the bound."""
    generator = _generator(product.device, seed)
    row_rms = product.double().pow(2).mean(dim=1, keepdim=True).sqrt()
    return (torch.randn(product.shape, generator=generator, device=product.device, dtype=torch.float64)
            * row_rms).float()


def _ratio(diff2: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """calc_diff of regions from their sums of (x - y)^2 and x^2 + y^2 (0 for regions of zeros)."""
    return torch.where(norm > 0, diff2 / norm, torch.zeros_like(norm))


def gemm_errors(actual: torch.Tensor, expected: torch.Tensor) -> dict:
    """calc_diff of actual against expected ([rows, N], finite positions only) over the whole matrix, the worst
    128 x 128 tile and the worst row: {"whole": e, "tile": (e, (row block, column block)), "row": (e, row)}."""
    x, y = actual.double(), expected.double()
    finite = torch.isfinite(x) & torch.isfinite(y)
    x, y = torch.where(finite, x, 0.0), torch.where(finite, y, 0.0)
    diff2, norm = (x - y).square(), x.square() + y.square()
    rows, cols = diff2.shape
    row_blocks, col_blocks = -(-rows // TILE), -(-cols // TILE)

    def tile_sums(t: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(t, (0, col_blocks * TILE - cols, 0, row_blocks * TILE - rows))
        return padded.view(row_blocks, TILE, col_blocks, TILE).sum(dim=(1, 3))

    tiles = _ratio(tile_sums(diff2), tile_sums(norm)).flatten()
    row_errors = _ratio(diff2.sum(dim=1), norm.sum(dim=1))
    worst_tile = int(tiles.argmax()) if tiles.numel() else 0
    worst_row = int(row_errors.argmax()) if row_errors.numel() else 0
    return {
        "whole": float(_ratio(diff2.sum(), norm.sum())),
        "tile": (float(tiles[worst_tile]) if tiles.numel() else 0.0, divmod(worst_tile, max(col_blocks, 1))),
        "row": (float(row_errors[worst_row]) if row_errors.numel() else 0.0, worst_row),
    }


def assert_gemm_close(actual: torch.Tensor, expected: torch.Tensor, bound: float = None, name: str = "d") -> dict:
    """actual (bf16 or fp32 GEMM output [rows, N]) against its float64 reference: NaN and inf at the same
    positions, calc_diff within the bound (BF16_BOUND or FP32_BOUND by actual's dtype) on the whole matrix, every
    128 x 128 tile and every row. Returns gemm_errors()."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if bound is None:
        bound = BF16_BOUND if actual.dtype == torch.bfloat16 else FP32_BOUND
    x, y = actual.double(), expected.double()
    positions = (("NaN", torch.isnan), ("+inf", lambda t: t == torch.inf), ("-inf", lambda t: t == -torch.inf))
    for what, position in positions:
        mismatch = position(x) != position(y)
        if mismatch.any():
            first = [int(i) for i in mismatch.nonzero()[0]]
            raise AssertionError(f"{name}: {int(mismatch.sum())} elements differ in being {what} from the reference, "
                                 f"first at {first}: {x[tuple(first)].item()} vs {y[tuple(first)].item()}")
    errors = gemm_errors(actual, expected)
    if recorded_errors is not None:
        recorded_errors.append((str(actual.dtype).removeprefix("torch."), bound, errors))
    assert errors["whole"] < bound, f"{name}: calc_diff {errors['whole']:.3g} >= {bound:g} over the whole matrix"
    assert errors["tile"][0] < bound, (f"{name}: calc_diff {errors['tile'][0]:.3g} >= {bound:g} on the worst "
                                       f"128 x 128 tile, (row block, column block) {errors['tile'][1]}")
    assert errors["row"][0] < bound, (f"{name}: calc_diff {errors['row'][0]:.3g} >= {bound:g} on the worst row, "
                                      f"{errors['row'][1]}")
    return errors
