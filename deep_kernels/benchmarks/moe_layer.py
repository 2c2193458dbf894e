"""Suite `moe_layer`: the forward of the DeepSeek-V3 MoE layer (deep_kernels.nn.MoE: hidden 7168, expert
intermediate 2048, 256 experts, top-8 with 8 groups / top-4 groups, sigmoid scores with a correction bias, scaling
2.5) at T = 128 (decode: masked layout, the whole forward captured in a CUDA graph and replayed) and T = 8192
(prefill: contiguous layout, eager), against the same layer in plain torch with cuBLAS's blockwise FP8 GEMM
(torch._scaled_mm with 1x128 activation and 128x128 weight scales, a loop over the experts: torch_fp8_moe) on the
module's FP8 weights, and with cuBLAS BF16 GEMMs (torch_bf16_moe, `speedup_vs_bf16`) on the same values, the three
timed in turns in the same run.

Times are sums of profiled kernel durations with L2 flushed before each run, so the peers' host work (one host
sync, a handful of launches per expert) does not count against them: run eagerly, their figures are what a CUDA
graph of the same kernels would replay (they cannot be captured as they are: the expert loop needs the counts on
the host). Figures count the routed slots: flops
2 * T * k * 3 * H * I; bytes: the FP8 weights and scales of every expert that receives a slot, x and the output.
The weights are FP8-exact (deep_kernels.testing.moe_layer), so the module and the peer use the same values.
Check: calc_diff of the module's output against the float64 reference with the kernels' activation formats (the
tests' bound), and against the plain float64 reference (the FP8 activations' own error).

Forward + backward at T = 8192 (training): deep_kernels.nn.moe_layer on the module's FP8 weights with FP32 master
weights of the same values, differentiable in x, the router and the masters, against torch_fp8_moe_training (the
FP8 peer's forward and its backward in plain torch), timed in turns; flops three times the forward's; bytes the FP8
weights read twice, the FP32 weight gradients written, x, the output and their gradients. Check: calc_diff of the
output and every gradient against the peer's (the tests bound both against float64 autograd).
"""

import torch
import torch.nn.functional as F

import deep_kernels
from deep_kernels.benchmarks.fp8_gemm import FP8_PEAK_TFLOPS
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.nn import MoE, moe_layer
from deep_kernels.nn.routed_experts import masked_capacity
from deep_kernels.reference.nn import moe_forward
from deep_kernels.testing import calc_diff
from deep_kernels.testing.bench import time_kernels_us
from deep_kernels.testing.moe_layer import moe_layer_tokens, moe_layer_weights

HIDDEN, INTERMEDIATE, NUM_EXPERTS = 7168, 2048, 256
# One expert's FP8 weights and their scales.
EXPERT_BYTES = 3 * HIDDEN * INTERMEDIATE + 4 * (3 * HIDDEN * INTERMEDIATE // 128 ** 2)
GATE = dict(top_k=8, num_groups=8, topk_groups=4, routed_scaling_factor=2.5)
# (T, mode, timing)
CASES = ((128, "masked", "graph"), (8192, "contiguous", "eager"))
PEER = ("plain torch, cuBLAS blockwise FP8: a loop over the experts (torch._scaled_mm, 1x128 x 128x128 scales), "
        "eager; speedup_vs_bf16: the same loop with F.linear in bf16")
# NOTE: 10 runs of each in turns: the peers launch thousands of kernels a run, and the profiler keeps every one.
REPS = 10
# The forward + backward row (prefill / training) and its runs (the peer launches about ten thousand kernels a run).
TRAINING_TOKENS = 8192
TRAINING_REPS = 5
CHECKED_EXPERTS = 16
TRAINING_PEER = ("plain torch: the FP8 peer's forward and its backward per expert, torch._scaled_mm blockwise for the "
                 "input gradients (FP8 weights transposed per step), bf16 cuBLAS GEMMs with FP32 output for the "
                 "weight gradients, autograd through the routing")


def _torch_route(x: torch.Tensor, router_weight: torch.Tensor, correction_bias: torch.Tensor, num_experts: int,
                 top_k: int, num_groups: int, topk_groups: int, routed_scaling_factor: float) -> tuple:
    """DeepSeek-V3's routing in plain torch: the router in bf16, sigmoid scores in FP32, group-limited top-k,
    renormalized weights; the slots sorted by expert. Returns (token of each sorted slot, its weight [S, 1], the
    slots per expert as a host list: one host sync)."""
    num_tokens = x.shape[0]
    scores = F.linear(x, router_weight).float().sigmoid()
    keys = scores + correction_bias
    group_keys = keys.view(num_tokens, num_groups, -1).topk(2, dim=-1).values.sum(dim=-1)
    kept_groups = torch.zeros_like(group_keys, dtype=torch.bool)
    kept_groups.scatter_(1, group_keys.topk(topk_groups, dim=-1).indices, True)
    # NOTE: logical_not, not ~: the benchmark timer tells its L2 flushes apart by their bitwise_not kernel.
    keys = keys.masked_fill(kept_groups.repeat_interleave(num_experts // num_groups, dim=1).logical_not(), float("-inf"))
    indices = keys.topk(top_k, dim=-1).indices
    weights = scores.gather(1, indices)
    weights = weights / weights.sum(dim=-1, keepdim=True) * routed_scaling_factor
    order = indices.flatten().argsort(stable=True)
    counts = torch.bincount(indices.flatten(), minlength=num_experts).tolist()
    return order // top_k, weights.flatten()[order].unsqueeze(1), counts


def torch_bf16_moe(x: torch.Tensor, router_weight: torch.Tensor, correction_bias: torch.Tensor,
                   gate_up_weight: torch.Tensor, down_weight: torch.Tensor, top_k: int, num_groups: int,
                   topk_groups: int, routed_scaling_factor: float) -> torch.Tensor:
    """The layer in plain torch as DeepSeek-V3's inference code writes it, bf16 weights and activations: the
    routing of _torch_route, then per expert two F.linear calls around SwiGLU; the weighted rows added in FP32, the
    sum rounded to bf16."""
    num_tokens, hidden = x.shape
    tokens_by_expert, weights_by_expert, counts = _torch_route(
        x, router_weight, correction_bias, gate_up_weight.shape[0], top_k, num_groups, topk_groups,
        routed_scaling_factor)
    rows = x[tokens_by_expert]
    out = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            gate, up = F.linear(rows[start:start + count], gate_up_weight[expert]).chunk(2, dim=-1)
            expert_out = F.linear(F.silu(gate) * up, down_weight[expert])
            weighted = expert_out.float() * weights_by_expert[start:start + count]
            out.index_add_(0, tokens_by_expert[start:start + count], weighted)
        start += count
    return out.bfloat16()


def torch_cast_to_fp8(x: torch.Tensor) -> tuple:
    """Rows [M, K] cast to e4m3 per 1 x 128 group in plain torch (scale amax / 448, amax clamped at 1e-4): (codes
    [M, K], FP32 scales [M, K / 128] column-major, as torch._scaled_mm's blockwise scale_a takes them)."""
    m, k = x.shape
    groups = x.float().view(m, k // 128, 128)
    scales = groups.abs().amax(dim=-1).clamp(min=1e-4) / 448.0
    codes = (groups / scales.unsqueeze(-1)).to(torch.float8_e4m3fn).view(m, k)
    return codes, scales.t().contiguous().t()


def _rows_for_scaled_mm(rows: torch.Tensor) -> torch.Tensor:
    """rows [M, ...] padded with zero rows to a multiple of 4 (cuBLAS's blockwise scaling takes M a multiple of 4
    only; the padded products are dropped)."""
    return F.pad(rows, (0, 0) * (rows.dim() - 1) + (0, -rows.shape[0] % 4))


def _blockwise_scaled_mm(a: tuple, weight: torch.Tensor, weight_scales: torch.Tensor) -> torch.Tensor:
    """bf16 [M, N] = a @ weight^T by torch._scaled_mm: a = (e4m3 [M, K], FP32 [M, K / 128] column-major) and the
    weight e4m3 [N, K] with its 128 x 128 block scales [N / 128, K / 128]."""
    return torch._scaled_mm(a[0], weight.t(), scale_a=a[1], scale_b=weight_scales.t(), out_dtype=torch.bfloat16)


def _fp8_expert_forward(codes: tuple, gate_up: tuple, down: tuple) -> tuple:
    """One expert of torch_fp8_moe on its gathered FP8 rows (codes, scales; M a multiple of 4): (its up-projection
    bf16 [M, 2I], the SwiGLU bf16 [M, I], its down-projection bf16 [M, H])."""
    projected = _blockwise_scaled_mm(codes, *gate_up)
    gate, up = projected.chunk(2, dim=-1)
    activated = F.silu(gate) * up
    return projected, activated, _blockwise_scaled_mm(torch_cast_to_fp8(activated), *down)


def torch_fp8_moe(x: torch.Tensor, router_weight: torch.Tensor, correction_bias: torch.Tensor, gate_up: tuple,
                  down: tuple, top_k: int, num_groups: int, topk_groups: int,
                  routed_scaling_factor: float) -> torch.Tensor:
    """The layer in plain torch with cuBLAS's blockwise-scaled FP8 GEMM (torch._scaled_mm, 1x128 activation and
    128x128 weight scales, as the fp8_gemm suite calls it) for the expert GEMMs, on the module's FP8 weights
    (gate_up = (e4m3 [E, 2I, H], FP32 [E, 2I / 128, H / 128]), down likewise): the routing of _torch_route, the
    tokens cast to FP8 once, then per expert the gathered rows' up-projection, SwiGLU in bf16, its FP8 cast and
    the down-projection; the weighted rows added in FP32, the sum rounded to bf16."""
    num_tokens, hidden = x.shape
    (gate_up_weight, gate_up_scales), (down_weight, down_scales) = gate_up, down
    tokens_by_expert, weights_by_expert, counts = _torch_route(
        x, router_weight, correction_bias, gate_up_weight.shape[0], top_k, num_groups, topk_groups,
        routed_scaling_factor)
    codes, scales = torch_cast_to_fp8(x)
    out = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            tokens = tokens_by_expert[start:start + count]
            rows = _rows_for_scaled_mm(tokens)  # padded with token 0
            _, _, expert_out = _fp8_expert_forward(
                (codes[rows], scales[rows].t().contiguous().t()), (gate_up_weight[expert], gate_up_scales[expert]),
                (down_weight[expert], down_scales[expert]))
            out.index_add_(0, tokens, expert_out[:count].float() * weights_by_expert[start:start + count])
        start += count
    return out.bfloat16()


def _transposed_block_scaled(weight: torch.Tensor, scales: torch.Tensor) -> tuple:
    """(W^T e4m3 [K, N], its scales [K / 128, N / 128]) of an expert's e4m3 [N, K] weight with 128 x 128 block
    scales [N / 128, K / 128]: exact (a block keeps its scale)."""
    return weight.t().contiguous(), scales.t().contiguous()


def _mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out = a @ b of bf16 a and b, accumulated in FP32 and written in out's dtype by cuBLAS (on the CPU, which has
    no such kernel, through a temporary)."""
    if not out.is_cuda:
        out.copy_(a.float() @ b.float())
    elif out.dtype == a.dtype:
        torch.mm(a, b, out=out)
    else:
        torch.mm(a, b, out_dtype=out.dtype, out=out)


def _swiglu_backward(projected: torch.Tensor, grad_activated: torch.Tensor) -> torch.Tensor:
    """bf16 [M, 2I]: the gradient of silu(gate) * up at projected = [gate | up] (bf16), computed in FP32."""
    gate, up = projected.float().chunk(2, dim=-1)
    grad = grad_activated.float()
    sigmoid = torch.sigmoid(gate)
    grad_gate = grad * up * sigmoid * (1 + gate * (1 - sigmoid))
    return torch.cat([grad_gate, grad * gate * sigmoid], dim=-1).bfloat16()


def torch_fp8_moe_training(x: torch.Tensor, router_weight: torch.Tensor, correction_bias: torch.Tensor,
                           gate_up: tuple, down: tuple, grad_out: torch.Tensor, top_k: int, num_groups: int,
                           topk_groups: int, routed_scaling_factor: float, weight_dtype=torch.float32) -> tuple:
    """torch_fp8_moe's forward and its backward in plain torch, as a training step runs them: (output, gradient of x,
    of router_weight, of the expert weights [E, 2I, H] and [E, H, I] in weight_dtype) for the output gradient
    grad_out [T, H] bf16.

    Per expert: the output rows' gradient gathered (bf16) and times the routing weight; the input gradients by
    torch._scaled_mm blockwise (the gradient rows cast to FP8 1 x 128, the FP8 weights transposed with their
    128 x 128 scale blocks); SwiGLU's backward in FP32; the weight gradients by bf16 GEMMs with an FP32 accumulator
    written in weight_dtype (torch._scaled_mm takes no 1 x 128 scales on both operands); the routing weights'
    gradients (each slot's output row dotted with its gradient) through the routing by torch.autograd."""
    num_tokens, hidden = x.shape
    (gate_up_weight, gate_up_scales), (down_weight, down_scales) = gate_up, down
    num_experts = gate_up_weight.shape[0]
    with torch.enable_grad():
        routed_x, routed_router = x.detach().requires_grad_(), router_weight.detach().requires_grad_()
        tokens_by_expert, weights_by_expert, counts = _torch_route(
            routed_x, routed_router, correction_bias, num_experts, top_k, num_groups, topk_groups,
            routed_scaling_factor)
    codes, scales = torch_cast_to_fp8(x)
    out = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=x.device)
    grad_x = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=x.device)
    grad_slot_weights = torch.empty_like(weights_by_expert)
    grad_gate_up = torch.empty(gate_up_weight.shape, dtype=weight_dtype, device=x.device)
    grad_down = torch.empty(down_weight.shape, dtype=weight_dtype, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            grad_gate_up[expert].zero_()
            grad_down[expert].zero_()
            continue
        tokens = tokens_by_expert[start:start + count]
        slot_weights = weights_by_expert[start:start + count].detach()
        rows = _rows_for_scaled_mm(tokens)  # padded with token 0
        expert_gate_up, expert_down = (gate_up_weight[expert], gate_up_scales[expert]), (down_weight[expert],
                                                                                         down_scales[expert])
        projected, activated, expert_out = _fp8_expert_forward(
            (codes[rows], scales[rows].t().contiguous().t()), expert_gate_up, expert_down)
        out.index_add_(0, tokens, expert_out[:count].float() * slot_weights)
        # Backward.
        grad_rows = grad_out[tokens]
        grad_slot_weights[start:start + count] = (grad_rows.float() * expert_out[:count].float()).sum(-1,
                                                                                                     keepdim=True)
        grad_expert_out = (grad_rows.float() * slot_weights).bfloat16()
        grad_activated = _blockwise_scaled_mm(torch_cast_to_fp8(_rows_for_scaled_mm(grad_expert_out)),
                                              *_transposed_block_scaled(*expert_down))
        grad_projected = _swiglu_backward(projected[:count], grad_activated[:count])
        grad_tokens = _blockwise_scaled_mm(torch_cast_to_fp8(_rows_for_scaled_mm(grad_projected)),
                                           *_transposed_block_scaled(*expert_gate_up))
        grad_x.index_add_(0, tokens, grad_tokens[:count].float())
        _mm_into(grad_down[expert], grad_expert_out.t(), activated[:count])
        _mm_into(grad_gate_up[expert], grad_projected.t(), x[tokens])
        start += count
    grad_routed_x, grad_router = torch.autograd.grad(weights_by_expert, (routed_x, routed_router), grad_slot_weights)
    grad_x += grad_routed_x
    return out.bfloat16(), grad_x.bfloat16(), grad_router, grad_gate_up, grad_down


def captured_forward(module, x: torch.Tensor, mode: str):
    """(replay, output): module(x, mode) (an nn.MoE, or a function of the same arguments) captured in a CUDA graph,
    after an eager call (which compiles every kernel) and a warm-up on a side stream (as torch's CUDA-graph notes
    advise); replay() reruns it on x's contents."""
    module(x, mode)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        module(x, mode)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = module(x, mode)
    return graph.replay, out


def _active_experts(module: MoE, x: torch.Tensor) -> int:
    """Experts that receive at least one slot (their weights are read)."""
    _, indices = deep_kernels.topk_gate(module.router_logits(x), module.top_k, module.scoring, module.correction_bias,
                                        module.num_groups, module.topk_groups, module.renormalize,
                                        module.routed_scaling_factor)
    return indices.unique().numel()


def training_step(x: torch.Tensor, module: MoE, master_weights: dict, grad_out: torch.Tensor):
    """A function running the layer's forward and backward as training does (moe_layer on the module's FP8 weights,
    differentiable in x, the router and the master weights): returns (output, gradients of x, the router, the
    expert weights)."""
    x = x.detach().requires_grad_()
    router_weight = module.router_weight.detach().requires_grad_()
    gate_up_weight, down_weight = (master_weights[name].requires_grad_() for name in ("gate_up_weight", "down_weight"))

    def step():
        out = moe_layer(x, router_weight, module.correction_bias, gate_up_weight, down_weight, **GATE,
                        gate_up=(module.gate_up_weight, module.gate_up_scales),
                        down=(module.down_weight, module.down_scales))
        return (out, *torch.autograd.grad(out, (x, router_weight, gate_up_weight, down_weight), grad_out))
    return step


def _forward_row(ctx: BenchContext, module: MoE, weights: dict, num_tokens: int, mode: str, timing: str) -> dict:
    x = moe_layer_tokens(num_tokens, HIDDEN)
    if timing == "graph":
        ours, out = captured_forward(module, x, mode)
        ours()
    else:
        ours = lambda: module(x, mode)
        out = ours()
    gate_up, down = (module.gate_up_weight, module.gate_up_scales), (module.down_weight, module.down_scales)
    peer = lambda: torch_fp8_moe(x, module.router_weight, module.correction_bias, gate_up, down, **GATE)
    bf16_peer = lambda: torch_bf16_moe(x, **weights, **GATE)
    reference = lambda quantize: moe_forward(x, **weights, **GATE, logits=module.router_logits(x), quantize=quantize)
    exact = reference(False)
    check = (f"calc_diff={calc_diff(out, reference(True)):.1e} against the kernels' activation formats, "
             f"{calc_diff(out, exact):.1e} against float64; the cuBLAS FP8 peer {calc_diff(peer(), exact):.1e} "
             f"against float64")
    us, peer_us, bf16_us = time_kernels_us([ours, peer, bf16_peer], ctx.flusher, warmup=3, reps=REPS)

    flops = 2 * num_tokens * module.top_k * 3 * HIDDEN * INTERMEDIATE
    num_bytes = _active_experts(module, x) * EXPERT_BYTES + 2 * 2 * num_tokens * HIDDEN
    layout = (f"masked layout, capacity {masked_capacity(num_tokens, None)} per expert" if mode == "masked"
              else "contiguous layout (segments padded to 128 rows)")
    return {
        "op": "MoE.forward", "shape": {"t": num_tokens, "world_size": 1, "pass": "forward", "mode": timing},
        "config": f"{layout}; {'CUDA graph replay' if timing == 'graph' else 'eager'}; FP8 weights with 128x128 "
                  "block scales, activations 1x128; routing weights applied in the SwiGLU cast",
        **_figures(ctx, us, flops, num_bytes), "peer": PEER, "peer_us": round(peer_us, 2),
        "speedup": round(peer_us / us, 3), "bf16_us": round(bf16_us, 2), "speedup_vs_bf16": round(bf16_us / us, 3),
        "check": check,
    }


def _training_row(ctx: BenchContext, module: MoE, master_weights: dict, num_tokens: int) -> dict:
    x = moe_layer_tokens(num_tokens, HIDDEN)
    grad_out = moe_layer_tokens(num_tokens, HIDDEN, seed=4)
    ours = training_step(x, module, master_weights, grad_out)
    gate_up, down = (module.gate_up_weight, module.gate_up_scales), (module.down_weight, module.down_scales)
    peer = lambda: torch_fp8_moe_training(x, module.router_weight, module.correction_bias, gate_up, down, grad_out,
                                          **GATE)
    diffs = [f"{name} {calc_diff(mine, theirs):.1e}" for name, mine, theirs
             in zip(("output", "x", "router", "gate_up", "down"), _checked_part(ours()), _checked_part(peer()))]
    check = (f"calc_diff against the cuBLAS FP8 peer (expert weights: the first {CHECKED_EXPERTS} experts'): "
             f"{', '.join(diffs)}")
    us, peer_us = time_kernels_us([ours, peer], ctx.flusher, warmup=2, reps=TRAINING_REPS)

    flops = 3 * 2 * num_tokens * module.top_k * 3 * HIDDEN * INTERMEDIATE  # forward, input and weight gradients
    # Every expert's FP8 weights read twice (forward, input gradients), its FP32 gradients written once.
    num_bytes = 2 * NUM_EXPERTS * EXPERT_BYTES + 4 * NUM_EXPERTS * 3 * HIDDEN * INTERMEDIATE + 4 * 2 * num_tokens * HIDDEN
    return {
        "op": "moe_layer", "shape": {"t": num_tokens, "world_size": 1, "pass": "forward+backward", "mode": "eager"},
        "config": "contiguous layout; FP8 weights with 128x128 block scales (input gradients through the transposed "
                  "weights), gradients cast 1x128; weight gradients by the k-grouped FP8 GEMM (1x128 scales along "
                  "the tokens) in FP32, the master weights' dtype",
        **_figures(ctx, us, flops, num_bytes), "peer": TRAINING_PEER, "peer_us": round(peer_us, 2),
        "speedup": round(peer_us / us, 3), "check": check,
    }


def _checked_part(results: tuple) -> tuple:
    """(output, gradients of x and the router, of the first CHECKED_EXPERTS experts' weights) of a training step's
    results: two steps' full weight gradients (45 GB each in FP32) do not fit beside the weights."""
    out, grad_x, grad_router, grad_gate_up, grad_down = results
    return (out.detach(), grad_x, grad_router, grad_gate_up[:CHECKED_EXPERTS].clone(),
            grad_down[:CHECKED_EXPERTS].clone())


def _figures(ctx: BenchContext, us: float, flops: int, num_bytes: int) -> dict:
    bound_us = max(flops / FP8_PEAK_TFLOPS / 1e6, num_bytes / ctx.copy_gbps / 1e3)
    return {"us": round(us, 2), "tflops": round(flops / us / 1e6, 1), "gbps": round(num_bytes / us / 1e3, 1),
            "roofline_fraction": round(bound_us / us, 3)}


def run(ctx: BenchContext) -> list:
    weights = moe_layer_weights(HIDDEN, INTERMEDIATE, NUM_EXPERTS)
    module = MoE.from_float(**weights, **GATE)
    rows = [_forward_row(ctx, module, weights, num_tokens, mode, timing) for num_tokens, mode, timing in CASES]
    # FP32 master weights of the same values, in place of the bf16 ones (memory: both would not fit beside the
    # FP32 gradients).
    master_weights = {}
    for name in ("gate_up_weight", "down_weight"):
        master_weights[name] = weights.pop(name).float()
    rows.append(_training_row(ctx, module, master_weights, TRAINING_TOKENS))
    return rows
