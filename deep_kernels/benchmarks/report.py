"""Context shared by the suites (flusher, copy bandwidth), the JSON/PNG writers and the table printer."""

import datetime
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from deep_kernels.device import info
from deep_kernels.testing import assert_bitwise_equal
from deep_kernels.testing.bench import L2Flusher, copy_bandwidth_gbps, time_kernel_us


@dataclass
class BenchContext:
    flusher: L2Flusher
    copy_gbps: float
    commit: str
    gpu: str = field(default_factory=lambda: torch.cuda.get_device_name())

    @classmethod
    def create(cls, commit: str) -> "BenchContext":
        flusher = L2Flusher(info().l2_bytes)
        return cls(flusher=flusher, copy_gbps=copy_bandwidth_gbps(flusher), commit=commit)


# Memory-bound suites compile their torch peer at this many rows (the issues' targets), eager elsewhere.
COMPILED_PEER_ROWS = 16384


def timed_peer(call, ctx: BenchContext, compiled: bool = True, dynamic: bool = None, reps: int = 20) -> tuple:
    """(peer name, us) of a zero-argument call of a reference, timed like the kernels: torch.compile of it
    (compiled by a first call), or the call itself where `compiled` is False or compiling fails (the name says
    so). Suites compile where the issue's targets are (each compile costs seconds of the GPU session)."""
    if compiled:
        import torch._dynamo

        # NOTE: the suites' lambdas share code objects, so every row is a recompile of one function; past the
        # limit (8) dynamo would run the call eagerly without a word.
        for limit in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 256))
        try:
            compiled_call = torch.compile(call, dynamic=dynamic)
            compiled_call()
            return "torch.compile(reference)", time_kernel_us(compiled_call, ctx.flusher, reps=reps)
        except Exception as error:  # noqa: BLE001 - the peer only: a compiler failure falls back, named in the row
            name = f"torch reference (eager; torch.compile failed: {type(error).__name__})"
    else:
        name = "torch reference (eager)"
    return name, time_kernel_us(call, ctx.flusher, reps=reps)


def same_bytes_copy_us(num_bytes: int, ctx: BenchContext) -> float:
    """Time of a device-to-device copy moving num_bytes (half read, half written), timed like the kernels:
    what the copy bandwidth allows at this size, fixed costs (launch, first-byte latency, tail) included."""
    src = torch.empty(max(num_bytes // 2, 16), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return time_kernel_us(lambda: dst.copy_(src), ctx.flusher)


def memory_bound_row(op: str, shape: dict, config: str, us: float, num_bytes: int, ctx: BenchContext,
                     peer: str, peer_us: float, check: str) -> dict:
    gbps = num_bytes / us / 1e3
    return {
        "op": op, "shape": shape, "config": config, "us": round(us, 2), "tflops": None,
        "gbps": round(gbps, 1), "roofline_fraction": round(gbps / ctx.copy_gbps, 3),
        "peer": peer, "peer_us": round(peer_us, 2), "speedup": round(peer_us / us, 3), "check": check,
    }


def _as_tuple(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def checked_memory_row(op: str, shape: dict, config: str, kernel_call, reference_call, num_bytes: int,
                       ctx: BenchContext, compiled: bool) -> dict:
    """A memory-bound row: the kernel's outputs checked bit for bit against the reference's, then the kernel
    and its peer (timed_peer of the reference call, compiled or not) timed."""
    actual, expected = _as_tuple(kernel_call()), _as_tuple(reference_call())
    assert len(actual) == len(expected), f"{op}: {len(actual)} outputs, the reference has {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_bitwise_equal(a, e, f"{op} output {i}")
    us = time_kernel_us(kernel_call, ctx.flusher)
    peer, peer_us = timed_peer(reference_call, ctx, compiled=compiled)
    return memory_bound_row(op, shape, config, us, num_bytes, ctx, peer, peer_us, "bitwise equal")


def summarize(rows: list) -> dict:
    speedups = [r["speedup"] for r in rows if r.get("speedup")]
    if not speedups:
        return {}
    return {
        "geomean_speedup": round(math.exp(sum(math.log(s) for s in speedups) / len(speedups)), 3),
        "min_speedup": round(min(speedups), 3),
    }


def gpu_folder(gpu_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def write_suite(out_root: Path, suite: str, rows: list, ctx: BenchContext) -> Path:
    folder = out_root / gpu_folder(ctx.gpu)
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "suite": suite, "gpu": ctx.gpu, "date": datetime.date.today().isoformat(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "commit": ctx.commit,
        "copy_bandwidth_gbps": round(ctx.copy_gbps, 1), "rows": rows, "summary": summarize(rows),
    }
    path = folder / f"{suite}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    _write_chart(folder / f"{suite}.png", suite, rows, ctx)
    return path


def _write_chart(path: Path, suite: str, rows: list, ctx: BenchContext) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib not installed: no chart for {suite}")
        return
    plotted = [r for r in rows if r.get("roofline_fraction") is not None or r.get("speedup") is not None]
    if not plotted:
        return
    labels = [f"{r['op']}\n" + "x".join(str(v) for v in r["shape"].values()) for r in plotted]
    fig, ax = plt.subplots(figsize=(max(6, len(plotted) * 1.1), 4))
    xs = range(len(plotted))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r.get("roofline_fraction") or 0 for r in plotted], width,
           label="fraction of roofline")
    ax.bar([x + width / 2 for x in xs], [r.get("speedup") or 0 for r in plotted], width, label="speed-up over peer")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_title(f"{suite} on {ctx.gpu} ({datetime.date.today().isoformat()})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(suite: str, rows: list) -> None:
    print(f"\n== {suite} ==")
    print(f"{'op':<28}{'shape':<22}{'us':>10}{'TFLOPS':>9}{'GB/s':>9}{'roof':>7}{'speedup':>9}  check")
    for r in rows:
        shape = "x".join(str(v) for v in r["shape"].values())
        fmt = lambda v, spec: format(v, spec) if v is not None else format("-", ">" + spec.split(".")[0])
        # NOTE: rows measured against our own kernels only have no peer speedup, some no roofline fraction.
        print(f"{r['op']:<28}{shape:<22}{fmt(r['us'], '10.2f')}{fmt(r.get('tflops'), '9.1f')}{fmt(r.get('gbps'), '9.1f')}"
              f"{fmt(r.get('roofline_fraction'), '7.3f')}{fmt(r.get('speedup'), '9.3f')}  {r.get('check', '')}"
              + "".join(f"; {key.removeprefix('speedup_')} {value}" for key, value in r.items()
                        if key.startswith("speedup_vs_")))
