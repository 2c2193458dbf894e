"""Timing helpers for the benchmarks: kernel time with L2 flushed, copy bandwidth, host overhead."""

import statistics
import time

import torch


class L2Flusher:
    """Writes a buffer larger than L2 between timed runs, so every run reads its inputs from HBM."""

    def __init__(self, l2_bytes: int):
        self.buffer = torch.empty(4 * l2_bytes // 4, dtype=torch.int32, device="cuda")

    def __call__(self) -> None:
        self.buffer.zero_()


def time_kernel_us(fn, flusher: L2Flusher, warmup: int = 10, reps: int = 100) -> float:
    """Median device time of fn() in microseconds, L2 flushed before each run.

    The flush before each run also keeps the GPU busy while the host enqueues the next events and
    launch, so host launch latency does not leak into the figure.
    """
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        flusher()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def copy_bandwidth_gbps(flusher: L2Flusher, num_bytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, bytes read plus written, in GB/s."""
    src = torch.empty(num_bytes // 4, dtype=torch.int32, device="cuda").random_()
    dst = torch.empty_like(src)
    us = time_kernel_us(lambda: dst.copy_(src), flusher, warmup=3, reps=20)
    return 2 * num_bytes / us / 1e3


def host_time_us(fn, calls: int = 2000, rounds: int = 5) -> float:
    """Median over rounds of the host time per call of fn(), with the GPU queue drained between rounds."""
    per_call = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per_call)
