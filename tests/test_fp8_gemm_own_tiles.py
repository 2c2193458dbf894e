"""The FP8 GEMM's own-tile ping-pong (MathSchedule::OwnTilePingPong): each of the two math warpgroups owns whole
BLOCK_M-row tiles, consecutive tiles of a CTA alternating between them, and the warpgroups take turns at the tensor
cores tile by tile.

CPU: the heuristics' side (configs, shared memory, template arguments, candidates, the config override). GPU: the
kernel against the float64 reference with poisoned outputs (deep_kernels.testing.gemm.assert_gemm_close), bitwise
against the lockstep kernel of the same per-warpgroup arithmetic (a 2 x BLOCK_M-row lockstep tile: each warpgroup
promotes the same 64-row partial sums in the same order) and against a second run, a planted bug the check must
reject, and CUDA-graph replay. The cases cover one and two K blocks per tile, K with a 32-column tail, partial M and N
tiles, tiles straddling sfb blocks, both multicast operands (with an odd M-block count: pair members without a tile),
CTAs with one tile (the second warpgroup idle) and accumulation into FP32 D.
"""

import pytest
import torch

import deep_kernels
from deep_kernels import gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import assert_bitwise_equal, calc_diff, poison_
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close, cast_activations, forced_config_product, \
    gemm_activations, make_gemm_inputs

# (block_m, block_n, pipelined, multicast, multicast_on_a, accumulate, m, n, k)
OWN_TILE_CASES = [
    (64, 128, 1, 1, 0, False, 4001, 2112, 7168),  # partial last M and N tiles; 56 K blocks
    (64, 128, 1, 2, 0, False, 1024, 7168, 2048),  # multicast of B (pairs of M blocks)
    (64, 112, 1, 2, 1, True, 129, 1040, 640),     # multicast of A; straddling tiles; one tile per CTA; accumulation
    (64, 96, 1, 1, 0, False, 77, 1040, 128),      # one K block (the turn passes at the tile's first issue)
    (64, 192, 0, 2, 0, False, 4001, 7168, 2048),  # the plain K loop; multicast of B over an odd M-block count
    (128, 128, 0, 2, 1, False, 4001, 4096, 7168), # two waves per warpgroup; multicast of A
    (128, 96, 0, 1, 0, True, 777, 2112, 7200),    # two waves; a last K block of 32 columns; accumulation
]


def own_tile_config(block_m, block_n, pipelined, multicast, multicast_on_a, out_bytes=2):
    return heuristics.make_config(block_m, block_n, multicast, bool(multicast_on_a), out_bytes,
                                  pipelined=bool(pipelined), own_tiles=True)


def lockstep_twin(block_m, block_n, pipelined, multicast, multicast_on_a, out_bytes=2):
    """The lockstep config whose warpgroups run the own tile's arithmetic: 2 x block_m rows, the same columns, cluster
    and K loop."""
    return heuristics.make_config(2 * block_m, block_n, multicast, bool(multicast_on_a), out_bytes,
                                  pipelined=bool(pipelined))


# ---- heuristics (CPU) ----

def _schedule(config) -> str:
    """The MathSchedule template argument of config's kernel."""
    (schedule,) = [argument for argument in heuristics.template_args(config, 4096, 7168, "bfloat16", False)
                   if argument.startswith("deep_kernels::MathSchedule::")]
    return schedule


def test_own_tile_configs():
    config = heuristics.make_config(64, 128, 2, False, 2, own_tiles=True)
    # Two math warpgroups on 64-row tiles, pipelined where one wave's three accumulator sets fit, two staging tiles.
    assert (config.own_tiles, config.pipelined, config.num_math_warpgroups, config.num_threads) == (True, True, 2, 384)
    assert config.smem_bytes == heuristics.smem_bytes(64, 128, config.num_stages, 2, own_tiles=True)
    assert heuristics.smem_bytes(64, 128, 1, 2, own_tiles=True) - heuristics.smem_bytes(64, 128, 1, 2) == 64 * 128 * 2
    assert config.smem_bytes <= heuristics.SMEM_CAPACITY_BYTES < heuristics.smem_bytes(
        64, 128, config.num_stages + 1, 2, own_tiles=True)
    assert heuristics.config_label(config) == "64x128/1pw+b"
    assert _schedule(config) == "deep_kernels::MathSchedule::OwnTilePingPong"
    assert heuristics.template_args(config, 4096, 7168, "bfloat16", False)[7] == "256"
    assert heuristics.make_config(out_dtype_bytes=2, **heuristics.config_fields(config)) == config
    # Wider or two-wave own tiles run the plain K loop.
    assert not heuristics.make_config(64, 192, 1, False, 2, own_tiles=True).pipelined
    assert not heuristics.make_config(128, 128, 2, True, 2, own_tiles=True).pipelined
    # Lockstep configs keep their schedule.
    assert _schedule(heuristics.make_config(128, 128, 1, False, 2)) == "deep_kernels::MathSchedule::Lockstep"


@pytest.mark.parametrize("kwargs,match", [
    ({"block_m": 256, "block_n": 128}, "own-tile ping-pong needs block_m in"),
    ({"block_m": 128, "block_n": 160}, "own-tile ping-pong needs block_m in"),
    ({"block_m": 64, "block_n": 128, "num_splits": 2}, "own-tile ping-pong needs block_m in"),
    ({"block_m": 64, "block_n": 128, "operands": "fp8_channel_scaled"}, "own-tile ping-pong needs block_m in"),
    ({"block_m": 64, "block_n": 128, "overlap_epilogue": True}, "neither"),
    ({"block_m": 64, "block_n": 128, "ping_pong": True}, "neither"),
    ({"block_m": 64, "block_n": 144, "pipelined": True}, "cannot be pipelined"),
    ({"block_m": 128, "block_n": 64, "pipelined": True}, "cannot be pipelined"),
])
def test_own_tile_configs_reject_what_the_kernel_does_not_take(kwargs, match):
    with pytest.raises(ValueError, match=match):
        heuristics.make_config(num_tma_multicast=1, multicast_on_a=False, out_dtype_bytes=2, own_tiles=True, **kwargs)


def test_own_tiles_are_offered_only_where_their_cost_is_measured(monkeypatch):
    # No measured cost term: no candidate. With one: each legal lockstep tile of that height is followed by its
    # own-tile twin (a tie keeps lockstep), with the stages that fit beside two staging tiles.
    monkeypatch.setattr(heuristics, "OWN_TILE_MATH_SECONDS_PER_K_BLOCK", {})
    assert not any(c.own_tiles for c in heuristics.candidate_configs(4096, 7168, 132, k=16384))
    monkeypatch.setattr(heuristics, "OWN_TILE_MATH_SECONDS_PER_K_BLOCK", {64: (0.1e-6, 0.002e-6)})
    candidates = list(heuristics.candidate_configs(4096, 7168, 132, k=16384))
    own = [c for c in candidates if c.own_tiles]
    assert own and all(c.block_m == 64 and c.num_splits == 1 and not c.overlap_epilogue for c in own)
    for c in own:
        twin = candidates[candidates.index(c) - 1]
        assert (twin.block_m, twin.block_n, twin.num_tma_multicast, twin.multicast_on_a, twin.own_tiles) == (
            c.block_m, c.block_n, c.num_tma_multicast, c.multicast_on_a, False)
        assert c == heuristics.make_config(out_dtype_bytes=2, **heuristics.config_fields(c))
    assert not any(c.own_tiles for c in heuristics.candidate_configs(4096, 7168, 132, k=16384, grouped=True))
    assert heuristics.estimate_seconds(own[0], 4096, 7168, 16384, 132) > 0
    # Forced configs of unmeasured heights still get an estimate (the sweep and tuning report one for every config).
    assert heuristics.estimate_seconds(heuristics.make_config(128, 128, 2, True, 2, own_tiles=True), 4096, 7168, 16384,
                                       132) > 0


def _override_config(monkeypatch, **fields):
    monkeypatch.setattr(gemm, "_config_override", lambda: fields)
    monkeypatch.setattr(gemm, "_plans", {})
    monkeypatch.setattr(gemm, "_prepared_calls", {})


def test_config_override_forces_and_carries_own_tiles(monkeypatch):
    plain = heuristics.make_config(128, 128, 1, False, 2, overlap_epilogue=True)
    forced = gemm.apply_config_override(plain, {"block_m": 64, "own_tiles": 1}, 2, 7168)
    assert (forced.own_tiles, forced.overlap_epilogue, forced.pipelined, forced.num_math_warpgroups) == (
        True, False, True, 2)
    assert gemm.parse_config_override("block_m=64,own_tiles=1") == {"block_m": 64, "own_tiles": 1}
    pick = heuristics.make_config(64, 128, 2, False, 2, own_tiles=True)
    # Carried over to a tiling that takes it, dropped where the kernel has no own tiles, off with own_tiles=0.
    for fields, own_tiles in (({}, True), ({"block_n": 96}, True), ({"block_m": 128}, True), ({"block_m": 256}, False),
                              ({"splits": 2, "multicast": 1}, False), ({"own_tiles": 0}, False)):
        assert gemm.apply_config_override(pick, fields, 2, 7168).own_tiles == own_tiles, fields
    with pytest.raises(ValueError, match="own-tile"):
        gemm.apply_config_override(pick, {"block_m": 256, "own_tiles": 1}, 2, 7168)
    assert not gemm.apply_config_override(pick, {}, 2, 7168, grouped=True).own_tiles


def test_compile_coverage_builds_own_tiles():
    kernels = heuristics.compile_coverage_kernels()
    own = [kernel.config for kernel in kernels if kernel.config.own_tiles]
    assert {(c.block_m, c.pipelined) for c in own} == {(64, True), (64, False), (128, False)}
    assert any(c.num_tma_multicast == 2 for c in own)


# ---- the kernel (GPU) ----

def _reference(a, b) -> torch.Tensor:
    m, n = a[0].shape[0], b[0].shape[0]
    return reference.fp8_gemm_nt(a, b, torch.empty((m, n), device=a[0].device, dtype=torch.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,pipelined,multicast,multicast_on_a,accumulate,m,n,k", OWN_TILE_CASES)
def test_own_tiles_match_reference_and_lockstep(block_m, block_n, pipelined, multicast, multicast_on_a, accumulate,
                                               m, n, k):
    out_bytes = 4 if accumulate else 2
    config = own_tile_config(block_m, block_n, pipelined, multicast, multicast_on_a, out_bytes)
    twin = lockstep_twin(block_m, block_n, pipelined, multicast, multicast_on_a, out_bytes)
    a, b = make_gemm_inputs(m, n, k)
    expected = _reference(a, b)
    c = None
    if accumulate:
        c = accumulator_like(expected)
        expected += c.double()
    d = forced_config_product(config, a, b, c)
    assert_gemm_close(d, expected)
    assert calc_diff(d, expected) <= 2e-6
    assert_bitwise_equal(forced_config_product(config, a, b, c), d, "d (own tiles, second run)")
    assert_bitwise_equal(forced_config_product(twin, a, b, c), d, "d (lockstep twin)")


@pytest.mark.gpu
def test_check_rejects_a_misplaced_or_unwritten_own_tile():
    # The planted bugs an own-tile schedule could make: one warpgroup's tile stored at the other's rows (two 64-row
    # tiles swapped), and a tile left unwritten (still poisoned). The check that passes the kernel's D rejects both.
    m, n, k = 1024, 2112, 1024
    config = own_tile_config(64, 128, 1, 1, 0)
    a, b = make_gemm_inputs(m, n, k)
    expected = _reference(a, b)
    d = forced_config_product(config, a, b)
    assert_gemm_close(d, expected)
    swapped = d.clone()
    swapped[64:128, :128], swapped[128:192, :128] = d[128:192, :128], d[64:128, :128]
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(swapped, expected)
    unwritten = d.clone()
    # NOTE: not poison_, which fills the whole storage of a view's base.
    unwritten[192:256, 128:256].view(torch.int16).fill_(-1)
    with pytest.raises(AssertionError, match="differ in being NaN"):
        assert_gemm_close(unwritten, expected)


@pytest.mark.gpu
def test_own_tiles_replay_in_a_cuda_graph(monkeypatch):
    m, n, k = 4001, 2112, 7168
    _override_config(monkeypatch, block_m=64, block_n=128, multicast=1, multicast_on_a=0, splits=1,
                     overlap_epilogue=0, own_tiles=1)
    assert gemm._plan(m, n, k, torch.bfloat16, False)[1].own_tiles
    a, b = make_gemm_inputs(m, n, k)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    deep_kernels.fp8_gemm_nt(a, b, d)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.fp8_gemm_nt(a, b, d)
    new_a = cast_activations(gemm_activations(m, k, seed=11))
    a[0].copy_(new_a[0])
    a[1].copy_(new_a[1])
    poison_(d)
    graph.replay()
    assert_gemm_close(d, _reference(a, b))
    eager = deep_kernels.fp8_gemm_nt(a, b, torch.empty_like(d))
    assert_bitwise_equal(d, eager, "d (graph replay against eager)")
