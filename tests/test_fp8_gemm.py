"""FP8 GEMM with fine-grained scaling: input validation (CPU) and the kernel against a float64
reference of the dequantized inputs (GPU). Bound: calc_diff < 1e-3 (the recipe's), plus finite output."""

import random

import pytest
import torch

import deep_kernels
from deep_kernels import gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.reference.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from deep_kernels.testing import assert_bitwise_equal, calc_diff, poison_, random_activations

from conftest import FULL

BOUND = 1e-3
DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def make_inputs(m: int, n: int, k: int, device="cuda"):
    x = random_activations(m, k, torch.bfloat16, device=device)
    w = torch.randn((n, k), device=device, dtype=torch.bfloat16)
    a = deep_kernels.per_token_cast_to_fp8(x) if device == "cuda" else per_token_cast_to_fp8(x)
    return a, per_block_cast_to_fp8(w)


# ---- validation (CPU) ----

def _cpu_operands(m=8, n=256, k=256):
    a = (torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128))
    b = (torch.zeros(n, k, dtype=torch.float8_e4m3fn), torch.ones((n + 127) // 128, k // 128))
    return a, b, torch.empty(m, n, dtype=torch.bfloat16)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d: ((a[0].view(torch.uint8), a[1]), b, d), TypeError, "a must be torch.float8_e4m3fn"),
    (lambda a, b, d: (a, (b[0][:, :128], b[1]), d), ValueError, "K differs"),
    (lambda a, b, d: ((a[0][:, :192], a[1]), (b[0][:, :192], b[1]), d), ValueError, "multiple of 128"),
    (lambda a, b, d: (a, (b[0][:200], b[1]), d[:, :200]), ValueError, "multiple of 16"),
    (lambda a, b, d: (a, b, d.float()), TypeError, "pass c"),
    (lambda a, b, d: (a, b, d[:, :128]), ValueError, "d must be a contiguous"),
    (lambda a, b, d: ((a[0], a[1][:, :1]), b, d), ValueError, "sfa must have shape"),
    (lambda a, b, d: (a, (b[0], b[1][:1]), d), ValueError, "sfb must have shape"),
    (lambda a, b, d: ((a[0], a[1].half()), b, d), TypeError, "sfa must be"),
    (lambda a, b, d: (a[0], b, d), TypeError, "pairs"),
    (lambda a, b, d: (a, b, d), ValueError, "must be a CUDA tensor"),
])
def test_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.fp8_gemm_nt(*mutate(*_cpu_operands()))


def test_accumulation_needs_fp32():
    a, b, d = _cpu_operands()
    with pytest.raises(TypeError, match="d must be torch.float32"):
        deep_kernels.fp8_gemm_nt(a, b, d, c=torch.zeros(8, 256))


def test_mn_major_helper_layout():
    scales = torch.arange(15.0).view(5, 3)
    out = deep_kernels.get_mn_major_tma_aligned_tensor(scales)
    assert out.stride() == (1, 8) and torch.equal(out, scales)
    assert deep_kernels.get_mn_major_tma_aligned_tensor(out) is out


def test_reference_matches_unquantized_product():
    a, b = make_inputs(64, 256, 512, device="cpu")
    d = torch.empty(64, 256)
    reference.fp8_gemm_nt(a, b, d)
    exact = reference.dequantize_a(*a) @ reference.dequantize_b(*b).T
    assert calc_diff(d, exact) < 1e-12


# ---- kernel against the reference (GPU) ----

def _shapes():
    rng = random.Random(0)
    shapes = [(1, 2112, 7168), (64, 7168, 2048), (128, 4096, 7168), (4096, 24576, 1536), (4001, 32768, 512),
              (129, 576, 7168), (777, 7168, 16384), (8192, 4096, 7168), (3, 1040, 128)]
    shapes += [(rng.randint(1, 8192), *rng.choice(DEEPSEEK_NK)) for _ in range(3 if not FULL else 12)]
    return shapes


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", _shapes())
def test_matches_reference(m, n, k):
    a, b = make_inputs(m, n, k)
    d = poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
    deep_kernels.fp8_gemm_nt(a, b, d)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    assert torch.isfinite(d).all()
    assert calc_diff(d, expected) < BOUND
    again = torch.empty_like(d)
    deep_kernels.fp8_gemm_nt(a, b, again)
    assert_bitwise_equal(again, d, "d (second run)")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(100, 2112, 7168), (4096, 7168, 2048)])
@pytest.mark.parametrize("alias", [False, True])
def test_accumulation(m, n, k, alias):
    a, b = make_inputs(m, n, k)
    c = torch.randn((m, n), device="cuda")
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64), c=c)
    d = c.clone() if alias else poison_(torch.empty((m, n), device="cuda"))
    deep_kernels.fp8_gemm_nt(a, b, d, c=d if alias else c)
    assert torch.isfinite(d).all()
    assert calc_diff(d, expected) < BOUND


@pytest.mark.gpu
def test_other_scale_layouts():
    x = random_activations(300, 2048, torch.bfloat16)
    b = per_block_cast_to_fp8(torch.randn((1024, 2048), device="cuda", dtype=torch.bfloat16), ue8m0=True)
    packed = deep_kernels.per_token_cast_to_fp8(x, ue8m0=True, scale_layout="packed_ue8m0")
    row_major = deep_kernels.per_token_cast_to_fp8(x, ue8m0=True, scale_layout="row_major")
    expected = reference.fp8_gemm_nt(row_major, b, torch.empty((300, 1024), device="cuda", dtype=torch.float64))
    for a in (packed, row_major):
        d = poison_(torch.empty((300, 1024), device="cuda", dtype=torch.bfloat16))
        deep_kernels.fp8_gemm_nt(a, b, d)
        assert calc_diff(d, expected) < BOUND


def _captured_call(m: int, n: int, k: int):
    """(a, b, d, graph): one eager call (compiles, plans, sizes buffers), then the same call captured."""
    a, b = make_inputs(m, n, k)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    deep_kernels.fp8_gemm_nt(a, b, d)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.fp8_gemm_nt(a, b, d)
    return a, b, d, graph


def _new_activations_(a, m: int, k: int) -> None:
    new_a, _ = make_inputs(m, 16, k)
    a[0].copy_(new_a[0])
    a[1].copy_(new_a[1])


@pytest.mark.gpu
def test_cuda_graph_replay_with_new_inputs():
    m, n, k = 128, 4096, 7168
    a, b, d, graph = _captured_call(m, n, k)
    _new_activations_(a, m, k)
    poison_(d)
    graph.replay()
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    assert calc_diff(d, expected) < BOUND


@pytest.mark.gpu
def test_empty_m_and_limited_sms():
    a, b = make_inputs(0, 2112, 7168)
    d = torch.empty((0, 2112), device="cuda", dtype=torch.bfloat16)
    assert deep_kernels.fp8_gemm_nt(a, b, d) is d
    a, b = make_inputs(1000, 2112, 7168)
    d = torch.empty((1000, 2112), device="cuda", dtype=torch.bfloat16)
    full = torch.empty_like(d)
    deep_kernels.fp8_gemm_nt(a, b, full)
    previous = deep_kernels.get_num_sms()
    deep_kernels.set_num_sms(60)
    try:
        deep_kernels.fp8_gemm_nt(a, b, d)
    finally:
        deep_kernels.set_num_sms(previous)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((1000, 2112), device="cuda", dtype=torch.float64))
    assert calc_diff(d, expected) < BOUND and calc_diff(full, expected) < BOUND


# ---- split-K (GPU) ----

def _chosen_config(m, n, k, out_dtype, accumulate):
    return gemm._plan(m, n, k, out_dtype, accumulate)[1]


def _run_modes(a, b, m, n, mode, c=None):
    """One call of fp8_gemm_nt from a fresh output: "bf16" (no c), "c" (c separate from d), "c_alias" (c is d)."""
    if mode == "bf16":
        d = poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
        return deep_kernels.fp8_gemm_nt(a, b, d)
    if mode == "c":
        d = poison_(torch.empty((m, n), device="cuda"))
        return deep_kernels.fp8_gemm_nt(a, b, d, c=c)
    d = c.clone()
    return deep_kernels.fp8_gemm_nt(a, b, d, c=d)


def _check_split_k(m, n, k, mode):
    """The product against the float64 reference, and three runs bitwise equal."""
    a, b = make_inputs(m, n, k)
    c = None if mode == "bf16" else torch.randn((m, n), device="cuda")
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64), c=c)
    runs = [_run_modes(a, b, m, n, mode, c) for _ in range(3)]
    assert torch.isfinite(runs[0]).all()
    assert calc_diff(runs[0], expected) < BOUND
    for i, again in enumerate(runs[1:], 1):
        assert_bitwise_equal(again, runs[0], f"d (run {i + 1})")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "c", "c_alias"])
@pytest.mark.parametrize("n,k", DEEPSEEK_NK)
@pytest.mark.parametrize("m", [1, 17, 64, 128])
def test_decode_shapes_match_reference(m, n, k, mode):
    # The heuristics' own choice at decode sizes: split-K where the tiles are few and K is long.
    _check_split_k(m, n, k, mode)
    if (n, k) in ((2112, 7168), (4096, 7168)):
        out_dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        assert _chosen_config(m, n, k, out_dtype, mode != "bf16").num_splits > 1


def _override_config(monkeypatch, **fields):
    """fp8_gemm_nt with DK_FP8_GEMM_CONFIG's fields set as given, and no plan or prepared call kept from before."""
    monkeypatch.setattr(gemm, "_config_override", lambda: fields)
    monkeypatch.setattr(gemm, "_plans", {})
    monkeypatch.setattr(gemm, "_prepared_calls", {})


def test_config_override_keeps_the_overlap_only_where_the_tiling_has_one(monkeypatch):
    # The pick at 4096 x 7168 x 2048 overlaps its epilogue; overriding its tiling to 64 rows or to split-K drops
    # the overlap (the kernel has none there) instead of failing, and overlap_epilogue=0 turns it off.
    assert gemm._choose_config(4096, 7168, 2048, 132, 2, False).overlap_epilogue
    for fields, overlap in (({"block_m": 64}, False), ({"splits": 2}, False), ({"block_n": 128}, True),
                            ({"overlap_epilogue": 0}, False)):
        monkeypatch.setattr(gemm, "_config_override", lambda: fields)
        assert gemm._choose_config(4096, 7168, 2048, 132, 2, False).overlap_epilogue == overlap, fields


@pytest.fixture
def forced_split_k(monkeypatch):
    """fp8_gemm_nt with the heuristics' tiles but no multicast and 3 splits (uneven for K = 512), as
    DK_FP8_GEMM_CONFIG="multicast=1,multicast_on_a=0,splits=3" would set."""
    _override_config(monkeypatch, multicast=1, multicast_on_a=0, splits=3)


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,multicast,accumulate", [(192, 1, False), (128, 1, False), (160, 1, True),
                                                          (192, 2, False)])
@pytest.mark.parametrize("m,n,k", [(4001, 7168, 2048), (1031, 4096, 384), (385, 2112, 128)])
def test_epilogue_overlap_matches_plain(monkeypatch, block_n, multicast, accumulate, m, n, k):
    # Issuing the next tile's first K block before the store changes when, not what, is promoted: D is the
    # same bytes. Several tiles per CTA (the overlap path), one K block (a tile's first block is its last),
    # plain and pipelined K loops, accumulation into FP32 D, multicast pairs.
    if multicast == 2 and -(-m // 128) % 2:
        pytest.skip("multicast on B pairs whole M-block pairs (the heuristics' condition)")
    a, b = make_inputs(m, n, k)
    out_dtype = torch.float32 if accumulate else torch.bfloat16
    c = torch.randn((m, n), device="cuda") if accumulate else None
    outputs = []
    for overlap in (True, False):
        _override_config(monkeypatch, block_m=128, block_n=block_n, multicast=multicast, multicast_on_a=0, splits=1,
                         overlap_epilogue=int(overlap))
        assert _chosen_config(m, n, k, out_dtype, accumulate).overlap_epilogue == overlap
        d = c.clone() if accumulate else poison_(torch.empty((m, n), device="cuda", dtype=out_dtype))
        deep_kernels.fp8_gemm_nt(a, b, d, c=d if accumulate else None)
        outputs.append(d)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64), c=c)
    assert calc_diff(outputs[0], expected) < BOUND
    assert_bitwise_equal(outputs[0], outputs[1], "d (epilogue overlap against plain)")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "c_alias"])
@pytest.mark.parametrize("n,k", DEEPSEEK_NK)
@pytest.mark.parametrize("m", [17, 128])
def test_forced_split_k_matches_reference(forced_split_k, m, n, k, mode):
    # Every decode shape through the split path, including more jobs than CTAs (several per CTA).
    _check_split_k(m, n, k, mode)
    out_dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    assert _chosen_config(m, n, k, out_dtype, mode != "bf16").num_splits == 3


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (128, 4096, 7168)])
@pytest.mark.parametrize("num_sms", [33, 60])
def test_split_k_with_fewer_sms(m, n, k, num_sms):
    previous = deep_kernels.get_num_sms()
    deep_kernels.set_num_sms(num_sms)
    try:
        _check_split_k(m, n, k, "bf16")
        _check_split_k(m, n, k, "c")
        if n == 2112 and num_sms == 60:  # 33 tiles of 64 columns (unsplit with 33 SMs: one tile each)
            assert _chosen_config(m, n, k, torch.bfloat16, False).num_splits > 1
    finally:
        deep_kernels.set_num_sms(previous)


@pytest.mark.gpu
def test_split_k_cuda_graph_replay(monkeypatch):
    # A fresh workspace: the eager call sizes it, the capture allocates nothing, replays (twice: the tickets
    # must be back at zero) see new inputs, and a later eager call that grows the workspace leaves the
    # graph's buffer alive.
    monkeypatch.setattr(gemm, "_split_workspaces", {})
    m, n, k = 64, 2112, 7168
    assert _chosen_config(m, n, k, torch.bfloat16, False).num_splits > 1
    a, b, d, graph = _captured_call(m, n, k)
    for step in range(3):
        _new_activations_(a, m, k)
        poison_(d)
        if step == 2:
            big_a, big_b = make_inputs(128, 4096, 7168)
            assert _chosen_config(128, 4096, 7168, torch.bfloat16, False).num_splits > 1
            deep_kernels.fp8_gemm_nt(big_a, big_b, torch.empty((128, 4096), device="cuda", dtype=torch.bfloat16))
        graph.replay()
        expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
        assert calc_diff(d, expected) < BOUND, step
        eager = torch.empty_like(d)
        deep_kernels.fp8_gemm_nt(a, b, eager)
        assert_bitwise_equal(d, eager, f"d (replay {step})")


@pytest.mark.gpu
def test_split_k_workspace_cannot_grow_during_capture(monkeypatch):
    m, n, k = 64, 2112, 7168
    a, b = make_inputs(m, n, k)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    deep_kernels.fp8_gemm_nt(a, b, d)  # compiles and plans outside the capture
    monkeypatch.setattr(gemm, "_split_workspaces", {})
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="during CUDA-graph capture"):
        with torch.cuda.graph(graph):
            deep_kernels.fp8_gemm_nt(a, b, d)


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,splits", [(128, 128, 1), (128, 112, 1), (64, 96, 1), (64, 64, 3)])
@pytest.mark.parametrize("m,n,k", [(4001, 2112, 7168), (129, 576, 640), (77, 1040, 128), (300, 7168, 384)])
def test_pipelined_k_loop_matches_plain(monkeypatch, block_m, block_n, splits, m, n, k):
    # The pipelined K loop promotes the same partial sums in the same order as the plain one, so D is the
    # same bytes; odd and even K-block counts (one K block too) and tiles straddling sfb blocks (112, 96).
    if splits > k // 128:
        pytest.skip("fewer K blocks than splits")
    a, b = make_inputs(m, n, k)
    outputs = []
    for pipelined in (True, False):
        _override_config(monkeypatch, block_m=block_m, block_n=block_n, multicast=1, multicast_on_a=0, splits=splits,
                         pipelined=int(pipelined))
        assert _chosen_config(m, n, k, torch.bfloat16, False).pipelined == pipelined
        d = poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
        deep_kernels.fp8_gemm_nt(a, b, d)
        outputs.append(d)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    assert calc_diff(outputs[0], expected) < BOUND
    assert_bitwise_equal(outputs[0], outputs[1], "d (pipelined against plain K loop)")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "c_alias"])
@pytest.mark.parametrize("m,n,k,block_m,block_n,splits", [
    (4096, 4096, 7168, 128, 192, 3),  # 704 tiles: 5 whole waves, 44 tiles split 3 ways
    (4001, 2112, 1024, 128, 96, 3),   # 704 tiles again, 8 K blocks split 2 / 3 / 3
    (1000, 576, 640, 64, 48, 2),      # 192 tiles on 132 SMs: 60 split tiles
])
def test_tail_split_matches_reference(monkeypatch, mode, m, n, k, block_m, block_n, splits):
    _override_config(monkeypatch, block_m=block_m, block_n=block_n, multicast=1, multicast_on_a=0, splits=splits)
    out_dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    config = _chosen_config(m, n, k, out_dtype, mode != "bf16")
    tiles = heuristics.num_tiles(config, m, n)
    assert 0 < heuristics.num_unsplit_tiles(config, m, n, deep_kernels.get_num_sms()) < tiles
    _check_split_k(m, n, k, mode)
