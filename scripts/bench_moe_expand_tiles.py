"""Tuning harness: moe_expand's launch tiles timed on the moe_expand suite's DeepSeek-V3 routing (H = 7168,
E = 256, k = 8, contiguous layout): bf16 rows, FP8 rows alone and FP8 rows with their FP32 MN-major scales, at
16384 and 4096 tokens.

The API runs one tile (deep_kernels.moe.expand.EXPAND_TILE); the candidates live here and are neither
precompiled nor tested by the suite (this script compiles them first). Each tile runs through moe_expand's own
call path with the tile given (expand._expand); its output is checked bitwise against the reference. Prints
us, GB/s (the suite's byte count: each routed token row read once, every row up to num_rows written) and the
fraction of the copy bandwidth measured in the same run; the API's tile is timed again last, to show the noise.
ODD_TILES (partial last chunks, one token lane, the most threads) check the kernel's general paths:
`--tile` them to run their bitwise checks.

Usage (on the GPU machine, well under a minute):
    python scripts/bench_moe_expand_tiles.py [--tokens 16384 4096] [--reps 30]
        [--tile column_threads=64,token_lanes=4,vectors=7,scale_loads=8 ...]   (default: TILE_CANDIDATES)
"""

import argparse
import inspect
import time

import torch

import deep_kernels
from deep_kernels.benchmarks.moe_expand import HIDDEN, NUM_EXPERTS, SCALE_COLUMNS, TOP_K, _expand_bytes, routed_layout
from deep_kernels.device import info
from deep_kernels.jit.precompile import precompile
from deep_kernels.moe import expand
from deep_kernels.moe.expand import EXPAND_TILE, ExpandTile
from deep_kernels.reference import moe as reference
from deep_kernels.testing import assert_bitwise_equal, random_activations
from deep_kernels.testing.bench import L2Flusher, copy_bandwidth_gbps, time_kernel_us

# Chunks that divide 448 or 896 vectors exactly, more token lanes, more loads in flight, scale loads batched.
TILE_CANDIDATES = (
    EXPAND_TILE, ExpandTile(128, 2, 4, 4), ExpandTile(128, 2, 4, 8), ExpandTile(128, 4, 4, 4), ExpandTile(64, 4, 7),
    ExpandTile(64, 4, 7, 8), ExpandTile(64, 8, 7, 4), ExpandTile(32, 8, 14, 8), ExpandTile(128, 2, 7),
    ExpandTile(128, 4, 7, 4),
)
ODD_TILES = (ExpandTile(32, 8, 2, 3), ExpandTile(224, 1, 2), ExpandTile(32, 32, 1, 16))
_TILE_LIMITS = {"column_threads": (32, 1024), "token_lanes": (1, 32), "vectors": (1, 16), "scale_loads": (1, 16)}


def parse_tile(text: str, base: ExpandTile = EXPAND_TILE) -> ExpandTile:
    """The tile of "column_threads=64,token_lanes=4,vectors=7,scale_loads=8"; the fields not given are base's.
    column_threads whole warps, at most 1024 threads a block."""
    fields = {}
    for item in text.split(","):
        key, _, value = item.strip().partition("=")
        if key not in _TILE_LIMITS or not value.strip().isdigit():
            raise ValueError(f"expected key=integer items with keys {', '.join(_TILE_LIMITS)}, got {item!r}")
        low, high = _TILE_LIMITS[key]
        if not low <= int(value) <= high:
            raise ValueError(f"{key} must be in [{low}, {high}], got {value.strip()}")
        fields[key] = int(value)
    tile = base._replace(**fields)
    if tile.column_threads % 32 != 0 or tile.threads > 1024:
        raise ValueError(f"column_threads must be a multiple of 32 and column_threads * token_lanes at most 1024, "
                         f"got {tile.column_threads} * {tile.token_lanes}")
    return tile


def expand_with(tile: ExpandTile, *args, **kwargs):
    """deep_kernels.moe_expand(*args, **kwargs) by the kernel of `tile`."""
    bound = inspect.signature(deep_kernels.moe_expand).bind(*args, **kwargs)
    bound.apply_defaults()
    return expand._expand(tile, *bound.args)


def _label(tile) -> str:
    """column_threads x token_lanes x vectors, then the scale loads: 128x2x4 s1."""
    return f"{tile.column_threads}x{tile.token_lanes}x{tile.vectors} s{tile.scale_loads}"


def _written(result, num_rows: int) -> tuple:
    """The outputs' rows the kernel writes (rows from num_rows on are never written)."""
    return tuple(t[:num_rows] for t in (result if isinstance(result, tuple) else (result,)))


def _time_tiles(name: str, args: tuple, num_bytes: int, num_rows: int, tiles: list, flusher, copy_gbps: float,
                reps: int) -> None:
    """Each tile's output checked bitwise against the reference's (so against the default tile's too) and
    timed; tiles[0], the default, timed again last."""
    expected = _written(reference.moe_expand(*args), num_rows)
    print(f"  {name}: {num_bytes / 1e9:.3f} GB")
    default_us = None
    for i, tile in enumerate(tiles + tiles[:1]):
        call = lambda tile=tile: expand_with(tile, *args)
        for j, (actual, wanted) in enumerate(zip(_written(call(), num_rows), expected)):
            assert_bitwise_equal(actual, wanted, f"{name} output {j}, tile {_label(tile)}")
        us = time_kernel_us(call, flusher, reps=reps)
        default_us = default_us or us
        gbps = num_bytes / us / 1e3
        print(f"    {_label(tile):16s} chunk {tile.chunk_vectors:4d}  {us:8.1f} us  {gbps:7.0f} GB/s  "
              f"{gbps / copy_gbps:6.1%} of copy  x{default_us / us:5.3f}{' (again)' if i == len(tiles) else ''}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[16384, 4096])
    parser.add_argument("--tile", nargs="+", default=None, help="tiles as column_threads=64,token_lanes=4,...")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    start = time.time()
    tiles = [parse_tile(text) for text in args.tile] if args.tile else list(TILE_CANDIDATES)
    tiles = [EXPAND_TILE] + [t for t in dict.fromkeys(tiles) if t != EXPAND_TILE]
    precompile([expand._expand_spec(TOP_K, tile) for tile in tiles], progress=False)
    # bf16 rows have no scales: tiles differing only in scale_loads run the same code, so bf16 times the first.
    row_tiles = {}
    for tile in tiles:
        row_tiles.setdefault(tile._replace(scale_loads=1), tile)

    flusher = L2Flusher(info().l2_bytes)
    copy_gbps = copy_bandwidth_gbps(flusher)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_gbps:.0f} GB/s ({time.time() - start:.0f} s "
          "with the compiles)")
    bias = torch.randn(NUM_EXPERTS, device="cuda") * 0.1
    for num_tokens in args.tokens:
        _, layout, num_rows, _, tokens_read = routed_layout(num_tokens, bias)
        x = random_activations(num_tokens, HIDDEN, torch.bfloat16)
        q, scales = deep_kernels.per_token_cast_to_fp8(x, 128)
        print(f"T = {num_tokens}, H = {HIDDEN}, E = {NUM_EXPERTS}, k = {TOP_K}: {num_rows} rows, "
              f"{tokens_read} tokens read")
        _time_tiles("bf16", (x, layout), _expand_bytes(tokens_read, num_rows, 2), num_rows, list(row_tiles.values()),
                    flusher, copy_gbps, args.reps)
        # The FP8 rows' bytes alone, as bf16 pairs (moe_expand takes FP8 only with its scales).
        _time_tiles("fp8 rows only", (q.view(torch.bfloat16), layout), _expand_bytes(tokens_read, num_rows, 1), num_rows,
                    list(row_tiles.values()), flusher, copy_gbps, args.reps)
        _time_tiles("fp8 + fp32 mn_major scales", (q, layout, scales),
                    _expand_bytes(tokens_read, num_rows, 1, SCALE_COLUMNS * 4), num_rows, tiles, flusher, copy_gbps,
                    args.reps)
    print(f"took {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
