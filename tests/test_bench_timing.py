"""The benchmarks' timing helpers (deep_kernels.testing.bench) that need no GPU."""

import pytest

from deep_kernels.testing.bench import L2Flusher, split_runs


def test_interleaved_timing_splits_runs_per_function():
    # time_kernels_us profiles flush, fns[0], flush, fns[1], ... reps times over: each run is the sum of the
    # kernels after a flush, and runs go to the functions in turn.
    flush = "void at::native::bitwise_not_kernel"
    kernels = []
    for rep in range(3):
        kernels += [(flush, 50.0), ("gemm", 10.0 + rep), (flush, 50.0), ("cublas_a", 4.0), ("cublas_b", 5.0)]
    assert split_runs(kernels, L2Flusher.is_flush, 2, 3) == [[10.0, 11.0, 12.0], [9.0, 9.0, 9.0]]
    assert split_runs(kernels, L2Flusher.is_flush, 1, 6) == [[10.0, 9.0, 11.0, 9.0, 12.0, 9.0]]
    with pytest.raises(RuntimeError, match="6 runs for 2 repetitions of 2 functions"):
        split_runs(kernels, L2Flusher.is_flush, 2, 2)
    with pytest.raises(RuntimeError, match="runs for"):  # a function that launched nothing
        split_runs([(flush, 1.0), ("gemm", 3.0), (flush, 1.0)], L2Flusher.is_flush, 2, 1)


def test_table_prints_rows_without_a_peer_or_roofline(capsys):
    # The fp4_gemm suite's NVFP4 and masked rows are timed against our own kernels only.
    from deep_kernels.benchmarks.report import print_table

    print_table("fp4_gemm", [
        {"op": "fp8_fp4_gemm_nt[nvfp4]", "shape": {"m": 1, "n": 2112, "k": 7168}, "us": 12.1, "tflops": 2.5,
         "gbps": 700.0, "memory_roofline_fraction": 0.17, "speedup_vs_fp8": 0.91, "check": "calc_diff=1.4e-06"},
        {"op": "fp8_gemm_nt", "shape": {"m": 1, "n": 2112, "k": 7168}, "us": 11.0, "tflops": 2.8, "gbps": 1400.0,
         "roofline_fraction": 0.33, "speedup": 1.5},
    ])
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].split()[5:7] == ["-", "-"] and lines[3].endswith("; vs_fp8 0.91")
    assert lines[4].split()[5:7] == ["0.330", "1.500"]


def test_host_suite_drops_only_its_own_calls_cache_entries(monkeypatch):
    # The host suite's "as before" rows drop their own call's launches (encoded each call) or signatures (validated
    # each call), never another row's: rows timed in any order time what they say.
    import torch

    from deep_kernels import call_cache
    from deep_kernels.benchmarks import host

    monkeypatch.setattr(call_cache, "_checked_calls", {})
    checks = []

    def check(x):
        checks.append(x.shape)
        return x.shape

    def gemm_like(x):  # a call on call_cache's path that prepares one launch per address
        _, launches = call_cache.checked_call(check, (x,))
        launches.setdefault(x.data_ptr(), object())

    other, own = torch.zeros(4), torch.zeros(8)
    gemm_like(other)
    (other_entry,) = call_cache._checked_calls.values()
    encoding = host._encoding_each_call(lambda: gemm_like(own))
    validating = host._validating_each_call(lambda: gemm_like(torch.zeros(16)))
    assert len(call_cache._checked_calls) == 3 and len(checks) == 3
    own_launches = next(launches for (shape, launches) in call_cache._checked_calls.values() if shape == own.shape)
    first_launch = own_launches[own.data_ptr()]
    for _ in range(2):
        validating()
        encoding()
    assert len(checks) == 5  # validated again each call: the 16-element call only
    assert own_launches[own.data_ptr()] is not first_launch  # prepared again each call
    assert call_cache._checked_calls[next(iter(call_cache._checked_calls))] is other_entry
    assert list(other_entry[1]) == [other.data_ptr()]
