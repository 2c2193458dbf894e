"""Suite `jit`: cold compile time per kernel, first call in a new process (cache hit), and the host
time of a cached call against torch's own x.add_(1)."""

import os
import subprocess
import sys
import tempfile
import time

import torch

import deep_kernels
from deep_kernels import gemm, quant
from deep_kernels.quant import fp8 as quant_fp8
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.device import target_arch
from deep_kernels.jit import runtime
from deep_kernels.reference.quant import per_block_cast_to_fp8
from deep_kernels.testing import empty_like_strided
from deep_kernels.testing.bench import host_time_us

_FIRST_CALL = """
import time, torch
start = time.perf_counter()
import deep_kernels
imported = time.perf_counter()
x = torch.randn(128, 7168, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
call = time.perf_counter()
deep_kernels.per_token_cast_to_fp8(x)
torch.cuda.synchronize()
print((imported - start) * 1e6, (time.perf_counter() - call) * 1e6)
"""


def _row(op: str, shape: dict, config: str, us: float, peer: str = None, peer_us: float = None) -> dict:
    return {
        "op": op, "shape": shape, "config": config, "us": round(us, 2), "tflops": None, "gbps": None,
        "roofline_fraction": None, "peer": peer, "peer_us": round(peer_us, 2) if peer_us else None,
        "speedup": round(peer_us / us, 3) if peer_us else None, "check": "",
    }


def run(ctx: BenchContext) -> list:
    rows = []
    # Cold compile: one specialization of each kernel, one at a time, into an empty cache.
    first_of_each = {spec.name: spec for spec in reversed(quant.precompile_specs() + gemm.precompile_specs())}
    with tempfile.TemporaryDirectory() as empty_cache:
        previous = os.environ.get("DK_JIT_CACHE_DIR")
        os.environ["DK_JIT_CACHE_DIR"] = empty_cache
        try:
            for spec in first_of_each.values():
                start = time.perf_counter()
                runtime.build_binary(spec, target_arch())
                rows.append(_row("cold_compile", {"kernel": spec.name}, ", ".join(map(str, spec.template_args)),
                                 (time.perf_counter() - start) * 1e6))
        finally:
            if previous is None:
                del os.environ["DK_JIT_CACHE_DIR"]
            else:
                os.environ["DK_JIT_CACHE_DIR"] = previous

    # First call in a new process, its kernel already in the disk cache (warmed by this process).
    x = torch.randn(128, 7168, device="cuda", dtype=torch.bfloat16)
    deep_kernels.per_token_cast_to_fp8(x)
    output = subprocess.run([sys.executable, "-c", _FIRST_CALL], check=True, capture_output=True, text=True).stdout
    import_us, first_call_us = (float(v) for v in output.split())
    rows.append(_row("import_deep_kernels", {"process": "new"}, "", import_us))
    rows.append(_row("first_call_cached", {"m": 128, "k": 7168}, "per_token_cast_to_fp8, disk cache hit",
                     first_call_us))

    # Host time per cached call, against torch's eager add_ on a tensor of the same size.
    small = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    torch_us = host_time_us(lambda: small.add_(1))
    ours_us = host_time_us(lambda: deep_kernels.per_token_cast_to_fp8(small))
    q, scales = deep_kernels.per_token_cast_to_fp8(small)
    out = (empty_like_strided(q), empty_like_strided(scales))
    ours_out_us = host_time_us(lambda: deep_kernels.per_token_cast_to_fp8(small, out=out))
    kernel = quant_fp8._cast_kernel(small.dtype, 128, False, quant_fp8.ScaleLayout.mn_major)
    params = dict(x=small.data_ptr(), q=q.data_ptr(), scales=scales.data_ptr(), shape_m=16, shape_k=256,
                  x_row_stride=256, scale_stride=16, amax_clamp=1e-4)
    launch_us = host_time_us(lambda: kernel.launch((2, 1, 1), 0, **params))
    rows.append(_row("host_overhead", {"m": 16, "k": 256}, "Kernel.launch alone (stream + cuLaunchKernelEx)",
                     launch_us, "torch x.add_(1)", torch_us))
    rows.append(_row("host_overhead", {"m": 16, "k": 256}, "per_token_cast_to_fp8 (allocates outputs)", ours_us,
                     "torch x.add_(1)", torch_us))
    rows.append(_row("host_overhead", {"m": 16, "k": 256}, "per_token_cast_to_fp8(out=...)", ours_out_us,
                     "torch x.add_(1)", torch_us))

    # A decode-sized FP8 GEMM: validation, 4 tensor-map encodings and the launch.
    a = deep_kernels.per_token_cast_to_fp8(torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16))
    b = per_block_cast_to_fp8(torch.randn(2112, 7168, device="cuda", dtype=torch.bfloat16))
    d = torch.empty(1, 2112, device="cuda", dtype=torch.bfloat16)
    # NOTE: few calls per round, so that the launch queue never fills and the GPU time (about 15 us a
    # call here) does not set the pace: this measures the host alone.
    gemm_us = host_time_us(lambda: deep_kernels.fp8_gemm_nt(a, b, d), calls=100, rounds=21)
    rows.append(_row("host_overhead", {"m": 1, "n": 2112, "k": 7168}, "fp8_gemm_nt (4 tensor maps + launch)",
                     gemm_us, "torch x.add_(1)", torch_us))
    return rows
