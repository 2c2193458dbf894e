"""MoE routing: top-k gating and the grouped-GEMM layouts. The reference's definition (CPU), input
validation (CPU), and the kernels bit-exact against the reference (GPU)."""

import math

import pytest
import torch

import deep_kernels
from deep_kernels.moe import MAX_EXPERTS, SCORINGS, contiguous_max_rows, fused_max_tokens
from deep_kernels.reference import moe as reference
from deep_kernels.testing import INT32_POISON_BYTE, assert_bitwise_equal, poison_, poison_cached_memory, random_activations

from conftest import FULL

# (E, num_groups, topk_groups, k, scoring): DeepSeek-V3, Kimi-K2, the largest, odd and tiny shapes.
GATES = [
    (256, 8, 4, 8, "sigmoid"),
    (384, 0, 0, 8, "sigmoid"),
    (512, 8, 3, 16, "softmax"),
    (72, 0, 0, 6, "sqrtsoftplus"),
    (64, 32, 5, 4, "softmax"),
    (160, 5, 2, 16, "sqrtsoftplus"),
    (8, 0, 0, 8, "softmax"),
]


def _brute_force_indices(keys: torch.Tensor, k: int, num_groups: int, topk_groups: int) -> list:
    """Python's sorted() on (eligible, key, -index) per token: the selection rule, spelled out."""
    keys = reference.rank_keys(keys)
    result = []
    for row in keys.tolist():
        num_experts = len(row)
        eligible = [True] * num_experts
        if num_groups:
            size = num_experts // num_groups
            top2 = [sorted(row[g * size:(g + 1) * size], reverse=True)[:2] for g in range(num_groups)]
            group_keys = [(torch.tensor(a) + torch.tensor(b)).item() for a, b in top2]  # an fp32 sum
            group_keys = [-math.inf if math.isnan(v) else v for v in group_keys]
            kept = sorted(range(num_groups), key=lambda g: (-group_keys[g], g))[:topk_groups]
            eligible = [e // size in kept for e in range(num_experts)]
        result.append(sorted(range(num_experts), key=lambda e: (not eligible[e], -row[e], e))[:k])
    return result


def _with_special_values(logits: torch.Tensor, fraction: float, generator=None) -> torch.Tensor:
    """NaN, +Inf and -Inf at a fraction of random places, and rows 0, 1, 2 all NaN, +Inf, -Inf."""
    specials = torch.tensor([math.nan, math.inf, -math.inf], device=logits.device)
    mask = torch.rand(logits.shape, generator=generator, device=logits.device) < fraction
    picks = torch.randint(0, 3, (int(mask.sum()),), generator=generator, device=logits.device)
    logits[mask] = specials[picks]
    logits[0], logits[1], logits[2] = math.nan, math.inf, -math.inf
    return logits


# ---- the reference (CPU) ----

@pytest.mark.parametrize("num_experts,num_groups,topk_groups,k,scoring", GATES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_reference_selection_matches_brute_force(num_experts, num_groups, topk_groups, k, scoring, with_bias):
    generator = torch.Generator().manual_seed(num_experts + k)
    # Few distinct values, so many keys and group sums tie exactly.
    logits = torch.randint(-3, 3, (37, num_experts), generator=generator).float() / 2
    bias = torch.randint(-2, 2, (num_experts,), generator=generator).float() / 4 if with_bias else None
    weights, indices = reference.topk_gate(logits, k, scoring, bias, num_groups, topk_groups)
    scores = reference.gate_scores(logits, scoring)
    keys = scores if bias is None else scores + bias
    assert indices.tolist() == _brute_force_indices(keys, k, num_groups, topk_groups)
    assert indices.dtype == torch.int32 and weights.dtype == torch.float32
    chosen = scores.gather(1, indices.long())
    assert torch.allclose(weights, chosen / chosen.sum(dim=1, keepdim=True), rtol=1e-6, atol=0)


@pytest.mark.parametrize("scoring,definition", [
    ("softmax", lambda x: torch.softmax(x, dim=1)),
    ("sigmoid", torch.sigmoid),
    ("sqrtsoftplus", lambda x: torch.nn.functional.softplus(x).sqrt()),
])
def test_reference_scores_are_the_textbook_functions(scoring, definition):
    logits = random_activations(19, 300, torch.float32, device="cpu", seed=3).clamp(-30, 30)
    torch.testing.assert_close(reference.gate_scores(logits, scoring), definition(logits), rtol=4e-7, atol=1e-30)


def test_warp_lane_sum_order():
    values = torch.arange(70, dtype=torch.float32).view(1, 70)
    assert reference.warp_lane_sum(values).item() == sum(range(70))
    # 2^24 + 1 is not representable, so the order shows: lanes 1 and 3 meet first, then lane 0.
    values = torch.zeros((1, 64))
    values[0, 0], values[0, 1], values[0, 3] = 2.0**24, 1.0, 1.0
    assert reference.warp_lane_sum(values).item() == 2.0**24 + 2  # left to right it would be 2^24


def test_reference_deepseek_groups_and_weights():
    logits = torch.full((1, 16), -10.0)
    logits[0, 0] = 3.0             # group 0's best expert, but group 0's second best is weak
    logits[0, [4, 5]] = 1.0        # group 1: two good experts beat group 0's sum
    logits[0, [12, 13]] = -1.0     # group 3: weaker than group 0
    weights, indices = reference.topk_gate(logits, 2, "sigmoid", None, num_groups=4, topk_groups=1,
                                           routed_scaling_factor=2.5)
    assert indices.tolist() == [[4, 5]]
    assert weights.tolist() == [[1.25, 1.25]]  # equal scores, renormalized, times 2.5
    _, indices = reference.topk_gate(logits, 3, "sigmoid", None, num_groups=4, topk_groups=2)
    assert indices.tolist() == [[0, 4, 5]]


def test_reference_bias_selects_but_does_not_weigh():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    bias = torch.tensor([10.0, 0.0, 0.0, 0.0])
    weights, indices = reference.topk_gate(logits, 2, "sigmoid", bias, renormalize=False)
    assert indices.tolist() == [[0, 3]]
    assert weights[0, 0].item() == 0.5 and weights[0, 1].item() == pytest.approx(1 / (1 + math.exp(-3)), rel=1e-7)


def test_reference_ties_go_to_the_lower_index():
    _, indices = reference.topk_gate(torch.zeros((3, 64)), 5, "softmax")
    assert indices.tolist() == [[0, 1, 2, 3, 4]] * 3
    _, indices = reference.topk_gate(torch.zeros((1, 64)), 5, "sigmoid", num_groups=8, topk_groups=2)
    assert indices.tolist() == [[0, 1, 2, 3, 4]]
    logits = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    _, indices = reference.topk_gate(logits, 4, "sigmoid")
    assert indices.tolist() == [[2, 3, 0, 1]]


def test_reference_nan_and_inf_logits():
    logits = torch.tensor([[0.0, math.nan, 1.0, -math.inf, math.inf, 2.0]])
    weights, indices = reference.topk_gate(logits, 6, "sigmoid", renormalize=False)
    assert indices.tolist() == [[4, 5, 2, 0, 3, 1]]  # NaN's key ranks below sigmoid(-inf) = 0
    assert weights[0, 0] == 1.0 and weights[0, 4] == 0.0 and math.isnan(weights[0, 5])
    weights, indices = reference.topk_gate(logits, 3, "softmax")  # inf - inf: every softmax score is NaN
    assert indices.tolist() == [[0, 1, 2]] and torch.isnan(weights).all()


def _brute_force_layout(topk_idx: torch.Tensor, num_experts: int) -> tuple:
    per_expert = [[] for _ in range(num_experts)]
    for slot, e in enumerate(topk_idx.reshape(-1).tolist()):
        if 0 <= e < num_experts:
            per_expert[e].append(slot)
    rows, slot_to_row = [], {}
    for e, slots in enumerate(per_expert):
        for slot in slots:
            slot_to_row[slot] = len(rows)
            rows.append((e, slot))
        rows += [(-1, -1)] * (-len(slots) % 128)
    return per_expert, rows, slot_to_row


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_reference_layout_matches_brute_force(index_dtype):
    generator = torch.Generator().manual_seed(5)
    num_experts, max_tokens = 12, 9
    topk_idx = torch.randint(-1, num_experts + 1, (41, 3), generator=generator).to(index_dtype)  # E: dropped too
    topk_idx[5] = 7  # one expert three times in a token: each slot counts
    layout = reference.moe_layout(topk_idx, num_experts, max_tokens)
    per_expert, rows, slot_to_row = _brute_force_layout(topk_idx, num_experts)
    max_rows = contiguous_max_rows(123, num_experts)
    assert layout.counts.tolist() == [len(s) for s in per_expert]
    assert layout.num_rows.tolist() == [len(rows)]
    padded = rows + [(-1, -1)] * (max_rows - len(rows))
    assert layout.m_indices.tolist() == [e for e, _ in padded]
    assert layout.row_to_slot.tolist() == [s for _, s in padded]
    assert layout.slot_to_row.view(-1).tolist() == [slot_to_row.get(s, -1) for s in range(123)]
    assert layout.masked_m.tolist() == [min(len(s), max_tokens) for s in per_expert]
    assert layout.masked_slots.tolist() == [(s + [-1] * max_tokens)[:max_tokens] for s in per_expert]
    assert all(t.dtype == torch.int32 for t in (layout.counts, layout.m_indices, layout.masked_slots))


def test_contiguous_max_rows_is_the_worst_case():
    assert contiguous_max_rows(0, 256) == 0
    assert contiguous_max_rows(1, 256) == 128
    assert contiguous_max_rows(8 * 4096, 256) == 8 * 4096 + 127 * 256 + 0  # 32768 + 32512, a multiple of 128
    align = lambda n: -(-n // 128) * 128
    assert all(align(c) + align(300 - c) <= contiguous_max_rows(300, 2) for c in range(301))


# ---- validation (CPU tensors: every check that precedes the device check) ----

LOGITS = torch.zeros(4, 256)


@pytest.mark.parametrize("logits,kwargs,error,match", [
    (LOGITS.half(), {}, TypeError, "logits must be"),
    (torch.zeros(256), {}, ValueError, "logits must be 2-D"),
    (torch.zeros(4, 513), {}, ValueError, "expert count"),
    (torch.zeros(4, 0), {}, ValueError, "expert count"),
    (LOGITS, {"k": 17}, ValueError, "k must be an integer in \\[1, 16\\]"),
    (torch.zeros(4, 6), {"k": 7}, ValueError, "k must be an integer in \\[1, 6\\]"),
    (LOGITS, {"k": 0}, ValueError, "k must be"),
    (LOGITS, {"scoring": "relu"}, ValueError, "scoring must be one of"),
    (LOGITS, {"num_groups": 7, "topk_groups": 1}, ValueError, "must divide the 256 experts"),
    (LOGITS, {"num_groups": 64, "topk_groups": 1}, ValueError, "num_groups must be an integer in \\[0, 32\\]"),
    (LOGITS, {"num_groups": 8, "topk_groups": 0}, ValueError, "topk_groups must be an integer in \\[1, 8\\]"),
    (LOGITS, {"num_groups": 8, "topk_groups": 9}, ValueError, "topk_groups must be"),
    (LOGITS, {"num_groups": 0, "topk_groups": 2}, ValueError, "topk_groups must be 0 without groups"),
    (LOGITS, {"num_groups": 0, "topk_groups": 0.0}, ValueError, "topk_groups must be 0 without groups"),
    (LOGITS, {"num_groups": 0, "topk_groups": False}, ValueError, "topk_groups must be 0 without groups"),
    (LOGITS, {"k": 16, "num_groups": 32, "topk_groups": 1}, ValueError, "must not exceed the 8 experts"),
    (torch.zeros(256, 4).t(), {}, ValueError, "contiguous last dimension"),
    (LOGITS, {"bias": torch.zeros(256, dtype=torch.bfloat16)}, TypeError, "bias must be torch.float32"),
    (LOGITS, {"bias": torch.zeros(255)}, ValueError, "bias must be a contiguous tensor of shape \\(256,\\)"),
    (LOGITS, {"renormalize": 1}, TypeError, "renormalize must be a bool"),
    (LOGITS, {"routed_scaling_factor": math.inf}, ValueError, "routed_scaling_factor"),
    # Finite in Python, infinite in the kernel's FP32; a bool is no factor.
    (LOGITS, {"routed_scaling_factor": 1e39}, ValueError, "routed_scaling_factor must be a finite FP32 number"),
    (LOGITS, {"routed_scaling_factor": True}, ValueError, "routed_scaling_factor must be a finite FP32 number"),
    (LOGITS, {}, ValueError, "logits must be a CUDA tensor"),
    ("logits", {}, TypeError, "torch.Tensor"),
])
def test_topk_gate_rejects_bad_input(logits, kwargs, error, match):
    kwargs = {"k": 8, **kwargs}
    with pytest.raises(error, match=match):
        deep_kernels.topk_gate(logits, **kwargs)


@pytest.mark.parametrize("topk_idx,kwargs,error,match", [
    (torch.zeros(4, 8, dtype=torch.int16), {}, TypeError, "topk_idx must be torch.int32 or torch.int64"),
    (torch.zeros(32, dtype=torch.int32), {}, ValueError, "topk_idx must be 2-D"),
    (torch.zeros(4, 8, dtype=torch.int32), {"num_experts": 513}, ValueError, "num_experts must be"),
    (torch.zeros(4, 8, dtype=torch.int32), {"num_experts": 0}, ValueError, "num_experts must be"),
    (torch.zeros(8, 4, dtype=torch.int32).t(), {}, ValueError, "topk_idx must be contiguous"),
    (torch.zeros(4, 8, dtype=torch.int32), {"max_tokens": 0}, ValueError, "max_tokens must be"),
    (torch.zeros(4, 8, dtype=torch.int32), {"max_tokens": 2**31 // 256}, ValueError, "max_tokens must be"),
    (torch.zeros(4, 8, dtype=torch.int32), {}, ValueError, "topk_idx must be a CUDA tensor"),
])
def test_moe_layout_rejects_bad_input(topk_idx, kwargs, error, match):
    kwargs = {"num_experts": 256, **kwargs}
    with pytest.raises(error, match=match):
        deep_kernels.moe_layout(topk_idx, **kwargs)


def test_moe_layout_rejects_too_many_slots():
    with pytest.raises(ValueError, match="too many slots"):
        deep_kernels.moe_layout(torch.zeros(2**31 // 16, 16, dtype=torch.int32, device="meta"), 256)


# ---- kernels against the reference (GPU) ----

TOKENS = [1, 7, 4001] + ([8001, 33] if FULL else [])


def _gate_logits(num_tokens: int, num_experts: int, dtype: torch.dtype, ties: bool) -> torch.Tensor:
    if ties:  # a handful of values: exact ties among keys and among group sums everywhere
        return (torch.randint(-4, 4, (num_tokens, num_experts), device="cuda").float() / 4).to(dtype)
    return (torch.randn((num_tokens, num_experts), device="cuda") * 2).to(dtype)


def _check_gate(logits, k, **kwargs):
    weights_ref, indices_ref = reference.topk_gate(logits, k, **kwargs)
    poison_cached_memory()  # the outputs start as NaN and -1, not as the reference's freed buffers
    weights, indices = deep_kernels.topk_gate(logits, k, **kwargs)
    assert_bitwise_equal(indices, indices_ref, "indices")
    assert_bitwise_equal(weights, weights_ref, "weights")
    return weights, indices


def _gate_cases(token_counts) -> list:
    """Each gate of GATES with and without ties, the dtypes and token counts taking turns (not their cross
    product: each is its own code path, the gate shape another)."""
    cases = []
    for i, gate in enumerate(GATES):
        for ties in (False, True):
            dtype = (torch.float32, torch.bfloat16)[(i + ties) % 2]
            cases.append((*gate, dtype, token_counts[(2 * i + ties) % len(token_counts)], ties))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,num_groups,topk_groups,k,scoring,dtype,num_tokens,ties", _gate_cases(TOKENS))
def test_topk_gate_matches_reference(num_experts, num_groups, topk_groups, k, scoring, dtype, num_tokens, ties):
    logits = _gate_logits(num_tokens, num_experts, dtype, ties)
    bias = torch.randn(num_experts, device="cuda") * 0.1
    if ties:
        bias = bias.round(decimals=1)
    for kwargs in (dict(bias=bias, routed_scaling_factor=2.5), dict(renormalize=False),
                   dict(bias=bias, renormalize=False, routed_scaling_factor=0.3)):
        _check_gate(logits, k, scoring=scoring, num_groups=num_groups, topk_groups=topk_groups, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid", "sqrtsoftplus"])
def test_topk_gate_nan_and_inf_logits(scoring):
    logits = _with_special_values(torch.randn((512, 256), device="cuda"), 0.05)
    kwargs = dict(scoring=scoring, num_groups=8, topk_groups=4)
    weights_ref, indices_ref = reference.topk_gate(logits, 8, **kwargs)
    weights, indices = deep_kernels.topk_gate(logits, 8, **kwargs)
    assert_bitwise_equal(indices, indices_ref, "indices")
    assert ((indices >= 0) & (indices < 256)).all()
    assert (indices.sort(dim=1).values.diff(dim=1) > 0).all()  # distinct experts
    # NaN payloads may differ: compare NaN positions and the other values exactly.
    assert torch.equal(weights.isnan(), weights_ref.isnan())
    assert torch.equal(weights.nan_to_num(0.0), weights_ref.nan_to_num(0.0))


@pytest.mark.gpu
def test_topk_gate_row_stride_and_empty():
    wide = torch.randn((300, 320), device="cuda", dtype=torch.bfloat16)
    _check_gate(wide[:, :256], 8, scoring="sigmoid", num_groups=8, topk_groups=4)
    weights, indices = deep_kernels.topk_gate(wide[:0, :256], 8)
    assert weights.shape == (0, 8) and indices.shape == (0, 8) and indices.dtype == torch.int32


def _routed_indices(num_tokens: int, num_experts: int, k: int, index_dtype: torch.dtype) -> torch.Tensor:
    """Distinct experts per token from a skewed router, with dropped (-1) and out-of-range slots."""
    logits = torch.randn((num_tokens, num_experts), device="cuda") + torch.linspace(2, 0, num_experts, device="cuda")
    _, indices = deep_kernels.topk_gate(logits, k, "sigmoid")
    drop = torch.rand(indices.shape, device="cuda")
    indices[drop < 0.05] = -1
    indices[drop > 0.995] = num_experts + 3
    return indices.to(index_dtype)


def _poison_output(t: torch.Tensor) -> torch.Tensor:
    """poison_, but int32 outputs get INT32_MIN: poison_'s bytes read as -1, a value the layouts write."""
    return t.fill_(-2**31) if t.dtype == torch.int32 else poison_(t)


def _check_layout(topk_idx, num_experts, max_tokens=None):
    expected = reference.moe_layout(topk_idx, num_experts, max_tokens)
    poison_cached_memory(INT32_POISON_BYTE)  # the layout's tensors start poisoned, not -1 (a value they hold)
    layout = deep_kernels.moe_layout(topk_idx, num_experts, max_tokens)
    for name in ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row", "masked_slots", "masked_m"):
        actual, wanted = getattr(layout, name), getattr(expected, name)
        if wanted is None:
            assert actual is None, name
        else:
            assert_bitwise_equal(actual, wanted, name)
    return layout


def _layout_cases() -> list:
    """Each (E, k) at two token counts, one with int32 and one with int64 indices; the token counts take turns."""
    token_counts = [1, 7, 513, 4001, 8001, 16384]
    shapes = [(256, 8), (384, 8), (512, 16), (72, 6), (3, 2), (64, 9), (8, 1)]
    return [(token_counts[(2 * i + j) % len(token_counts)], *shape, (torch.int32, torch.int64)[j])
            for i, shape in enumerate(shapes) for j in (0, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,num_experts,k,index_dtype", _layout_cases())
def test_moe_layout_matches_reference(num_tokens, num_experts, k, index_dtype):
    topk_idx = _routed_indices(num_tokens, num_experts, k, index_dtype)
    _check_layout(topk_idx, num_experts)
    _check_layout(topk_idx, num_experts, max_tokens=num_tokens)
    _check_layout(topk_idx, num_experts, max_tokens=max(1, num_tokens // num_experts))  # overflowing experts


@pytest.mark.gpu
def test_moe_layout_one_hot_expert_and_all_dropped():
    topk_idx = torch.full((5000, 8), 17, dtype=torch.int32, device="cuda")  # one expert, every slot
    _check_layout(topk_idx, 256, max_tokens=5000)
    # Every slot dropped, and no token: zero counts the kernels must write (not what the allocator held).
    all_dropped = torch.full((64, 8), -1, dtype=torch.int32, device="cuda")
    _check_layout(all_dropped, 256, max_tokens=64)
    no_tokens = torch.empty((0, 8), dtype=torch.int32, device="cuda")
    layout = _check_layout(no_tokens, 256, max_tokens=4)
    assert layout.m_indices.shape == (0,) and layout.masked_slots.shape == (256, 4)


@pytest.mark.gpu
def test_routing_is_deterministic_and_graph_capturable():
    logits = torch.randn((4001, 256), device="cuda", dtype=torch.bfloat16)
    kwargs = dict(scoring="sigmoid", num_groups=8, topk_groups=4)
    first_weights, first_indices = deep_kernels.topk_gate(logits, 8, **kwargs)
    first_layout = deep_kernels.moe_layout(first_indices, 256, max_tokens=4001)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, indices = deep_kernels.topk_gate(logits, 8, **kwargs)
        layout = deep_kernels.moe_layout(indices, 256, max_tokens=4001)
    outputs = (weights, indices, layout.counts, layout.num_rows, layout.m_indices, layout.row_to_slot,
               layout.slot_to_row, layout.masked_slots, layout.masked_m)
    wanted = (first_weights, first_indices, first_layout.counts, first_layout.num_rows, first_layout.m_indices,
              first_layout.row_to_slot, first_layout.slot_to_row, first_layout.masked_slots, first_layout.masked_m)
    for _ in range(2):
        for t in outputs:
            _poison_output(t)
        graph.replay()
        torch.cuda.synchronize()
        for i, (actual, expected) in enumerate(zip(outputs, wanted)):
            assert_bitwise_equal(actual, expected, f"output {i}")
    # New logits, read on the device: the replay against the reference.
    logits.copy_(torch.randn((4001, 256), device="cuda", dtype=torch.bfloat16))
    for t in outputs:
        _poison_output(t)
    graph.replay()
    torch.cuda.synchronize()
    weights_ref, indices_ref = reference.topk_gate(logits, 8, **kwargs)
    assert_bitwise_equal(indices, indices_ref, "indices")
    assert_bitwise_equal(weights, weights_ref, "weights")
    expected_layout = reference.moe_layout(indices_ref, 256, max_tokens=4001)
    for name in ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row", "masked_slots", "masked_m"):
        assert_bitwise_equal(getattr(layout, name), getattr(expected_layout, name), name)


@pytest.mark.gpu
def test_largest_expert_count_is_supported():
    logits = random_activations(100, MAX_EXPERTS, torch.float32)
    _check_gate(logits, 16, scoring="softmax", num_groups=8, topk_groups=3)


# ---- gate backward, the fused gate + layout, expert parallelism: references (CPU) ----

SCORING_FUNCTIONS = {
    "softmax": lambda x: torch.softmax(x, dim=1),
    "sigmoid": torch.sigmoid,
    "sqrtsoftplus": lambda x: torch.nn.functional.softplus(x).sqrt(),
}


def _autograd_gate_backward(grad_weights, logits, indices, scoring, renormalize, factor):
    """torch.autograd of the weights' definition in float64: scores -> chosen -> renormalized -> scaled."""
    x = logits.double().requires_grad_()
    index = indices.long()
    valid = (index >= 0) & (index < x.shape[1])
    chosen = SCORING_FUNCTIONS[scoring](x).gather(1, index.clamp(0, x.shape[1] - 1)) * valid
    if renormalize:
        chosen = chosen / (chosen.sum(dim=1, keepdim=True) + 1e-20)
    (chosen * factor * grad_weights.double()).sum().backward()
    return x.grad


@pytest.mark.parametrize("scoring", list(SCORINGS))
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("num_experts,k", [(72, 6), (256, 8), (8, 2)])  # k = 1 renormalized: pure rounding
def test_reference_gate_backward_matches_autograd(scoring, renormalize, num_experts, k):
    generator = torch.Generator().manual_seed(num_experts + k)
    logits = torch.randn((41, num_experts), generator=generator) * 3
    _, indices = reference.topk_gate(logits, k, scoring, renormalize=renormalize)
    if k > 1:
        indices[3, 0] = -1  # a dropped slot: a score of 0, no gradient
    grad_weights = torch.randn((41, k), generator=generator)
    grad = reference.topk_gate_backward(grad_weights, logits, indices, scoring, renormalize, 2.5)
    expected = _autograd_gate_backward(grad_weights, logits, indices, scoring, renormalize, 2.5)
    assert grad.dtype == torch.float32 and grad.shape == logits.shape and grad.is_contiguous()
    # fp32 against float64: g - dot / D cancels, so the bound is relative to the largest gradient too.
    torch.testing.assert_close(grad.double(), expected, rtol=1e-4, atol=5e-5 * max(expected.abs().max().item(), 1e-3))
    if scoring != "softmax":  # only the chosen experts' logits get a gradient
        chosen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, indices.long().clamp(min=0), True)
        chosen[3, 0] = indices[3].eq(0).any()
        assert (grad[~chosen] == 0).all()


def test_reference_gate_backward_edge_values():
    logits = torch.tensor([[-200.0, 30.0, 0.0, 1.0]])  # sqrt(softplus(-200)) underflows to 0; 30 is linear
    indices = torch.tensor([[1, 0]], dtype=torch.int32)
    grad = reference.topk_gate_backward(torch.ones((1, 2)), logits, indices, "sqrtsoftplus", renormalize=False)
    assert grad[0, 0].item() == 0.0 and grad[0, 1].item() == pytest.approx(1 / (2 * math.sqrt(30)), rel=1e-6)
    assert grad[0, 2:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("num_local,rank", [(32, 0), (32, 7), (5, 3)])
def test_reference_map_global_to_local_experts(num_local, rank):
    topk_idx = torch.randint(-1, 8 * num_local + 2, (53, 6), generator=torch.Generator().manual_seed(rank))
    local = reference.map_global_to_local_experts(topk_idx, num_local, rank)
    first = rank * num_local
    assert local.dtype == torch.int32 and local.shape == topk_idx.shape
    assert local.view(-1).tolist() == [e - first if first <= e < first + num_local else -1
                                       for e in topk_idx.view(-1).tolist()]


@pytest.mark.parametrize("scoring", list(SCORINGS))
@pytest.mark.parametrize("num_groups,topk_groups", [(0, 0), (8, 3)])
def test_reference_nan_and_inf_logits_give_distinct_in_range_indices(scoring, num_groups, topk_groups):
    generator = torch.Generator().manual_seed(11)
    logits = _with_special_values(torch.randn((64, 64), generator=generator), 0.2, generator)
    _, indices = reference.topk_gate(logits, 9, scoring, num_groups=num_groups, topk_groups=topk_groups)
    assert ((indices >= 0) & (indices < 64)).all()
    assert (indices.sort(dim=1).values.diff(dim=1) > 0).all()
    _, indices = reference.topk_gate(logits[:3], 9, scoring, num_groups=num_groups, topk_groups=topk_groups)
    assert indices[0].tolist() == list(range(9))  # all NaN: every key ties at -inf, lowest indices first


def test_reference_gate_with_layout_is_gate_then_layout():
    logits = torch.randn((37, 64), generator=torch.Generator().manual_seed(2))
    weights, indices, layout = reference.topk_gate_with_layout(logits, 6, "sigmoid", max_tokens=5)
    assert torch.equal(weights, reference.topk_gate(logits, 6, "sigmoid")[0])
    expected = reference.moe_layout(indices, 64, 5)
    for name in ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row", "masked_slots", "masked_m"):
        assert torch.equal(getattr(layout, name), getattr(expected, name)), name


# ---- validation of the new entries (CPU) ----

GRAD = torch.zeros(4, 8)
IDX = torch.zeros(4, 8, dtype=torch.int32)


@pytest.mark.parametrize("args,kwargs,error,match", [
    ((GRAD.double(), LOGITS, IDX), {}, TypeError, "grad_weights must be torch.float32"),
    ((GRAD, LOGITS.half(), IDX), {}, TypeError, "logits must be"),
    ((GRAD, LOGITS, IDX.long()), {}, TypeError, "indices must be torch.int32"),
    ((GRAD[:3], LOGITS, IDX), {}, ValueError, "grad_weights and indices must both be \\[4, k\\]"),
    ((GRAD, LOGITS, IDX[:, :7]), {}, ValueError, "grad_weights and indices must both be"),
    ((torch.zeros(4, 17), LOGITS, torch.zeros(4, 17, dtype=torch.int32)), {}, ValueError, "k\\) must be"),
    ((torch.zeros(8, 4).t(), LOGITS, IDX), {}, ValueError, "must be contiguous"),
    ((GRAD, torch.zeros(256, 4).t(), IDX), {}, ValueError, "contiguous last dimension"),
    ((GRAD, LOGITS, IDX), {"scoring": "relu"}, ValueError, "scoring must be one of"),
    ((GRAD, LOGITS, IDX), {"renormalize": 0}, TypeError, "renormalize must be a bool"),
    ((GRAD, LOGITS, IDX), {"routed_scaling_factor": math.nan}, ValueError, "routed_scaling_factor"),
    ((GRAD, LOGITS, IDX), {"out": torch.zeros(4, 255)}, ValueError, "out must be a contiguous \\[4, 256\\]"),
    ((GRAD, LOGITS, IDX), {"out": torch.zeros(4, 256, dtype=torch.bfloat16)}, TypeError, "out must be"),
    ((GRAD, LOGITS, IDX), {}, ValueError, "logits must be a CUDA tensor"),
])
def test_topk_gate_backward_rejects_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.topk_gate_backward(*args, **kwargs)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"k": 17}, ValueError, "k must be"),
    ({"num_groups": 7, "topk_groups": 1}, ValueError, "must divide the 256 experts"),
    ({"max_tokens": 0}, ValueError, "max_tokens must be"),
    ({"bias": torch.zeros(255)}, ValueError, "bias must be a contiguous tensor"),
    ({}, ValueError, "logits must be a CUDA tensor"),
])
def test_topk_gate_with_layout_rejects_bad_input(kwargs, error, match):
    kwargs = {"k": 8, **kwargs}
    with pytest.raises(error, match=match):
        deep_kernels.topk_gate_with_layout(LOGITS, **kwargs)


@pytest.mark.parametrize("topk_idx,kwargs,error,match", [
    (torch.zeros(4, 8, dtype=torch.int16), {}, TypeError, "topk_idx must be torch.int32 or torch.int64"),
    (torch.zeros(8, 4, dtype=torch.int32).t(), {}, ValueError, "topk_idx must be contiguous"),
    (IDX, {"num_local_experts": 0}, ValueError, "num_local_experts must be"),
    (IDX, {"rank": -1}, ValueError, "rank must be"),
    (IDX, {"rank": 2**26}, ValueError, "must stay below 2\\^31"),
    (IDX, {"out": torch.zeros(4, 8, dtype=torch.int64)}, TypeError, "out must be torch.int32"),
    (IDX, {"out": torch.zeros(8, 4, dtype=torch.int32)}, ValueError, "out must be a contiguous int32 tensor"),
    (IDX, {}, ValueError, "topk_idx must be a CUDA tensor"),
])
def test_map_global_to_local_experts_rejects_bad_input(topk_idx, kwargs, error, match):
    kwargs = {"num_local_experts": 32, "rank": 1, **kwargs}
    with pytest.raises(error, match=match):
        deep_kernels.map_global_to_local_experts(topk_idx, **kwargs)


# ---- gate backward, the fused gate + layout, expert parallelism: kernels against the reference (GPU) ----

LAYOUT_FIELDS = ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row", "masked_slots", "masked_m")

# (E, num_groups, topk_groups, scoring) for the fused gate + layout, with every k of ROUTED_KS that fits.
ROUTED_GATES = [(8, 0, 0, "softmax"), (64, 8, 3, "sqrtsoftplus"), (256, 8, 4, "sigmoid"), (384, 0, 0, "sigmoid")]
ROUTED_KS = [1, 2, 6, 8, 9]


def _check_layouts_equal(layout, expected, what=""):
    for name in LAYOUT_FIELDS:
        actual, wanted = getattr(layout, name), getattr(expected, name)
        if wanted is None:
            assert actual is None, name
        else:
            assert_bitwise_equal(actual, wanted, f"{what}{name}")


def _check_gate_with_layout(logits, k, max_tokens=None, **kwargs):
    weights_ref, indices_ref, layout_ref = reference.topk_gate_with_layout(logits, k, max_tokens=max_tokens, **kwargs)
    poison_cached_memory(INT32_POISON_BYTE)  # the outputs start poisoned, not -1 (a value the layout holds)
    weights, indices, layout = deep_kernels.topk_gate_with_layout(logits, k, max_tokens=max_tokens, **kwargs)
    assert_bitwise_equal(indices, indices_ref, "indices")
    assert_bitwise_equal(weights, weights_ref, "weights")
    _check_layouts_equal(layout, layout_ref)
    return weights, indices, layout


def _routed_cases() -> list:
    """Every k at the largest T of the one-launch path and the smallest of the two-stage path, and every gate at
    one more T (1, 4001 or 8001), the gates taking turns; k never exceeds E."""
    cases = []
    for i, k in enumerate(ROUTED_KS):
        fitting = [gate for gate in ROUTED_GATES if gate[0] >= k]
        cases += [(*fitting[i % len(fitting)], k, "fused_max"), (*fitting[(i + 1) % len(fitting)], k, "fused_max + 1")]
    for i, gate in enumerate(ROUTED_GATES):
        k = [k for k in ROUTED_KS if k <= gate[0]][-1 - i % 2]
        cases.append((*gate, k, (1, 4001, 8001)[i % 3]))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,num_groups,topk_groups,scoring,k,num_tokens", _routed_cases())
def test_topk_gate_with_layout_matches_reference(num_experts, num_groups, topk_groups, scoring, k, num_tokens):
    # The largest T of the one-launch path and the smallest of the two-stage path.
    largest_fused = fused_max_tokens(k)
    num_tokens = {"fused_max": largest_fused, "fused_max + 1": largest_fused + 1}.get(num_tokens, num_tokens)
    ties = num_tokens % 2 == 1
    logits = _gate_logits(num_tokens, num_experts, torch.float32 if num_experts != 64 else torch.bfloat16, ties)
    bias = torch.randn(num_experts, device="cuda") * 0.1
    gate = dict(scoring=scoring, num_groups=num_groups, topk_groups=topk_groups)
    _check_gate_with_layout(logits, k, bias=bias, routed_scaling_factor=2.5, **gate)
    _check_gate_with_layout(logits, k, max_tokens=max(1, num_tokens * k // num_experts), renormalize=False, **gate)


@pytest.mark.gpu
def test_topk_gate_with_layout_row_stride_and_empty():
    wide = torch.randn((300, 320), device="cuda")
    _check_gate_with_layout(wide[:, :256], 8, max_tokens=20, scoring="sigmoid", num_groups=8, topk_groups=4)
    poison_cached_memory(INT32_POISON_BYTE)
    weights, indices, layout = deep_kernels.topk_gate_with_layout(wide[:0, :256], 8, max_tokens=4)
    assert weights.shape == (0, 8) and indices.shape == (0, 8) and layout.m_indices.shape == (0,)
    assert layout.counts.tolist() == [0] * 256 and (layout.masked_slots == -1).all()


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [96, 4001])  # on 3 SMs the one launch and the two launches
def test_routing_with_fewer_sms_is_identical(num_tokens, monkeypatch):
    from deep_kernels import device

    logits = torch.randn((num_tokens, 256), device="cuda")
    kwargs = dict(scoring="sigmoid", num_groups=8, topk_groups=4, max_tokens=64)
    weights, indices, layout = deep_kernels.topk_gate_with_layout(logits, 8, **kwargs)
    local = deep_kernels.map_global_to_local_experts(indices, 32, 3)
    monkeypatch.setattr(device, "_num_sms_override", 3)
    weights_few, indices_few, layout_few = deep_kernels.topk_gate_with_layout(logits, 8, **kwargs)
    assert_bitwise_equal(weights_few, weights, "weights")
    assert_bitwise_equal(indices_few, indices, "indices")
    _check_layouts_equal(layout_few, layout, "fewer SMs: ")
    assert_bitwise_equal(deep_kernels.map_global_to_local_experts(indices, 32, 3), local, "local experts")
    _check_layouts_equal(deep_kernels.moe_layout(local, 32, 64), reference.moe_layout(local, 32, 64), "local: ")


@pytest.mark.parametrize("num_sms", [132, 114, 3])
def test_fused_plan_fits_one_block_per_sm_and_one_chunk_per_block(num_sms, monkeypatch):
    from deep_kernels import device
    from deep_kernels.moe import routing

    monkeypatch.setattr(device, "_num_sms_override", num_sms)
    for k in range(1, 17):
        largest = fused_max_tokens(k)
        assert largest == num_sms * min(255, 2048 // k)
        for num_tokens in sorted({1, 7, 8, 64, 1000, 1056, 1057, 2112, 2113, 8448, 8449, 16384, largest, largest + 1}):
            tokens_per_block = routing._fused_tokens_per_block(num_tokens, k)
            tile = routing._fused_tile(num_tokens)
            # up to fused_max_tokens(k) the one launch, above it the two
            assert (tokens_per_block is not None) == (num_tokens <= largest), (num_tokens, k)
            if tokens_per_block is not None:
                assert tokens_per_block <= routing._FUSED_MAX_BLOCK_TOKENS
                assert math.ceil(num_tokens / tokens_per_block) <= num_sms
                assert tokens_per_block * k <= tile.block_slots
                # the fewest tokens per block: fewer would need more blocks than SMs
                assert tokens_per_block == routing._FUSED_MIN_BLOCK_TOKENS or \
                    math.ceil(num_tokens / (tokens_per_block - 1)) > num_sms
            # at most two tokens a warp in the few-token tile's blocks, at most two rounds of two tokens a warp in
            # the 16-warp ones, else 32-warp blocks of one token a warp; in the first two a warp holding more than
            # one token gates two at once
            few = routing._FUSED_FEW_TOKENS_TILE
            per_block = math.ceil(num_tokens / num_sms)
            assert tile.warps == (few.warps if per_block <= 2 * few.warps else 16 if per_block <= 64 else 32)
            assert tile.tokens_per_warp == (2 if few.warps < per_block <= 64 else 1)


@pytest.mark.parametrize("k", [0, 17, -1, 2.0, True, "8", None])
def test_fused_max_tokens_rejects_bad_k(k):
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 16\]"):
        fused_max_tokens(k)


@pytest.mark.gpu
def test_topk_gate_with_layout_grid_barrier_across_grid_sizes():
    # T = 64: a block with no token (the -1 fill takes 9 blocks); T = 1056 and 4001: several tokens per warp;
    # T = 16384: the 32-warp blocks.
    # Each launch flips bit 31 of the barrier counter and leaves the lower bits at zero.
    from deep_kernels.moe import layout

    kwargs = dict(scoring="sigmoid", num_groups=8, topk_groups=4)
    for num_tokens, k in ((64, 8), (1, 8), (1056, 7), (4001, 2), (200, 16), (8192, 8), (16384, 8), (64, 8)):
        logits = _gate_logits(num_tokens, 256, torch.float32, ties=num_tokens % 2 == 1)
        for _ in range(2):
            _check_gate_with_layout(logits, k, max_tokens=max(1, num_tokens * k // 256), **kwargs)
        counter = layout.layout_workspace(logits.get_device(), 0)[0].item()
        assert counter & 0x7FFFFFFF == 0, hex(counter)


@pytest.mark.gpu
@pytest.mark.parametrize("num_sms", [132, 5])  # one chunk per block; several chunks per block
def test_moe_layout_grid_barrier_across_grid_sizes(num_sms, monkeypatch):
    # T = 1: one ranking block and a fill-only one; 4001 x 8: 32 blocks (or 7 chunks per block on 5 SMs);
    # 40000 x 8 (several chunks per block on either). Each launch leaves the counter's lower bits at zero.
    from deep_kernels import device
    from deep_kernels.moe import layout

    monkeypatch.setattr(device, "_num_sms_override", num_sms)
    for num_tokens, num_experts, k in ((1, 256, 8), (4001, 256, 8), (40000, 72, 8), (3000, 512, 16)):
        topk_idx = _routed_indices(num_tokens, num_experts, k, torch.int32)
        for _ in range(2):
            _check_layout(topk_idx, num_experts, max_tokens=max(1, num_tokens * k // num_experts))
        counter = layout.layout_workspace(topk_idx.get_device(), 0)[0].item()
        assert counter & 0x7FFFFFFF == 0, hex(counter)


@pytest.mark.gpu
def test_topk_gate_with_layout_full_one_byte_counts(monkeypatch):
    # Every row the same: each block's count of its k experts is all its 255 tokens, the most the blocks' one-byte
    # counts hold (one token more per block takes the two-stage path). Outputs poisoned, written through out=.
    from deep_kernels import device
    from deep_kernels.moe import routing

    monkeypatch.setattr(device, "_num_sms_override", 3)
    most = routing._FUSED_MAX_BLOCK_TOKENS
    assert routing._fused_tokens_per_block(3 * most, 4) == most
    assert routing._fused_tokens_per_block(3 * most + 3, 4) is None
    logits = torch.randn((1, 256), device="cuda").expand(3 * most, 256).contiguous()
    kwargs = dict(scoring="sigmoid", num_groups=8, topk_groups=4, max_tokens=2 * most)
    out = deep_kernels.topk_gate_with_layout(logits, 4, **kwargs)
    for t in (out[0], out[1], *(getattr(out[2], name) for name in LAYOUT_FIELDS)):
        _poison_output(t)
    deep_kernels.topk_gate_with_layout(logits, 4, out=out, **kwargs)
    weights_ref, indices_ref, layout_ref = reference.topk_gate_with_layout(logits, 4, **kwargs)
    assert_bitwise_equal(out[0], weights_ref, "weights")
    assert_bitwise_equal(out[1], indices_ref, "indices")
    _check_layouts_equal(out[2], layout_ref)
    assert sorted(layout_ref.counts.unique().tolist()) == [0, 3 * most]


@pytest.mark.gpu
# The one launch, and the two launches (4001 tokens on 3 SMs: more than 255 a block)
@pytest.mark.parametrize("num_tokens,num_sms", [(128, None), (4001, 3)])
def test_topk_gate_with_layout_graph_replays_new_inputs(num_tokens, num_sms, monkeypatch):
    from deep_kernels import device
    from deep_kernels.moe import routing

    if num_sms is not None:
        monkeypatch.setattr(device, "_num_sms_override", num_sms)
    assert (routing._fused_tokens_per_block(num_tokens, 8) is None) == (num_sms is not None)
    kwargs = dict(scoring="sigmoid", num_groups=8, topk_groups=4, max_tokens=num_tokens // 8)
    logits = torch.randn((num_tokens, 256), device="cuda")
    deep_kernels.topk_gate_with_layout(logits, 8, **kwargs)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, indices, layout = deep_kernels.topk_gate_with_layout(logits, 8, **kwargs)
    outputs = (weights, indices) + tuple(getattr(layout, name) for name in LAYOUT_FIELDS)
    for replay in range(3):  # the arrival counter must be back at zero for every replay
        logits.copy_(_gate_logits(num_tokens, 256, torch.float32, ties=replay == 1))
        for t in outputs:
            _poison_output(t)
        graph.replay()
        torch.cuda.synchronize()
        weights_ref, indices_ref, layout_ref = reference.topk_gate_with_layout(logits, 8, **kwargs)
        assert_bitwise_equal(weights, weights_ref, "weights")
        assert_bitwise_equal(indices, indices_ref, "indices")
        _check_layouts_equal(layout, layout_ref, f"replay {replay}: ")
    _check_gate_with_layout(logits, 8, **kwargs)  # eager calls still work after the replays


@pytest.mark.gpu
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid", "sqrtsoftplus"])
def test_topk_gate_with_layout_nan_and_inf_logits(scoring):
    logits = _with_special_values(torch.randn((300, 64), device="cuda"), 0.2)
    for kwargs in (dict(), dict(num_groups=8, topk_groups=3)):
        weights_ref, indices_ref, layout_ref = reference.topk_gate_with_layout(logits, 9, scoring, **kwargs)
        weights, indices, layout = deep_kernels.topk_gate_with_layout(logits, 9, scoring, **kwargs)
        assert_bitwise_equal(indices, indices_ref, "indices")
        assert ((indices >= 0) & (indices < 64)).all()
        assert (indices.sort(dim=1).values.diff(dim=1) > 0).all()
        assert torch.equal(weights.isnan(), weights_ref.isnan())
        assert torch.equal(weights.nan_to_num(0.0), weights_ref.nan_to_num(0.0))
        _check_layouts_equal(layout, layout_ref)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,num_groups,topk_groups,k,scoring,dtype,num_tokens",
                         [(*gate, (torch.float32, torch.bfloat16)[i % 2], (1, 4001)[i // 2 % 2])
                          for i, gate in enumerate(GATES)])
def test_topk_gate_backward_matches_reference(num_experts, num_groups, topk_groups, k, scoring, dtype, num_tokens):
    logits = _gate_logits(num_tokens, num_experts, dtype, ties=num_tokens == 1)
    _, indices = deep_kernels.topk_gate(logits, k, scoring, num_groups=num_groups, topk_groups=topk_groups)
    indices[::7, k // 2] = -1  # dropped slots: a score of 0, no gradient
    grad_weights = torch.randn((num_tokens, k), device="cuda")
    for renormalize, factor in ((True, 2.5), (False, 1.0)):
        expected = reference.topk_gate_backward(grad_weights, logits, indices, scoring, renormalize, factor)
        grad = deep_kernels.topk_gate_backward(grad_weights, logits, indices, scoring, renormalize, factor)
        assert_bitwise_equal(grad, expected, "grad_logits")
        out = poison_(torch.empty((num_tokens, num_experts), device="cuda"))
        again = deep_kernels.topk_gate_backward(grad_weights, logits, indices, scoring, renormalize, factor, out=out)
        assert again is out
        assert_bitwise_equal(out, expected, "grad_logits (out=)")


@pytest.mark.gpu
def test_topk_gate_backward_graph_replays_new_inputs():
    logits = torch.randn((4001, 256), device="cuda")
    _, indices = deep_kernels.topk_gate(logits, 8, "sigmoid", num_groups=8, topk_groups=4)
    grad_weights = torch.randn((4001, 8), device="cuda")
    out = torch.empty((4001, 256), device="cuda")
    deep_kernels.topk_gate_backward(grad_weights, logits, indices, "sigmoid", out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.topk_gate_backward(grad_weights, logits, indices, "sigmoid", out=out)
    grad_weights.normal_()
    poison_(out)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out, reference.topk_gate_backward(grad_weights, logits, indices, "sigmoid"), "grad_logits")


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype,shape,num_local,rank", [
    (torch.int64, (4001, 8), 32, 5), (torch.int32, (1, 1), 8, 0), (torch.int32, (8001, 9), 48, 7),
    (torch.int64, (0, 8), 8, 1)])
def test_map_global_to_local_experts_matches_reference(index_dtype, shape, num_local, rank):
    topk_idx = torch.randint(-1, 8 * num_local + 1, shape, device="cuda").to(index_dtype)
    if index_dtype == torch.int64 and topk_idx.numel():
        topk_idx.view(-1)[0] = rank * num_local + 2**32  # a 64-bit index whose low bits look local
    expected = reference.map_global_to_local_experts(topk_idx, num_local, rank)
    assert_bitwise_equal(deep_kernels.map_global_to_local_experts(topk_idx, num_local, rank), expected, "local")
    out = _poison_output(torch.empty(shape, dtype=torch.int32, device="cuda"))
    assert deep_kernels.map_global_to_local_experts(topk_idx, num_local, rank, out=out) is out
    assert_bitwise_equal(out, expected, "local (out=)")
