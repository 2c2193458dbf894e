"""Timing helpers for the benchmarks: kernel time with L2 flushed, copy bandwidth, host overhead."""

import statistics
import time

import torch


class L2Flusher:
    """Writes a buffer larger than L2 between timed runs, so every run reads its inputs from HBM."""

    def __init__(self, l2_bytes: int):
        self.buffer = torch.empty(l2_bytes, dtype=torch.int32, device="cuda")  # 4x L2

    def __call__(self) -> None:
        # NOTE: bitwise_not, an op no timed code uses, so the profiler can tell flushes apart.
        torch.bitwise_not(self.buffer, out=self.buffer)

    @staticmethod
    def is_flush(kernel_name: str) -> bool:
        return "bitwise_not" in kernel_name


def time_kernel_us(fn, flusher: L2Flusher, warmup: int = 10, reps: int = 50) -> float:
    """Median device time of fn()'s kernels in microseconds, L2 flushed before each run.

    Kernel durations come from the profiler (CUPTI), so host launch gaps never count: each run's time
    is the sum of the durations of the kernels fn() launched (between two flushes).
    """
    return time_kernels_us([fn], flusher, warmup, reps)[0]


def time_kernels_us(fns: list, flusher: L2Flusher, warmup: int = 10, reps: int = 50) -> list:
    """time_kernel_us of each of fns, measured in turns (flush, fns[0], flush, fns[1], ..., reps times over),
    so that clock and power drift during the measurement falls on every one alike: for ratios between kernels
    (a GEMM near the power limit runs its clock down over seconds)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for fn in fns:
                flusher()
                fn()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    runs = split_runs([(e.name, e.time_range.elapsed_us()) for e in kernels], flusher.is_flush, len(fns), reps)
    return [statistics.median(fn_runs) for fn_runs in runs]


def split_runs(kernels: list, is_flush, num_fns: int, reps: int) -> list:
    """Per function, the times of its runs from (name, microseconds) of the profiled kernels in start order:
    a run is the sum of the kernels between two flushes (the last one's up to the end), and runs go to the
    functions in turn."""
    runs, current = [], None
    for name, us in kernels:
        if is_flush(name):
            if current is not None:
                runs.append(current)
            current = 0.0
        elif current is not None:
            current += us
    if current is not None:
        runs.append(current)
    per_fn = [runs[i::num_fns] for i in range(num_fns)]
    if len(runs) != reps * num_fns or not all(any(fn_runs) for fn_runs in per_fn):
        raise RuntimeError(f"profiler saw {len(runs)} runs for {reps} repetitions of {num_fns} functions")
    return per_fn


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
