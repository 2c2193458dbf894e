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
"""

import torch
import torch.nn.functional as F

import deep_kernels
from deep_kernels.benchmarks.fp8_gemm import FP8_PEAK_TFLOPS
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.nn import MoE
from deep_kernels.reference.nn import moe_forward
from deep_kernels.testing import calc_diff
from deep_kernels.testing.bench import time_kernels_us
from deep_kernels.testing.moe_layer import moe_layer_tokens, moe_layer_weights

HIDDEN, INTERMEDIATE, NUM_EXPERTS = 7168, 2048, 256
GATE = dict(top_k=8, num_groups=8, topk_groups=4, routed_scaling_factor=2.5)
# (T, mode, timing)
CASES = ((128, "masked", "graph"), (8192, "contiguous", "eager"))
PEER = ("plain torch, cuBLAS blockwise FP8: a loop over the experts (torch._scaled_mm, 1x128 x 128x128 scales), "
        "eager; speedup_vs_bf16: the same loop with F.linear in bf16")
# NOTE: 10 runs of each in turns: the peers launch thousands of kernels a run, and the profiler keeps every one.
REPS = 10


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
            # NOTE: cuBLAS's blockwise scaling takes M a multiple of 4 only: the rows padded with token 0's, whose
            # products are dropped.
            rows = F.pad(tokens, (0, -count % 4))
            projected = torch._scaled_mm(codes[rows], gate_up_weight[expert].t(),
                                         scale_a=scales[rows].t().contiguous().t(),
                                         scale_b=gate_up_scales[expert].t(), out_dtype=torch.bfloat16)
            gate, up = projected.chunk(2, dim=-1)
            activated, activated_scales = torch_cast_to_fp8(F.silu(gate) * up)
            expert_out = torch._scaled_mm(activated, down_weight[expert].t(), scale_a=activated_scales,
                                          scale_b=down_scales[expert].t(), out_dtype=torch.bfloat16)
            out.index_add_(0, tokens, expert_out[:count].float() * weights_by_expert[start:start + count])
        start += count
    return out.bfloat16()


def captured_forward(module: MoE, x: torch.Tensor, mode: str):
    """(replay, output): module(x, mode) captured in a CUDA graph, after an eager call (which compiles every kernel)
    and a warm-up on a side stream (as torch's CUDA-graph notes advise); replay() reruns it on x's contents."""
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


def run(ctx: BenchContext) -> list:
    weights = moe_layer_weights(HIDDEN, INTERMEDIATE, NUM_EXPERTS)
    module = MoE.from_float(**weights, **GATE)
    rows = []
    for num_tokens, mode, timing in CASES:
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
        reference = lambda quantize: moe_forward(x, **weights, **GATE, logits=module.router_logits(x),
                                                 quantize=quantize)
        exact = reference(False)
        check = (f"calc_diff={calc_diff(out, reference(True)):.1e} against the kernels' activation formats, "
                 f"{calc_diff(out, exact):.1e} against float64; the cuBLAS FP8 peer {calc_diff(peer(), exact):.1e} "
                 f"against float64")
        us, peer_us, bf16_us = time_kernels_us([ours, peer, bf16_peer], ctx.flusher, warmup=3, reps=REPS)

        slots = num_tokens * module.top_k
        flops = 2 * slots * 3 * HIDDEN * INTERMEDIATE
        expert_bytes = 3 * HIDDEN * INTERMEDIATE + 4 * (3 * HIDDEN * INTERMEDIATE // 128 ** 2)
        num_bytes = _active_experts(module, x) * expert_bytes + 2 * 2 * num_tokens * HIDDEN
        bound_us = max(flops / FP8_PEAK_TFLOPS / 1e6, num_bytes / ctx.copy_gbps / 1e3)
        layout = (f"masked layout, capacity {num_tokens} per expert" if mode == "masked"
                  else "contiguous layout (segments padded to 128 rows)")
        rows.append({
            "op": "MoE.forward", "shape": {"t": num_tokens, "world_size": 1, "pass": "forward", "mode": timing},
            "config": f"{layout}; {'CUDA graph replay' if timing == 'graph' else 'eager'}; FP8 weights with 128x128 "
                      "block scales, activations 1x128; routing weights applied in the SwiGLU cast",
            "us": round(us, 2), "tflops": round(flops / us / 1e6, 1), "gbps": round(num_bytes / us / 1e3, 1),
            "roofline_fraction": round(bound_us / us, 3),
            "peer": PEER, "peer_us": round(peer_us, 2), "speedup": round(peer_us / us, 3),
            "bf16_us": round(bf16_us, 2), "speedup_vs_bf16": round(bf16_us / us, 3), "check": check,
        })
    return rows
