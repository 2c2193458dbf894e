"""MoE expand and reduce: the references against loop formulations (CPU), input validation (CPU), and the
kernels bit-exact against the references (GPU)."""

import re

import numpy as np
import pytest
import torch

import deep_kernels
from deep_kernels.jit import cache
from deep_kernels.jit.precompile import precompile
from deep_kernels.moe import MoeLayout, contiguous_max_rows, expand
from deep_kernels.moe.expand import ExpandTile
from deep_kernels.reference import moe as reference
from deep_kernels.reference import quant as quant_reference
from deep_kernels.testing import assert_bitwise_equal, empty_like_strided, poison_, random_activations, sass

from conftest import FULL

SCALE_VARIANTS = [(False, "row_major"), (False, "mn_major"), (True, "packed_ue8m0")]


def _cpu_layout(num_tokens=29, k=3, num_experts=6, max_tokens=14, seed=0):
    generator = torch.Generator().manual_seed(seed)
    topk_idx = torch.randint(-1, num_experts, (num_tokens, k), generator=generator, dtype=torch.int32)
    return reference.moe_layout(topk_idx, num_experts, max_tokens)


def _masked_positions(layout) -> dict:
    """slot -> flattened masked row, by walking masked_slots."""
    positions = {}
    for e, slots in enumerate(layout.masked_slots.tolist()):
        for i, slot in enumerate(slots):
            if slot >= 0:
                positions[slot] = e * len(slots) + i
    return positions


# ---- the references (CPU) ----

@pytest.mark.parametrize("masked", [False, True])
def test_reference_expand_copies_each_slot_token(masked):
    layout = _cpu_layout()
    k = layout.slot_to_row.shape[1]
    x = random_activations(29, 64, torch.bfloat16, device="cpu", seed=1)
    rows = reference.moe_expand(x, layout, masked=masked).reshape(-1, 64)
    slots = (layout.masked_slots if masked else layout.row_to_slot).reshape(-1).tolist()
    assert rows.shape[0] == len(slots) and any(s < 0 for s in slots) and any(s >= 0 for s in slots)
    for r, slot in enumerate(slots):
        expected = x[slot // k] if slot >= 0 else torch.zeros(64, dtype=torch.bfloat16)
        assert torch.equal(rows[r].view(torch.int16), expected.view(torch.int16)), r


@pytest.mark.parametrize("ue8m0,scale_layout", SCALE_VARIANTS)
@pytest.mark.parametrize("masked", [False, True])
def test_reference_expand_gathers_fp8_scales(ue8m0, scale_layout, masked):
    layout = _cpu_layout()
    k = layout.slot_to_row.shape[1]
    x = random_activations(29, 384, torch.bfloat16, device="cpu", seed=2)
    q, scales = quant_reference.per_token_cast_to_fp8(x, 128, ue8m0, scale_layout)
    token_scales = quant_reference.unpack_scales(scales, 29, 3)
    rows, row_scales = reference.moe_expand(q, layout, scales, masked=masked)
    assert row_scales.dtype == (torch.int32 if ue8m0 and scale_layout == "packed_ue8m0" else torch.float32)
    num_rows = rows.numel() // 384
    if masked:
        num_experts, max_tokens = layout.masked_slots.shape
        assert row_scales.shape[:2] == (num_experts, max_tokens)
        values = torch.cat([quant_reference.unpack_scales(row_scales[e], max_tokens, 3) for e in range(num_experts)])
        slots = layout.masked_slots.reshape(-1).tolist()
    else:
        values = quant_reference.unpack_scales(row_scales, num_rows, 3)
        slots = layout.row_to_slot.tolist()
    flat = rows.reshape(num_rows, 384).view(torch.uint8)
    raw_scales = row_scales.new_empty(row_scales.shape).copy_(row_scales).reshape(num_rows, -1)
    for r, slot in enumerate(slots):
        if slot >= 0:
            assert torch.equal(flat[r], q[slot // k].view(torch.uint8)) and torch.equal(values[r], token_scales[slot // k])
        else:
            assert not flat[r].any() and not raw_scales[r].any(), r  # zero row, zero scale (word)


@pytest.mark.parametrize("ue8m0,scale_layout", SCALE_VARIANTS)
@pytest.mark.parametrize("scale_mode", ["mul", "div"])
@pytest.mark.parametrize("masked", [False, True])
def test_reference_expand_cast_is_the_per_token_cast_of_each_row(ue8m0, scale_layout, scale_mode, masked):
    layout = _cpu_layout()
    k = layout.slot_to_row.shape[1]
    x = random_activations(29, 256, torch.bfloat16, device="cpu", seed=3)
    q, scales = reference.moe_expand_cast_to_fp8(x, layout, masked=masked, ue8m0=ue8m0, scale_layout=scale_layout,
                                                 scale_mode=scale_mode)
    token_q, token_scales = quant_reference.per_token_cast_to_fp8(x, 128, ue8m0, "row_major", scale_mode=scale_mode)
    zero_q, zero_scales = quant_reference.per_token_cast_to_fp8(torch.zeros(1, 256), 128, ue8m0, "row_major")
    if masked:
        num_experts, max_tokens = layout.masked_slots.shape
        values = torch.cat([quant_reference.unpack_scales(scales[e], max_tokens, 2) for e in range(num_experts)])
        slots = layout.masked_slots.reshape(-1).tolist()
    else:
        values = quant_reference.unpack_scales(scales, q.shape[0], 2)
        slots = layout.row_to_slot.tolist()
    flat = q.reshape(-1, 256).view(torch.uint8)
    for r, slot in enumerate(slots):
        want_q, want_s = (token_q[slot // k], token_scales[slot // k]) if slot >= 0 else (zero_q[0], zero_scales[0])
        assert torch.equal(flat[r], want_q.view(torch.uint8)) and torch.equal(values[r], want_s), r


def test_reference_masked_slot_rows_invert_masked_slots():
    layout = _cpu_layout(max_tokens=2)  # some experts overflow: their late slots have no masked row
    positions = _masked_positions(layout)
    rows = reference.slot_rows(layout, masked=True).view(-1).tolist()
    assert rows == [positions.get(s, -1) for s in range(len(rows))]
    kept = layout.slot_to_row.view(-1) >= 0
    assert any(r < 0 for r, ok in zip(rows, kept.tolist()) if ok)  # overflowed slots exist


def _loop_reduce(y_rows: np.ndarray, rows: list, weights: np.ndarray) -> np.ndarray:
    """float32 numpy, one slot at a time: acc = acc + w * y (numpy never fuses the multiply-add)."""
    num_tokens, k = weights.shape
    out = np.zeros((num_tokens, y_rows.shape[1]), dtype=np.float32)
    for t in range(num_tokens):
        acc = np.zeros(y_rows.shape[1], dtype=np.float32)
        for j in range(k):
            row = rows[t * k + j]
            if row >= 0:
                acc = acc + np.float32(weights[t, j]) * y_rows[row]
        out[t] = acc
    return out


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, "fp8 mn_major", "fp8 packed_ue8m0"])
def test_reference_reduce_matches_a_loop(masked, dtype):
    layout = _cpu_layout(max_tokens=3)
    weights = torch.rand((29, 3), generator=torch.Generator().manual_seed(4))
    x = random_activations(29, 256, torch.bfloat16, device="cpu", seed=5)
    scales = None
    if isinstance(dtype, str):
        layout_name = dtype.split()[1]
        y, scales = reference.moe_expand_cast_to_fp8(x, layout, masked=masked, ue8m0=True, scale_layout=layout_name)
        groups = y.reshape(-1, 2, 128).float() * reference.expand._row_scales(scales, y.numel() // 256, 2).unsqueeze(2)
        y_rows = groups.reshape(-1, 256).numpy()
    else:
        y = reference.moe_expand(x, layout, masked=masked).to(dtype)
        y = y + torch.randn(y.shape).to(dtype)  # padding rows non-zero: they must not be read
        y_rows = y.reshape(-1, 256).float().numpy()
    if masked:
        positions = _masked_positions(layout)
        rows = [positions.get(s, -1) for s in range(29 * 3)]
    else:
        rows = layout.slot_to_row.view(-1).tolist()
    for out_dtype in (torch.bfloat16, torch.float32):
        out = reference.moe_reduce(y, layout, weights, scales, masked=masked, out_dtype=out_dtype)
        expected = torch.from_numpy(_loop_reduce(y_rows, rows, weights.numpy())).to(out_dtype)
        assert_bitwise_equal(out, expected, "out")


@pytest.mark.parametrize("num_out_rows,token_blocks,columns", [
    (163584, 8192, 2), (33024, 32, 2), (1024, 1, 2), (1, 0, 1), (4096, 0, 56), (5, 1, 3), (100000, 7, 1),
    (4001, 63, 56),
])
@pytest.mark.parametrize("num_sms", [None, 132])
@pytest.mark.parametrize("row_alignment", [1, 8, 32])
@pytest.mark.parametrize("max_share", [8, 32])
def test_padding_shares_cover_every_row_in_shares_of_at_most_32(num_out_rows, token_blocks, columns, num_sms,
                                                                row_alignment, max_share):
    # The expand kernels' blocks zero the rows without a slot in shares (csrc/common/moe_rows.cuh: PaddingRows).
    blocks, share = expand._padding_share(num_out_rows, token_blocks, columns, True, num_sms, row_alignment,
                                          max_share)
    assert blocks >= token_blocks and 1 <= share <= 32 and share % row_alignment == 0
    assert blocks * columns * share >= num_out_rows  # the shares of all blocks reach the last row
    assert (blocks - 1) * columns * share < num_out_rows or blocks == token_blocks  # no block row only past it
    if num_sms is not None:  # small layouts still spread over the SMs: shares no larger than 8 blocks per SM need
        spread_share = -(-num_out_rows // (8 * num_sms))
        assert share <= -(-spread_share // row_alignment) * row_alignment
    assert expand._padding_share(num_out_rows, token_blocks, columns, False, num_sms) == (token_blocks, 0)


def test_padding_shares_of_an_empty_layout():
    assert expand._padding_share(0, 0, 56, True) == (0, 0)
    assert expand._padding_share(0, 0, 1, False) == (0, 0)


# ---- the expand tile ----

def test_expand_tile_is_precompiled():
    assert expand.EXPAND_TILE == (128, 2, 4, 1) and expand.EXPAND_TILE.chunk_vectors == 512
    assert expand._expand_spec(8) in expand.precompile_specs()


def _global_accesses(sass_text: str) -> list:
    return re.findall(r"\b(?:LDG|STG)\.E[.\w]*", sass_text)


def test_expand_tile_sass_has_wide_accesses_with_loads_first():
    # Each thread's row loads are 16-byte LDGs issued before any 16-byte store (k = 8 rows each, and the padding
    # rows' zero store, or with bulk_zero bulk copies from shared memory; streaming: .EF, evict first), and after
    # them the scale section's first pass issues its scale_loads loads (32-bit) before its first store.
    tile = expand.EXPAND_TILE
    for bulk_zero in (False, True):
        (entry,) = precompile([expand._expand_spec(8, tile, bulk_zero)], arch="90a", progress=False)
        cubin = entry / cache.BINARY_NAME
        assert sass.kernel_problems("smxx_moe_expand", cubin) == []
        accesses = _global_accesses(sass.sass(cubin))
        row_loads = [i for i, a in enumerate(accesses) if a == "LDG.E.128"]
        row_stores = [i for i, a in enumerate(accesses) if a == "STG.E.EF.128"]
        assert len(row_loads) == tile.vectors and len(row_stores) == 8 * tile.vectors + (0 if bulk_zero else 1)
        assert ("UBLKCP.G.S" in sass.sass(cubin)) == bulk_zero
        assert row_loads[-1] < row_stores[0]
        first_scale_store = accesses.index("STG.E.EF")
        assert row_stores[-1] < first_scale_store
        assert accesses[first_scale_store - tile.scale_loads:first_scale_store] == ["LDG.E.CONSTANT"] * tile.scale_loads


def test_tile_harness_parses_tiles():
    # scripts/bench_moe_expand_tiles.py holds the candidate tiles (neither precompiled nor tested on the GPU).
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_moe_expand_tiles.py"
    module_spec = importlib.util.spec_from_file_location("bench_moe_expand_tiles", path)
    bench = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(bench)
    assert bench.TILE_CANDIDATES[0] == expand.EXPAND_TILE
    for tile in bench.TILE_CANDIDATES + bench.ODD_TILES:
        text = ",".join(f"{key}={value}" for key, value in tile._asdict().items())
        assert bench.parse_tile(text, base=ExpandTile(32, 1, 1, 16)) == tile
    assert bench.parse_tile("vectors=8") == ExpandTile(128, 2, 8, 1)
    for text, match in [("threads=64", "expected key=integer"), ("vectors=0", "vectors must be in"),
                        ("column_threads=48", "multiple of 32"), ("column_threads=512,token_lanes=4", "at most 1024")]:
        with pytest.raises(ValueError, match=match):
            bench.parse_tile(text)


# ---- validation (CPU tensors: every check that precedes the device check) ----

LAYOUT = _cpu_layout(num_tokens=8, k=2, num_experts=4, max_tokens=3)
LARGER = _cpu_layout(num_tokens=200, k=2, num_experts=4, max_tokens=3)  # 1024 rows, not 640
OTHER_T = _cpu_layout(num_tokens=9, k=2, num_experts=4, max_tokens=3)
X = torch.zeros(8, 256, dtype=torch.bfloat16)
Q = torch.zeros(8, 256, dtype=torch.float8_e4m3fn)
MN_SCALES = quant_reference.per_token_cast_to_fp8(X, 128)[1]
MAX_ROWS = contiguous_max_rows(16, 4)
# x in rows 0-7 and out in rows 4 on: the kernel would read rows it has written.
SHARED = torch.zeros(MAX_ROWS + 4, 256, dtype=torch.bfloat16)


def _mixed_layout(**fields):
    return MoeLayout(**{**LAYOUT.__dict__, **fields})


@pytest.mark.parametrize("x,kwargs,error,match", [
    (X.half(), {}, TypeError, "x must be"),
    (X[0], {}, ValueError, "x must be 2-D"),
    (torch.zeros(9, 256, dtype=torch.bfloat16), {}, ValueError, "x has 9 tokens but the layout was built for 8"),
    (torch.zeros(8, 12, dtype=torch.bfloat16), {}, ValueError, "whole 16-byte vectors"),
    (torch.zeros(256, 8, dtype=torch.bfloat16).t(), {}, ValueError, "contiguous last dimension"),
    (X, {"layout": "layout"}, TypeError, "layout must be a MoeLayout"),
    (X, {"layout": _mixed_layout(row_to_slot=LARGER.row_to_slot)}, ValueError, "layout.row_to_slot must have shape"),
    (X, {"layout": _mixed_layout(slot_to_row=LARGER.slot_to_row)}, ValueError, "layout.m_indices must have shape"),
    (X, {"layout": _mixed_layout(m_indices=LAYOUT.m_indices.long())}, TypeError, "layout.m_indices must be torch.int32"),
    (X, {"layout": _mixed_layout(masked_slots=None), "masked": True}, ValueError, "needs a layout with the masked"),
    (X, {"layout": _mixed_layout(masked_m=torch.zeros(5, dtype=torch.int32)), "masked": True}, ValueError,
     "layout.masked_m must have shape"),
    (X, {"scales": MN_SCALES}, ValueError, "scales must be given for float8_e4m3fn x, and only then"),
    (Q, {}, ValueError, "scales must be given"),
    (Q, {"scales": MN_SCALES[:4]}, ValueError, "scales must have shape"),
    (Q, {"scales": MN_SCALES.half()}, TypeError, "scales must be"),
    (Q, {"scales": torch.zeros(8, 4)[:, :2]}, ValueError, "scales must have shape \\(8, 2\\) with strides \\(2, 1\\)"),
    (torch.zeros(8, 16, dtype=torch.float8_e4m3fn), {"scales": torch.zeros(8, 1)}, ValueError, "multiple of 128"),
    (X, {"out": torch.zeros(MAX_ROWS - 1, 256, dtype=torch.bfloat16)}, ValueError, "out must be a contiguous tensor"),
    (X, {"out": torch.zeros(MAX_ROWS, 256)}, TypeError, "out must be torch.bfloat16"),
    (X, {"out": torch.zeros(4, 3, 256, dtype=torch.bfloat16)}, ValueError, "out must be a contiguous tensor of shape"),
    (X, {"out": torch.zeros(4, 3, 256, dtype=torch.bfloat16), "masked": True}, ValueError, "x must be a CUDA tensor"),
    (Q, {"scales": MN_SCALES, "out": torch.zeros(MAX_ROWS, 256, dtype=torch.float8_e4m3fn)}, TypeError,
     "out must be a pair"),
    (Q, {"scales": MN_SCALES, "out": (torch.zeros(MAX_ROWS, 256, dtype=torch.float8_e4m3fn), torch.zeros(MAX_ROWS, 2))},
     ValueError, "out\\[1\\] must have shape"),
    (Q, {"scales": MN_SCALES}, ValueError, "x must be a CUDA tensor"),
    (X, {"zero_padding": 1}, TypeError, "zero_padding must be a bool"),
    (X, {"masked": "yes"}, TypeError, "masked must be a bool"),
    (X, {"out": torch.zeros(MAX_ROWS + 8, 256, dtype=torch.bfloat16)[8:]}, ValueError, "x must be a CUDA tensor"),
    (SHARED[:8], {"out": SHARED[4:]}, ValueError, "out and the inputs must not overlap: out and x do"),
    (X, {}, ValueError, "x must be a CUDA tensor"),
])
def test_moe_expand_rejects_bad_input(x, kwargs, error, match):
    kwargs = {"layout": LAYOUT, **kwargs}
    with pytest.raises(error, match=match):
        deep_kernels.moe_expand(x, **kwargs)


@pytest.mark.parametrize("x,kwargs,error,match", [
    (Q, {}, TypeError, "x must be torch.bfloat16 or torch.float32"),
    (torch.zeros(8, 192, dtype=torch.bfloat16), {}, ValueError, "multiple of the group size 128"),
    (X, {"scale_layout": "col_major"}, ValueError, "scale_layout must be one of"),
    (X, {"scale_layout": "packed_ue8m0"}, ValueError, "needs ue8m0=True"),
    (X, {"scale_mode": "fma"}, ValueError, "scale_mode must be one of"),
    (X, {"amax_clamp": 0.0}, ValueError, "amax_clamp must be a positive finite FP32 number"),
    (X, {"layout": OTHER_T}, ValueError, "x has 8 tokens but the layout was built for 9"),
    (X, {"out": (torch.zeros(MAX_ROWS, 256, dtype=torch.float8_e4m3fn), torch.zeros(MAX_ROWS, 2))}, ValueError,
     "out\\[1\\] must have shape \\(" + str(MAX_ROWS) + ", 2\\) with strides \\(1, " + str(MAX_ROWS) + "\\)"),
    (X, {"out": (torch.zeros(MAX_ROWS, 256, dtype=torch.uint8), MN_SCALES)}, TypeError, "out\\[0\\] must be"),
    (X, {"zero_padding": None}, TypeError, "zero_padding must be a bool"),
    (X, {"masked": True}, ValueError, "x must be a CUDA tensor"),
])
def test_moe_expand_cast_rejects_bad_input(x, kwargs, error, match):
    kwargs = {"layout": LAYOUT, **kwargs}
    with pytest.raises(error, match=match):
        deep_kernels.moe_expand_cast_to_fp8(x, **kwargs)


Y = torch.zeros(MAX_ROWS, 256, dtype=torch.bfloat16)
W = torch.zeros(8, 2)


@pytest.mark.parametrize("y,kwargs,error,match", [
    (Y.half(), {}, TypeError, "y must be"),
    (Y[:-1], {}, ValueError, "y must have shape \\(" + str(MAX_ROWS) + ", 256\\)"),
    (Y, {"masked": True}, ValueError, "y must be 3-D"),
    (torch.zeros(4, 2, 256, dtype=torch.bfloat16), {"masked": True}, ValueError, "y must have shape \\(4, 3, 256\\)"),
    (torch.zeros(256, MAX_ROWS, dtype=torch.bfloat16).t(), {}, ValueError, "y must be contiguous"),
    (torch.zeros(MAX_ROWS, 4, dtype=torch.bfloat16), {}, ValueError, "whole 16-byte vectors"),
    (Y, {"weights": W.double()}, TypeError, "weights must be torch.float32"),
    (Y, {"weights": torch.zeros(8, 3)}, ValueError, "weights must be a contiguous tensor of shape \\(8, 2\\)"),
    (Y, {"weights": torch.zeros(2, 8).t()}, ValueError, "weights must be a contiguous"),
    (Y, {"out_dtype": torch.float16}, TypeError, "out_dtype must be"),
    (Y, {"scales": torch.zeros(MAX_ROWS, 2)}, ValueError, "scales must be given for float8_e4m3fn y"),
    (Y.to(torch.float8_e4m3fn), {}, ValueError, "scales must be given"),
    (Y.to(torch.float8_e4m3fn), {"scales": torch.zeros(MAX_ROWS, 3)}, ValueError, "scales must have shape"),
    (torch.zeros(4, 3, 256, dtype=torch.float8_e4m3fn), {"masked": True, "scales": torch.zeros(12, 2)}, ValueError,
     "scales must be 3-D"),
    (torch.zeros(4, 3, 256, dtype=torch.float8_e4m3fn), {"masked": True, "scales": torch.zeros(4, 3, 4)[:, :, :2]}, ValueError,
     "scales must have shape \\(4, 3, 2\\) with strides \\(6, 2, 1\\)"),
    (Y, {"layout": LARGER}, ValueError, "y must have shape"),
    (Y, {"out": torch.zeros(8, 256)}, TypeError, "out must be torch.bfloat16"),
    (Y, {"out": torch.zeros(8, 128, dtype=torch.bfloat16)}, ValueError, "out must be a contiguous tensor of shape"),
    (Y, {"out": torch.zeros(8, 256, dtype=torch.bfloat16)}, ValueError, "y must be a CUDA tensor"),
    (Y, {"out": Y[:8]}, ValueError, "out and the inputs must not overlap: out and y do"),
    (torch.zeros(4, 3, 256, dtype=torch.bfloat16), {"masked": True}, ValueError, "y must be a CUDA tensor"),
])
def test_moe_reduce_rejects_bad_input(y, kwargs, error, match):
    kwargs = {"layout": LAYOUT, "weights": W, **kwargs}
    with pytest.raises(error, match=match):
        deep_kernels.moe_reduce(y, **kwargs)


def test_masked_fp8_scales_layouts_are_recognised():
    # Every batched layout moe_expand_cast_to_fp8 writes passes moe_reduce's scale checks (up to the device).
    # With one group (H = 128) the FP32 layouts differ only in the expert stride (max_tokens 3, aligned to 4).
    for x in (X, X[:, :128]):
        for ue8m0, scale_layout in SCALE_VARIANTS:
            q, scales = reference.moe_expand_cast_to_fp8(x, LAYOUT, masked=True, ue8m0=ue8m0, scale_layout=scale_layout)
            with pytest.raises(ValueError, match="y must be a CUDA tensor"):
                deep_kernels.moe_reduce(q, LAYOUT, W, scales, masked=True)


# ---- kernels against the references (GPU) ----

# (T, E, k, H): tiny and odd token counts, few and many experts, one / six / eight slots per token.
SHAPES = [(1, 8, 1, 128), (1, 256, 8, 7168), (4001, 8, 6, 2176), (4001, 256, 8, 7168), (4001, 8, 1, 128),
          (4001, 256, 6, 2176)] + ([(16384, 256, 8, 7168), (0, 8, 2, 256)] if FULL else [])


def _routing(num_tokens: int, num_experts: int, k: int, seed: int = 0):
    """topk_gate's weights and indices (5% of slots dropped) and their layout with an overflowing masked part."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn((num_tokens, num_experts), device="cuda", generator=generator)
    logits += torch.linspace(2, 0, num_experts, device="cuda")  # skewed: some experts overflow max_tokens
    weights, indices = deep_kernels.topk_gate(logits, k, "sigmoid")
    indices[torch.rand(indices.shape, device="cuda", generator=generator) < 0.05] = -1
    max_tokens = max(1, num_tokens * k // num_experts)
    return weights, indices, deep_kernels.moe_layout(indices, num_experts, max_tokens)


def _poisoned(t):
    return poison_(empty_like_strided(t))


def _check_rows(actual, expected, layout, masked: bool, name: str) -> None:
    """Masked: every row. Contiguous: the first num_rows rows equal, the rest untouched (still poison)."""
    if masked:
        assert_bitwise_equal(actual, expected, name)
        return
    num_rows = int(layout.num_rows.item())
    assert_bitwise_equal(actual[:num_rows], expected[:num_rows], name)
    tail = actual[num_rows:]
    assert (torch.empty(tail.shape, dtype=tail.dtype, device=tail.device).copy_(tail).view(torch.uint8) == 0xFF).all(), \
        f"{name}: rows from num_rows on were written"


def _check_expand(x, layout, scales, masked):
    expected = reference.moe_expand(x, layout, scales, masked=masked)
    if scales is None:
        out = _poisoned(expected)
        assert deep_kernels.moe_expand(x, layout, masked=masked, out=out) is out
        _check_rows(out, expected, layout, masked, "rows")
        return out
    out = (_poisoned(expected[0]), _poisoned(expected[1]))
    deep_kernels.moe_expand(x, layout, scales, masked=masked, out=out)
    _check_rows(out[0], expected[0], layout, masked, "rows")
    _check_rows(out[1], expected[1], layout, masked, "scales")
    return out


def _expand_inputs(num_tokens: int, num_experts: int, k: int, hidden: int, variant: str) -> tuple:
    """(layout, x, scales) of _routing: x bf16, fp32, or FP8 with scales in the variant's layout ("fp8 mn_major")."""
    _, _, layout = _routing(num_tokens, num_experts, k)
    x = random_activations(num_tokens, hidden, torch.float32 if variant == "fp32" else torch.bfloat16)
    scales = None
    if variant.startswith("fp8"):
        scale_layout = variant.split()[1]
        x, scales = deep_kernels.per_token_cast_to_fp8(x, 128, scale_layout == "packed_ue8m0", scale_layout)
    return layout, x, scales


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,num_experts,k,hidden", SHAPES)
@pytest.mark.parametrize("variant", ["bf16", "fp32", "fp8 row_major", "fp8 mn_major", "fp8 packed_ue8m0"])
def test_moe_expand_matches_reference(num_tokens, num_experts, k, hidden, variant):
    layout, x, scales = _expand_inputs(num_tokens, num_experts, k, hidden, variant)
    for masked in (False, True):
        _check_expand(x, layout, scales, masked)
    if num_tokens > 1:  # a row stride wider than H
        wide = torch.zeros((num_tokens, hidden + 128), dtype=x.dtype, device="cuda")
        wide[:, :hidden] = x
        _check_expand(wide[:, :hidden], layout, scales, False)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,num_experts,k,hidden", SHAPES)
@pytest.mark.parametrize("ue8m0,scale_layout,scale_mode", [
    (False, "mn_major", "mul"), (False, "row_major", "div"), (True, "mn_major", "mul"), (True, "packed_ue8m0", "mul"),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_moe_expand_cast_matches_reference(num_tokens, num_experts, k, hidden, ue8m0, scale_layout, scale_mode, dtype):
    _, _, layout = _routing(num_tokens, num_experts, k)
    x = random_activations(num_tokens, hidden, dtype)
    kwargs = dict(ue8m0=ue8m0, scale_layout=scale_layout, scale_mode=scale_mode)
    for masked in (False, True):
        q_ref, scales_ref = reference.moe_expand_cast_to_fp8(x, layout, masked=masked, **kwargs)
        out = (_poisoned(q_ref), _poisoned(scales_ref))
        q, scales = deep_kernels.moe_expand_cast_to_fp8(x, layout, masked=masked, out=out, **kwargs)
        assert q is out[0] and scales is out[1]
        _check_rows(q, q_ref, layout, masked, "q")
        _check_rows(scales, scales_ref, layout, masked, "scales")
        # The definition: the reference expansion followed by the library's own per-token cast.
        if not masked:
            q_cast, scales_cast = deep_kernels.per_token_cast_to_fp8(reference.moe_expand(x, layout), 128, **kwargs)
            num_rows = int(layout.num_rows.item())
            assert_bitwise_equal(q[:num_rows], q_cast[:num_rows], "q vs per_token_cast_to_fp8")
            assert_bitwise_equal(scales[:num_rows], scales_cast[:num_rows], "scales vs per_token_cast_to_fp8")


def _dense_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t).view(torch.uint8)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["bf16", "fp8 mn_major", "fp8 packed_ue8m0", "cast mn_major", "cast packed_ue8m0"])
@pytest.mark.parametrize("masked", [False, True])
def test_expand_without_zero_padding_writes_only_rows_with_a_slot(variant, masked):
    _, _, layout = _routing(512, 256, 8)
    x = random_activations(512, 2176, torch.bfloat16)
    kind, scale_layout = (variant.split() + [None])[:2]
    ue8m0 = scale_layout == "packed_ue8m0"
    if kind == "cast":
        run = lambda **kwargs: deep_kernels.moe_expand_cast_to_fp8(x, layout, masked=masked, ue8m0=ue8m0,
                                                                   scale_layout=scale_layout, **kwargs)
        expected = reference.moe_expand_cast_to_fp8(x, layout, masked=masked, ue8m0=ue8m0, scale_layout=scale_layout)
    else:
        scales = None
        if kind == "fp8":
            x, scales = deep_kernels.per_token_cast_to_fp8(x, 128, ue8m0, scale_layout)
        run = lambda **kwargs: deep_kernels.moe_expand(x, layout, scales, masked=masked, **kwargs)
        expected = reference.moe_expand(x, layout, scales, masked=masked)
    expected = expected if isinstance(expected, tuple) else (expected,)
    out = tuple(_poisoned(t) for t in expected)
    run(zero_padding=False, out=out if len(out) == 2 else out[0])
    slots = layout.masked_slots if masked else layout.row_to_slot
    has_slot = slots >= 0
    for actual, wanted in zip(out, expected):
        actual, wanted = _dense_bytes(actual), _dense_bytes(wanted)
        assert torch.equal(actual[has_slot], wanted[has_slot])
        assert (actual[~has_slot] == 0xFF).all(), "a row without a slot was written"


def _sparse_routing(num_tokens: int, num_experts: int, k: int, max_tokens: int, seed: int = 0):
    """Distinct experts per token, experts 1 and E - 2 never chosen, every 7th token with all its slots
    dropped and 10% of the other slots dropped; the layout with its masked part."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand((num_tokens, num_experts), device="cuda", generator=generator)
    scores[:, [1, num_experts - 2]] = -1.0
    indices = scores.topk(k, dim=1).indices.int()
    indices[torch.rand(indices.shape, device="cuda", generator=generator) < 0.1] = -1
    indices[::7] = -1
    return deep_kernels.moe_layout(indices, num_experts, max_tokens)


def _check_written(actual, expected, layout, masked: bool, zero_padding: bool, name: str) -> None:
    """zero_padding: _check_rows. Without: the rows with a slot equal, every other row untouched (poison)."""
    if zero_padding:
        _check_rows(actual, expected, layout, masked, name)
        return
    has_slot = (layout.masked_slots if masked else layout.row_to_slot) >= 0
    actual, expected = _dense_bytes(actual), _dense_bytes(expected)
    assert torch.equal(actual[has_slot], expected[has_slot]), name
    assert (actual[~has_slot] == 0xFF).all(), f"{name}: a row without a slot was written"


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [4001, 0])
@pytest.mark.parametrize("zero_padding", [True, False])
def test_expand_with_empty_experts_and_fully_dropped_tokens(num_tokens, zero_padding):
    num_experts, k, hidden, max_tokens = 16, 4, 384, 800
    layout = _sparse_routing(num_tokens, num_experts, k, max_tokens)
    counts = layout.counts.tolist()
    assert counts[1] == 0 and counts[num_experts - 2] == 0
    assert num_tokens == 0 or max(counts) > max_tokens  # some experts overflow the masked layout
    x = random_activations(num_tokens, hidden, torch.bfloat16)
    inputs = [(x, None)]
    if num_tokens > 0:
        for ue8m0, scale_layout in SCALE_VARIANTS:
            inputs.append(deep_kernels.per_token_cast_to_fp8(x, 128, ue8m0, scale_layout))
    for masked in (False, True):
        for values, scales in inputs:
            expected = reference.moe_expand(values, layout, scales, masked=masked)
            expected = expected if isinstance(expected, tuple) else (expected,)
            out = tuple(_poisoned(t) for t in expected)
            deep_kernels.moe_expand(values, layout, scales, masked=masked, zero_padding=zero_padding,
                                    out=out if scales is not None else out[0])
            for i, (actual, wanted) in enumerate(zip(out, expected)):
                _check_written(actual, wanted, layout, masked, zero_padding, f"{values.dtype} output {i}")
        for ue8m0, scale_layout in SCALE_VARIANTS:
            kwargs = dict(masked=masked, ue8m0=ue8m0, scale_layout=scale_layout)
            expected = reference.moe_expand_cast_to_fp8(x, layout, **kwargs)
            out = tuple(_poisoned(t) for t in expected)
            deep_kernels.moe_expand_cast_to_fp8(x, layout, zero_padding=zero_padding, out=out, **kwargs)
            for name, actual, wanted in zip(("q", "scales"), out, expected):
                _check_written(actual, wanted, layout, masked, zero_padding, f"cast {scale_layout} {name}")


def _reduce_inputs(layout, num_tokens: int, hidden: int, variant: str, masked: bool):
    """y over every row of the layout (padding rows too, so reading one shows), with FP8 scales if asked."""
    shape = tuple(layout.masked_slots.shape) if masked else tuple(layout.row_to_slot.shape)
    rows = int(np.prod(shape))
    if not variant.startswith("fp8"):
        dtype = torch.float32 if variant == "fp32" else torch.bfloat16
        return random_activations(rows, hidden, dtype).view(*shape, hidden), None
    scale_layout = variant.split()[1]
    x = random_activations(num_tokens, hidden, torch.bfloat16)
    q, scales = reference.moe_expand_cast_to_fp8(x, layout, masked=masked, ue8m0=scale_layout == "packed_ue8m0",
                                                 scale_layout=scale_layout)
    # The cast leaves padding rows zero: random finite codes at unit scale instead, so reading one shows.
    padding = (layout.masked_slots if masked else layout.row_to_slot) < 0
    codes = q.view(torch.uint8)
    codes[padding] = torch.randint(0, 0x7F, codes[padding].shape, dtype=torch.uint8, device=codes.device)
    scales[padding] = 0x7F7F7F7F if scale_layout == "packed_ue8m0" else 1.0
    return q, scales


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,num_experts,k,hidden", SHAPES)
@pytest.mark.parametrize("variant", ["bf16", "fp32", "fp8 row_major", "fp8 mn_major", "fp8 packed_ue8m0"])
@pytest.mark.parametrize("masked", [False, True])
def test_moe_reduce_matches_reference(num_tokens, num_experts, k, hidden, variant, masked):
    weights, _, layout = _routing(num_tokens, num_experts, k)
    y, scales = _reduce_inputs(layout, num_tokens, hidden, variant, masked)
    for out_dtype in (torch.bfloat16, torch.float32):
        expected = reference.moe_reduce(y, layout, weights, scales, masked=masked, out_dtype=out_dtype)
        out = _poisoned(expected)
        assert deep_kernels.moe_reduce(y, layout, weights, scales, masked=masked, out_dtype=out_dtype, out=out) is out
        assert_bitwise_equal(out, expected, "out")
        again = deep_kernels.moe_reduce(y, layout, weights, scales, masked=masked, out_dtype=out_dtype)
        assert_bitwise_equal(again, out, "second run")  # deterministic


@pytest.mark.gpu
def test_moe_expand_and_reduce_are_deterministic():
    weights, _, layout = _routing(4001, 256, 8)
    x = random_activations(4001, 7168, torch.bfloat16)
    first = deep_kernels.moe_expand(x, layout)
    second = deep_kernels.moe_expand(x, layout)
    num_rows = int(layout.num_rows.item())
    assert_bitwise_equal(first[:num_rows], second[:num_rows], "expand")
    q1, s1 = deep_kernels.moe_expand_cast_to_fp8(x, layout, masked=True, ue8m0=True, scale_layout="packed_ue8m0")
    q2, s2 = deep_kernels.moe_expand_cast_to_fp8(x, layout, masked=True, ue8m0=True, scale_layout="packed_ue8m0")
    assert_bitwise_equal(q1, q2, "q")
    assert_bitwise_equal(s1, s2, "scales")
    y, _ = _reduce_inputs(layout, 4001, 7168, "bf16", masked=False)
    reduced = [poison_(torch.empty((4001, 7168), device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    for out in reduced:
        deep_kernels.moe_reduce(y, layout, weights, out=out)
    assert not torch.isnan(reduced[0]).any()
    assert_bitwise_equal(reduced[0], reduced[1], "reduce")


@pytest.mark.gpu
def test_every_slot_dropped_gives_zero_rows_and_tokens():
    indices = torch.full((64, 8), -1, dtype=torch.int32, device="cuda")
    layout = deep_kernels.moe_layout(indices, 256, max_tokens=4)
    x = random_activations(64, 256, torch.bfloat16)
    # Outputs poisoned first: the zeros must be written.
    rows = poison_(torch.empty((256, 4, 256), dtype=torch.bfloat16, device="cuda"))
    deep_kernels.moe_expand(x, layout, masked=True, out=rows)
    assert not rows.view(torch.int16).any()
    weights = torch.rand((64, 8), device="cuda")
    out = poison_(torch.empty((64, 256), dtype=torch.bfloat16, device="cuda"))
    deep_kernels.moe_reduce(torch.randn((256, 4, 256), device="cuda").bfloat16(), layout, weights, masked=True, out=out)
    assert not out.view(torch.int16).any()
    assert deep_kernels.moe_expand(x, layout).shape == (contiguous_max_rows(512, 256), 256)


@pytest.mark.gpu
def test_expand_cast_reduce_graph_capture_and_replay_with_new_routing():
    num_tokens, num_experts, k, hidden, max_tokens = 512, 256, 8, 7168, 64
    logits = torch.randn((num_tokens, num_experts), device="cuda")
    x = random_activations(num_tokens, hidden, torch.bfloat16)
    weights, indices, _ = _routing(num_tokens, num_experts, k)
    static = dict(logits=logits, x=x)
    # Outputs sized from the worst case, allocated before capture.
    shapes_layout = deep_kernels.moe_layout(indices, num_experts, max_tokens)
    rows = torch.empty((contiguous_max_rows(num_tokens * k, num_experts), hidden), dtype=torch.bfloat16, device="cuda")
    q_ref, scales_ref = reference.moe_expand_cast_to_fp8(x, shapes_layout, masked=True)
    q, scales = empty_like_strided(q_ref), empty_like_strided(scales_ref)
    combined = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device="cuda")
    deep_kernels.moe_expand(x, shapes_layout, out=rows)  # compile and load outside the capture
    deep_kernels.moe_expand_cast_to_fp8(x, shapes_layout, masked=True, out=(q, scales))
    deep_kernels.moe_reduce(rows, shapes_layout, weights, out=combined)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gate_weights, gate_indices = deep_kernels.topk_gate(static["logits"], k, "sigmoid")
        layout = deep_kernels.moe_layout(gate_indices, num_experts, max_tokens)
        deep_kernels.moe_expand(static["x"], layout, out=rows)
        deep_kernels.moe_expand_cast_to_fp8(static["x"], layout, masked=True, out=(q, scales))
        deep_kernels.moe_reduce(rows, layout, gate_weights, out=combined)
    for seed in range(2):  # each replay routes new logits
        static["logits"].copy_(torch.randn((num_tokens, num_experts), device="cuda") + seed)
        static["x"].copy_(random_activations(num_tokens, hidden, torch.bfloat16))
        for t in (rows, q, scales, combined):
            poison_(t)
        graph.replay()
        torch.cuda.synchronize()
        expected_weights, expected_indices = reference.topk_gate(static["logits"], k, "sigmoid")
        assert_bitwise_equal(gate_indices, expected_indices, "gate indices")
        assert_bitwise_equal(gate_weights, expected_weights, "gate weights")
        expected_layout = reference.moe_layout(expected_indices, num_experts, max_tokens)
        for name in ("num_rows", "row_to_slot", "slot_to_row", "masked_slots"):
            assert_bitwise_equal(getattr(layout, name), getattr(expected_layout, name), name)
        expected_rows = reference.moe_expand(static["x"], layout)
        _check_rows(rows, expected_rows, layout, False, "rows")
        expected_q, expected_scales = reference.moe_expand_cast_to_fp8(static["x"], layout, masked=True)
        assert_bitwise_equal(q, expected_q, "q")
        assert_bitwise_equal(scales, expected_scales, "scales")
        # Rows from num_rows on are poison in `rows` and never referenced by a slot.
        expected = reference.moe_reduce(expected_rows, layout, gate_weights)
        assert_bitwise_equal(combined, expected, "combined")


def test_benchmark_suite_is_registered():
    from deep_kernels.benchmarks import moe_expand as suite
    from deep_kernels.benchmarks import suites

    assert "moe_expand" in suites() and callable(suite.run)
    assert suite._expand_bytes(3, 5, 2) == 8 * 7168 * 2  # 3 rows read, 5 written
