"""Suite `host`: host time per cached call of the public functions, against torch's eager x.add_(1) in the same
process, timed in turns.

How the GPU work is kept out: each round first queues torch.cuda._sleep, a kernel that spins long enough to cover
the round, then times CALLS back-to-back calls on the host (perf_counter around the loop); they only enqueue behind
the spinning kernel (CALLS launches stay far below the launch queue's depth, so the host never waits for a free
slot), and the round ends with a synchronization outside the timed part. The GPU thus runs none of the timed calls'
kernels while they are issued, whatever their size. Each figure is the median over ROUNDS rounds of the time per
call; rounds of ours and of add_ alternate, so that both see the same host (clock, other processes).

Rows: fp8_gemm_nt at the issue's 64 x 4096 x 7168 (split-K) and a decode 1 x 2112 x 7168, the launch of the first as
the previous path made it (Kernel.launch encoding its 4 tensor maps on every call) and two parts of its cached call
(the signature look-up's metadata reads, the prepared launch alone); bf16_gemm_nt at 64 x 4096 x 7168;
m_grouped_fp8_gemm_nt_masked at a decode step of 8 experts (128 rows each at most, N = 4096, K = 7168) and
fp8_fp4_gemm_nt at 16 x 4096 x 7168 (MXFP4 weights), each cached and with its launches encoded on every call as
before; m_grouped_fp8_fp4_gemm_nt_masked at the same decode step on prepared MXFP4 weights, cached and as before
(validated in full and encoded on every call); k_grouped_fp8_gemm_nt_contiguous at a weight gradient of 8 experts
(4096 tokens in all, out x in = 7168 x 2048, accumulating into d), cached and with its launches encoded on every
call as before; topk_gate and topk_gate_with_layout at DeepSeek-V3's routing (256 experts, 8 groups, top 8) for 128
tokens, with and without the masked layout, allocating and into out=, and once more with the GPU not held (the fused
gate is a cooperative launch, which may wait for the GPU); moe_layout of those indices and per_token_cast_to_fp8 of
a decode activation; and, for the record, torch.empty of a small CUDA tensor (what each output allocation costs).
`speedup` is add_'s time over ours: the issue's targets are speedup >= 1 / 1.3 for fp8_gemm_nt and >= 1 / 1.5 for
topk_gate_with_layout.
"""

import statistics
import time

import torch

import deep_kernels
from deep_kernels import call_cache, gemm, k_grouped_gemm
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.jit.runtime import current_raw_stream
from deep_kernels.reference.quant import per_block_cast_to_fp8
from deep_kernels.testing.fp4_gemm import make_fp4_gemm_inputs, mxfp4_weights
from deep_kernels.testing.grouped import make_masked_inputs
from deep_kernels.testing.wgrad import make_k_grouped_inputs

CALLS = 100
ROUNDS = 21
# Spin cycles queued before each round: about 10 ms at the H200's clock, more than CALLS calls take to issue.
SPIN_CYCLES = 20_000_000
PEER = "torch x.add_(1), eager (a 16 x 256 bf16 tensor)"


def _round_us(fn, behind_spin: bool = True) -> float:
    """Host microseconds per call of CALLS back-to-back calls of fn, queued behind a spinning kernel (or not)."""
    if behind_spin:
        torch.cuda._sleep(SPIN_CYCLES)
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / CALLS * 1e6


def host_us_in_turns(fns: list, behind_spin: bool = True) -> list:
    """The median over ROUNDS rounds of _round_us of each of fns, the rounds of fns taken in turns."""
    for fn in fns:  # warm-up: plans, kernels and encodings cached
        fn()
    torch.cuda.synchronize()
    rounds = [[] for _ in fns]
    for _ in range(ROUNDS):
        for times, fn in zip(rounds, fns):
            times.append(_round_us(fn, behind_spin))
    return [statistics.median(times) for times in rounds]


def _row(op: str, shape: dict, config: str, us: float, peer_us: float) -> dict:
    return {"op": op, "shape": shape, "config": config, "us": round(us, 2), "tflops": None, "gbps": None,
            "roofline_fraction": None, "peer": PEER, "peer_us": round(peer_us, 2),
            "speedup": round(peer_us / us, 3), "check": f"host us per call, median of {ROUNDS} rounds of {CALLS}"}


def _gemm_call(m: int, n: int, k: int, part: str = "call"):
    """A cached fp8_gemm_nt call ("call"), or a part of it: "encode_each_call", the launch of its prepared call as
    the path before cached encodings made it (tensor maps encoded by every launch); "signature", the call
    signature alone (the metadata of its six arguments); "prepared_launch", the cached launch alone (on the current
    stream)."""
    a = deep_kernels.per_token_cast_to_fp8(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    b = per_block_cast_to_fp8(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if part == "call":
        return lambda: deep_kernels.fp8_gemm_nt(a, b, d)
    deep_kernels.fp8_gemm_nt(a, b, d)
    (call,) = [c for c in gemm._prepared_calls.values() if (c.m, c.n, c.k) == (m, n, k)]
    (a, sfa), (b, sfb) = a, b
    if part == "signature":
        return lambda: gemm._gemm_signature(a, sfa, b, sfb, d, None, gemm.BLOCK_SCALED)
    if part == "prepared_launch":
        workspace = gemm._split_workspaces.get(call.device_index) if call.split_layout[2] else None
        prepared = call.launches[(a.data_ptr(), b.data_ptr(), sfa.data_ptr(), d.data_ptr(), sfb.data_ptr(), workspace)]
        device_index = call.device_index
        return lambda: prepared.launch(current_raw_stream(device_index))
    workspace = gemm._split_workspace(call.device_index, *call.split_layout[1:]) if call.split_layout[2] else None

    def launch():
        tmap_sfa = (sfa.data_ptr(),) + call.map_sfa
        call.kernel.launch(
            call.grid, call.device_index, tmap_a=(a.data_ptr(),) + call.map_a, tmap_b=(b.data_ptr(),) + call.map_b,
            tmap_sfa=tmap_sfa, tmap_d=(d.data_ptr(),) + call.map_d, sfb=sfb.data_ptr(), shape_m=m, grouped_layout=0,
            num_groups=0, d=0, split_workspace=workspace.partials.data_ptr() if workspace else 0,
            split_tickets=workspace.tickets.data_ptr() if workspace else 0, num_unsplit_tiles=call.split_layout[0],
            tmap_sfb=tmap_sfa)
    return launch


def _own_entries(call, module=call_cache) -> dict:
    """The validated signatures (-> (what their check returned, their prepared launches)) that call leaves in module's
    _checked_calls: call_cache's, or a k-grouped GEMM module's own; found by calling it once with the cache emptied,
    which then holds them and all it held before."""
    held, module._checked_calls = module._checked_calls, {}
    try:
        call()
        own = dict(module._checked_calls)
    finally:
        held.update(module._checked_calls)
        module._checked_calls = held
    return own


def _encoding_each_call(grouped_call, module=call_cache):
    """grouped_call (a grouped or FP8 x FP4 GEMM call whose signatures module caches) with its own prepared launches
    dropped before each call."""
    caches = [launches for _, launches in _own_entries(grouped_call, module).values()]

    def call():
        for launches in caches:
            launches.clear()
        grouped_call()
    return call


def _validating_each_call(call):
    """call with its own validated signatures and their launches dropped from call_cache before each call."""
    signatures = list(_own_entries(call))

    def uncached():
        for signature in signatures:
            call_cache._checked_calls.pop(signature, None)
        call()
    return uncached


def run(ctx: BenchContext) -> list:
    small = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    peer = lambda: small.add_(1)
    logits = torch.randn(128, 256, device="cuda", dtype=torch.float32)
    bias = torch.randn(256, device="cuda", dtype=torch.float32) * 0.01
    gate = dict(k=8, scoring="sigmoid", bias=bias, num_groups=8, topk_groups=4, routed_scaling_factor=2.5)
    _, indices = deep_kernels.topk_gate(logits, **gate)
    gated = deep_kernels.topk_gate_with_layout(logits, **gate)
    gated_masked = deep_kernels.topk_gate_with_layout(logits, **gate, max_tokens=128)
    activations = torch.randn(64, 7168, device="cuda", dtype=torch.bfloat16)
    bf16_a, bf16_b = activations, torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16)
    bf16_d = torch.empty(64, 4096, device="cuda", dtype=torch.bfloat16)
    masked_a, masked_b, masked_m = make_masked_inputs([40, 64, 90, 12, 128, 0, 70, 55], 128, 4096, 7168)
    masked_d = torch.empty(8, 128, 4096, device="cuda", dtype=torch.bfloat16)
    fp4_a, fp4_b = make_fp4_gemm_inputs(16, 4096, 7168)
    fp4_d = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
    prepared = deep_kernels.prepare_fp4_weights(*mxfp4_weights(4096, 7168, num_groups=8))
    masked_fp4 = lambda: deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked(masked_a, prepared, masked_d, masked_m, 64)
    ks = [384, 640, 512, 256, 768, 512, 128, 896]
    wgrad_a, wgrad_b, ks_tensor = make_k_grouped_inputs(ks, 7168, 2048)
    wgrad_d = torch.zeros(len(ks), 7168, 2048, device="cuda")
    wgrad = lambda: deep_kernels.k_grouped_fp8_gemm_nt_contiguous(wgrad_a, wgrad_b, wgrad_d, ks, ks_tensor, c=wgrad_d)
    wgrad_shape = {"g": 8, "m": 7168, "n": 2048, "sum_k": sum(ks)}
    cases = [
        ("fp8_gemm_nt", {"m": 64, "n": 4096, "k": 7168}, "cached call: 4 tensor maps encoded once per address set",
         _gemm_call(64, 4096, 7168)),
        ("fp8_gemm_nt", {"m": 64, "n": 4096, "k": 7168},
         "its launch alone as before: Kernel.launch encoding the 4 tensor maps on every call",
         _gemm_call(64, 4096, 7168, "encode_each_call")),
        ("fp8_gemm_nt", {"m": 64, "n": 4096, "k": 7168}, "part: the call signature alone (6 tensors' metadata)",
         _gemm_call(64, 4096, 7168, "signature")),
        ("fp8_gemm_nt", {"m": 64, "n": 4096, "k": 7168}, "part: its prepared launch alone (Kernel.prepare, cached)",
         _gemm_call(64, 4096, 7168, "prepared_launch")),
        ("fp8_gemm_nt", {"m": 1, "n": 2112, "k": 7168}, "cached call", _gemm_call(1, 2112, 7168)),
        ("bf16_gemm_nt", {"m": 64, "n": 4096, "k": 7168}, "cached call: 3 tensor maps encoded once per address set",
         lambda: deep_kernels.bf16_gemm_nt(bf16_a, bf16_b, bf16_d)),
        ("m_grouped_fp8_gemm_nt_masked", {"g": 8, "m_max": 128, "n": 4096, "k": 7168, "expected_m": 64},
         "cached call: 5 tensor maps encoded once per address set",
         lambda: deep_kernels.m_grouped_fp8_gemm_nt_masked(masked_a, masked_b, masked_d, masked_m, 64)),
        ("m_grouped_fp8_gemm_nt_masked", {"g": 8, "m_max": 128, "n": 4096, "k": 7168, "expected_m": 64},
         "as before: its 5 tensor maps encoded and its addresses checked on every call",
         _encoding_each_call(lambda: deep_kernels.m_grouped_fp8_gemm_nt_masked(masked_a, masked_b, masked_d, masked_m,
                                                                               64))),
        ("fp8_fp4_gemm_nt", {"m": 16, "n": 4096, "k": 7168}, "MXFP4 weights; cached call: 4 tensor maps encoded once "
         "per address set", lambda: deep_kernels.fp8_fp4_gemm_nt(fp4_a, fp4_b, fp4_d)),
        ("fp8_fp4_gemm_nt", {"m": 16, "n": 4096, "k": 7168},
         "MXFP4 weights; as before: its 4 tensor maps encoded on every call",
         _encoding_each_call(lambda: deep_kernels.fp8_fp4_gemm_nt(fp4_a, fp4_b, fp4_d))),
        ("m_grouped_fp8_fp4_gemm_nt_masked", {"g": 8, "m_max": 128, "n": 4096, "k": 7168, "expected_m": 64},
         "prepared MXFP4 weights; cached call: its tensor maps encoded once per address set", masked_fp4),
        ("m_grouped_fp8_fp4_gemm_nt_masked", {"g": 8, "m_max": 128, "n": 4096, "k": 7168, "expected_m": 64},
         "prepared MXFP4 weights; as before: validated in full and its tensor maps encoded on every call",
         _validating_each_call(masked_fp4)),
        ("k_grouped_fp8_gemm_nt_contiguous", wgrad_shape,
         "accumulating into d; cached call: 5 tensor maps encoded once per address set, ks checked", wgrad),
        ("k_grouped_fp8_gemm_nt_contiguous", wgrad_shape,
         "accumulating into d; as before: its 5 tensor maps encoded and its addresses checked on every call",
         _encoding_each_call(wgrad, k_grouped_gemm)),
        ("topk_gate", {"t": 128, "e": 256, "k": 8}, "allocates weights and indices",
         lambda: deep_kernels.topk_gate(logits, **gate)),
        ("topk_gate_with_layout", {"t": 128, "e": 256, "k": 8}, "contiguous layout; 7 tensors, 1 allocation",
         lambda: deep_kernels.topk_gate_with_layout(logits, **gate)),
        ("topk_gate_with_layout", {"t": 128, "e": 256, "k": 8},
         "contiguous layout into out= (a previous call's outputs)",
         lambda: deep_kernels.topk_gate_with_layout(logits, **gate, out=gated)),
        ("topk_gate_with_layout", {"t": 128, "e": 256, "k": 8, "max_tokens": 128},
         "contiguous and masked layouts into out= (a previous call's outputs)",
         lambda: deep_kernels.topk_gate_with_layout(logits, **gate, max_tokens=128, out=gated_masked)),
        ("topk_gate_with_layout", {"t": 128, "e": 256, "k": 8, "max_tokens": 128},
         "contiguous and masked layouts; 9 tensors, 1 allocation",
         lambda: deep_kernels.topk_gate_with_layout(logits, **gate, max_tokens=128)),
        ("moe_layout", {"t": 128, "e": 256, "k": 8, "max_tokens": 128}, "contiguous and masked layouts; 7 tensors",
         lambda: deep_kernels.moe_layout(indices, 256, max_tokens=128)),
        ("per_token_cast_to_fp8", {"m": 64, "k": 7168}, "bf16 input, 1 x 128 groups, MN-major FP32 scales",
         lambda: deep_kernels.per_token_cast_to_fp8(activations)),
        ("torch.empty", {"numel": 1024}, "one small CUDA allocation (int32), for scale",
         lambda: torch.empty(1024, dtype=torch.int32, device="cuda")),
    ]
    rows = []
    for op, shape, config, fn in cases:
        us, peer_us = host_us_in_turns([fn, peer])
        rows.append(_row(op, shape, config, us, peer_us))
    # The fused gate is a cooperative launch: queued behind the spinning kernel, the launch itself may wait for the
    # GPU. The same calls with the GPU free (each call's ~10 us of GPU work then runs alongside the host's).
    fused = lambda: deep_kernels.topk_gate_with_layout(logits, **gate, max_tokens=128)
    us, peer_us = host_us_in_turns([fused, peer], behind_spin=False)
    rows.append(_row("topk_gate_with_layout", {"t": 128, "e": 256, "k": 8, "max_tokens": 128},
                     "contiguous and masked layouts; the GPU not held (no spinning kernel)", us, peer_us))
    return rows
