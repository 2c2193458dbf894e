"""Suite `expert_parallel`: the DeepSeek-V3 MoE layer of the moe_layer suite with its experts spread over every
GPU of the machine (nn.MoE with a process group over NCCL, NVLink multicast off), W ranks of T tokens each, against
the same layer on one GPU over all W * T tokens (nn.MoE without a process group), the two timed in turns in the same
run.

    T = 8192 (prefill): contiguous layout, eager; also in one chunk (no overlap of the exchanges with the GEMMs,
        `speedup_vs_one_chunk`)
    T = 128 (decode): masked layout, each layer captured in a CUDA graph and replayed

On a machine with one GPU the group has one rank, and the rows price the expert-parallel path where there is nothing
to exchange (called directly: the module runs a one-rank group as the layer without one; its exchanges are copies to
itself): T = 16384 at prefill, the fewest tokens the default chunking moves
in two chunks, so that `speedup_vs_one_chunk` is what the chunks cost the GEMMs with nothing to hide.

Each rank times its calls with CUDA events from a barrier (L2 flushed before), the slowest rank's time counts, and
`us` is the median over the runs: the wall time of a layer's call on the GPU, its exchanges and (eager) its host
synchronization included, as a serving step sees it. tokens_per_s counts all W * T tokens; `speedup` is the ratio of
the two layers' tokens per second; tflops are per GPU (the routed slots' 2 * T * k * 3 * H * I on each).
Check: whether each rank's output is bitwise the single-GPU layer's rows of its tokens (the issue's contract), also
with the single-GPU layer's router logits (torch's router GEMM may pick another kernel for another token count), and
in one chunk. A rank that fails stops the suite at once with its error (the others are killed: they would wait for it
in a collective).
"""

import os
import statistics
import tempfile
import time
from queue import Empty

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deep_kernels.benchmarks.fp8_gemm import FP8_PEAK_TFLOPS
from deep_kernels.benchmarks.moe_layer import GATE, HIDDEN, INTERMEDIATE, NUM_EXPERTS, captured_forward
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.device import info
from deep_kernels.nn import MoE
from deep_kernels.nn.expert_parallel import expert_parallel_forward, overlap_min_tokens
from deep_kernels.testing.bench import L2Flusher
from deep_kernels.testing.moe_layer import moe_layer_tokens, moe_layer_weights

# (T per rank, mode, timing)
CASES = ((8192, "contiguous", "eager"), (128, "masked", "graph"))
# One GPU: a rank's prefill tokens are the fewest that the default chunking splits.
ONE_GPU_CASES = ((overlap_min_tokens(NUM_EXPERTS, GATE["top_k"]), "contiguous", "eager"), (128, "masked", "graph"))
REPS = 20
# A rank that has not reported by then has hung.
RANK_TIMEOUT_S = 1200
PEER = "the same layer on one GPU over all W * T tokens (nn.MoE without a process group), timed in turns"


def run(ctx: BenchContext) -> list:
    world = torch.cuda.device_count()
    if world == 0:
        print("expert_parallel: needs a GPU")
        return []
    if world == 1:
        print("expert_parallel: one GPU: the layer as a group of one rank against the layer without a group")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        processes = [context.Process(target=_rank_main, args=(rank, world, os.path.join(folder, "store"), queue))
                     for rank in range(world)]
        for p in processes:
            p.start()
        try:
            results = _rank_results(processes, queue)
        finally:
            for p in processes:  # a rank left waiting in a collective for a failed peer never returns
                p.kill()
                p.join()
    return next(r for r in results if r)


def _rank_results(processes: list, queue) -> list:
    """Every rank's report; a RuntimeError with the first error (or rank that exited without a report, or the
    timeout) as soon as there is one: the other ranks may be waiting for it in a collective."""
    results, deadline = [], time.monotonic() + RANK_TIMEOUT_S
    while len(results) < len(processes):
        try:
            result = queue.get(timeout=1)
        except Empty:
            silent = [rank for rank, p in enumerate(processes) if p.exitcode not in (None, 0)]
            if silent:
                raise RuntimeError(f"expert_parallel: rank {silent[0]} exited with code "
                                   f"{processes[silent[0]].exitcode} without a report") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"expert_parallel: no report from {len(processes) - len(results)} ranks in "
                                   f"{RANK_TIMEOUT_S} s") from None
            continue
        if isinstance(result, str):
            raise RuntimeError(f"expert_parallel: {result}")
        results.append(result)
    return results


def _rank_main(rank: int, world: int, store: str, queue) -> None:
    """One rank: the rows (rank 0) or [] through the queue, or the error's text."""
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        try:
            rows = _rank_rows(rank, world)
        finally:
            dist.destroy_process_group()
        queue.put(rows if rank == 0 else [])
    except Exception as error:  # noqa: BLE001 - reported by the parent: a spawned process's traceback is lost
        queue.put(f"rank {rank}: {type(error).__name__}: {error}")


@torch.no_grad()
def _rank_rows(rank: int, world: int) -> list:
    weights = moe_layer_weights(HIDDEN, INTERMEDIATE, NUM_EXPERTS)
    single = MoE.from_float(**weights, **GATE)
    parallel = MoE.from_float(**weights, **GATE, process_group=dist.group.WORLD)
    del weights
    # One rank: the exchanges called directly, as the module runs a group of one rank without them.
    forward = parallel if world > 1 else (lambda x, mode: _exchanged(parallel, x, mode))
    flusher = L2Flusher(info(rank).l2_bytes)
    rows = []
    for num_tokens, mode, timing in CASES if world > 1 else ONE_GPU_CASES:
        # Every rank makes all W * T tokens alike and takes its own.
        x_all = moe_layer_tokens(world * num_tokens, HIDDEN)
        x = x_all[rank * num_tokens:(rank + 1) * num_tokens].contiguous()
        calls = {}
        if timing == "graph":
            calls["ours"], out = captured_forward(forward, x, mode)
            calls["peer"], out_single = captured_forward(single, x_all, mode)
            calls["ours"]()
            calls["peer"]()
        else:
            calls["ours"] = lambda: forward(x, mode)
            calls["peer"] = lambda: single(x_all, mode)
            calls["one_chunk"] = lambda: _exchanged(parallel, x, mode, chunks=1)
            out, out_single = calls["ours"](), calls["peer"]()
        us = _timed_in_turns(calls, flusher)
        check = _check(rank, num_tokens, x, x_all, out, out_single, single, parallel, mode, calls.get("one_chunk"))
        rows.append(_row(num_tokens, world, mode, timing, us, check))
    return rows


def _exchanged(parallel: MoE, x, mode: str, logits=None, chunks: int = None):
    """expert_parallel_forward of the module's experts over the whole group, on its router's logits unless given."""
    logits = parallel.router_logits(x) if logits is None else logits
    return expert_parallel_forward(x, logits, parallel.gate_config(), parallel.experts(), mode, parallel.max_tokens,
                                   dist.group.WORLD, chunks=chunks)


def _check(rank: int, num_tokens: int, x, x_all, out, out_single, single: MoE, parallel: MoE, mode: str,
           one_chunk) -> str:
    """Whether every rank's output is bitwise the single-GPU layer's rows of its tokens: as the layers ran, and with
    the single-GPU layer's router logits (the router GEMM's rows may follow the token count); and in one chunk."""
    mine = slice(rank * num_tokens, (rank + 1) * num_tokens)
    logits = single.router_logits(x_all)[mine]
    same_logits_out = _exchanged(parallel, x, mode, logits)
    equal = [torch.equal(out, out_single[mine]), torch.equal(same_logits_out, out_single[mine])]
    if one_chunk is not None:
        equal.append(torch.equal(one_chunk(), out))
    equal = torch.tensor(equal, dtype=torch.int32, device="cuda")
    dist.all_reduce(equal, op=dist.ReduceOp.MIN)
    answer = ["yes" if flag else "no" for flag in equal.tolist()]
    check = (f"every rank's output bitwise the single-GPU layer's: {answer[0]}; with its router logits: "
             f"{answer[1]}")
    return check + (f"; in one chunk the same bits: {answer[2]}" if one_chunk is not None else "")


def _timed_in_turns(calls: dict, flusher: L2Flusher, warmup: int = 2) -> dict:
    """Median over REPS runs of each call in turns, in us: each from a barrier, L2 flushed, timed by CUDA events
    on every rank, the slowest rank's time."""
    times = {name: [] for name in calls}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for rep in range(warmup + REPS):
        for name, call in calls.items():
            flusher()
            torch.cuda.synchronize()
            dist.barrier()
            torch.cuda.synchronize()
            start.record()
            call()
            end.record()
            end.synchronize()
            slowest = torch.tensor([start.elapsed_time(end) * 1e3], device="cuda")
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rep >= warmup:
                times[name].append(slowest.item())
    return {name: statistics.median(values) for name, values in times.items()}


def _row(num_tokens: int, world: int, mode: str, timing: str, us: dict, check: str) -> dict:
    flops = 2 * num_tokens * GATE["top_k"] * 3 * HIDDEN * INTERMEDIATE
    tflops = flops / us["ours"] / 1e6
    layout = (f"masked layout, capacity {world * num_tokens} per expert (none dropped)" if mode == "masked"
              else "contiguous layout, the default chunks")
    row = {
        "op": "MoE.forward (expert parallel)",
        "shape": {"t": num_tokens, "world_size": world, "pass": "forward", "mode": timing},
        "config": f"{layout}; {'CUDA graph replay' if timing == 'graph' else 'eager'}; NCCL all_to_all_single, "
                  f"NVLink multicast off",
        "us": round(us["ours"], 2), "tflops": round(tflops, 1), "roofline_fraction": round(tflops / FP8_PEAK_TFLOPS, 3),
        "tokens_per_s": round(world * num_tokens / us["ours"] * 1e6),
        "peer": PEER, "peer_us": round(us["peer"], 2),
        "peer_tokens_per_s": round(world * num_tokens / us["peer"] * 1e6),
        "speedup": round(us["peer"] / us["ours"], 3), "check": check,
    }
    if "one_chunk" in us:
        row.update(one_chunk_us=round(us["one_chunk"], 2), speedup_vs_one_chunk=round(us["one_chunk"] / us["ours"], 3))
    return row
