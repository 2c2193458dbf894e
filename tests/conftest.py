"""Markers: tests marked `gpu` need a Hopper GPU. Without one they are skipped, unless DK_REQUIRE_GPU=1 (the
GPU runner, scripts/run_gpu.sh, sets it): then a GPU test that cannot run, or that skips itself, fails, so a
broken CUDA setup cannot pass as "every GPU test skipped". Tests without the marker keep their own skips.
Tests marked `multi_gpu` need two Hopper GPUs and skip with fewer (DK_REQUIRE_GPU does not cover them: the GPU
runner has one). Tests marked `full` (minutes of compiling) run only in the full mode: `python -m deep_kernels test --full`,
DK_FULL_TEST=1. Tests marked `host_only` (CPU plumbing: compiling in a subprocess, pytest's command line) run
everywhere but on the GPU runner, which deselects them: CI runs them, and the device's minutes are scarce.
With DK_GEMM_ERRORS_OUT=<file> (the GPU runner sets it), every comparison of testing.gemm.assert_gemm_close is
appended to that file as it is made, one JSON object a line: the test, the output dtype, the bound and the calc_diff
over the whole matrix, the worst 128 x 128 tile and the worst row.
With DK_TEST_SHARD=i/n, only the i-th (from 0) of n shards of the collected tests runs: whole test files, dealt out
so that the shards hold about as much work each (shard_files; a GPU test weighs as ten others), so that the suite can
be split over calls of the GPU machine's time limit and the n runs together run every test once."""

import contextlib
import functools
import json
import os
from pathlib import Path

import pytest
import torch

FULL = os.environ.get("DK_FULL_TEST", "") not in ("", "0")
REQUIRE_GPU = os.environ.get("DK_REQUIRE_GPU", "") not in ("", "0")
GEMM_ERRORS_OUT = os.environ.get("DK_GEMM_ERRORS_OUT", "")
TEST_SHARD = os.environ.get("DK_TEST_SHARD", "")


def csrc_source(path: str) -> str:
    """The text of csrc/<path>: for the tests that replay a kernel's arithmetic in torch, to check that the lines
    they replay are still the kernel's."""
    return (Path(__file__).resolve().parent.parent / "csrc" / path).read_text()


def in_turns(options, shapes) -> list:
    """Each option (a tuple) once, after a shape (a tuple) that takes turns with the others: each shape and
    each option is its own code path, and testing their cross product adds cases, not coverage."""
    return [(*shapes[i % len(shapes)], *option) for i, option in enumerate(options)]


@functools.cache
def _missing_hopper() -> str:
    """Why the GPU tests cannot run here, or "" when they can."""
    try:
        if not torch.cuda.is_available():
            return (f"needs a Hopper GPU: torch.cuda.is_available() is False (torch {torch.__version__}, "
                    f"built for CUDA {torch.version.cuda})")
        capability = torch.cuda.get_device_capability()
    except Exception as error:  # a broken driver or runtime: say what it was
        return f"needs a Hopper GPU: the CUDA setup failed: {type(error).__name__}: {error}"
    if capability != (9, 0):
        return f"needs a Hopper GPU: device 0 is sm_{capability[0]}{capability[1]}"
    return ""


def pytest_runtest_setup(item):
    if "full" in item.keywords and not FULL:
        pytest.skip("runs in the full mode only: python -m deep_kernels test --full")
    if "multi_gpu" in item.keywords and (_missing_hopper() or torch.cuda.device_count() < 2):
        pytest.skip("needs two Hopper GPUs")
    if "gpu" in item.keywords and _missing_hopper():
        if REQUIRE_GPU:
            pytest.fail(f"DK_REQUIRE_GPU=1 but the GPU tests cannot run: {_missing_hopper()}", pytrace=False)
        pytest.skip(_missing_hopper())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_GPU and report.skipped and "gpu" in item.keywords:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"DK_REQUIRE_GPU=1: a GPU test may not skip ({reason})"


# A GPU test's weight in shard_files against a CPU test's 1: the GPU tests take most of the GPU runner's time.
GPU_TEST_WEIGHT = 10


def shard_files(weights: dict, index: int, num_shards: int) -> set:
    """The files of shard index of num_shards, from weights {file: the weight of its tests}: the files from the
    heaviest down, each to the shard lightest so far (ties to the lowest shard, files of equal weight in name
    order, so that every run deals alike)."""
    totals, chosen = [0] * num_shards, set()
    for path in sorted(weights, key=lambda p: (-weights[p], str(p))):
        shard = totals.index(min(totals))
        totals[shard] += weights[path]
        if shard == index:
            chosen.add(path)
    return chosen


def _parse_shard(text: str) -> tuple:
    try:
        index, num_shards = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"DK_TEST_SHARD must be i/n (shard i of n, from 0), got {text!r}") from None
    if not 0 <= index < num_shards:
        raise pytest.UsageError(f"DK_TEST_SHARD {text!r}: i must be in 0 .. n - 1")
    return index, num_shards


def pytest_collection_modifyitems(config, items):
    if not TEST_SHARD:
        return
    index, num_shards = _parse_shard(TEST_SHARD)
    weights = {}
    for item in items:
        weights[item.path] = weights.get(item.path, 0) + (GPU_TEST_WEIGHT if "gpu" in item.keywords else 1)
    chosen = shard_files(weights, index, num_shards)
    config.hook.pytest_deselected(items=[item for item in items if item.path not in chosen])
    items[:] = [item for item in items if item.path in chosen]


def pytest_configure(config):
    if GEMM_ERRORS_OUT:
        from deep_kernels.testing import gemm
        gemm.recorded_errors = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if not GEMM_ERRORS_OUT:
        return
    from deep_kernels.testing import gemm
    if not gemm.recorded_errors:  # most tests check no GEMM output
        return
    # NOTE: written after each test, so that a run stopped part way keeps what it measured.
    with open(GEMM_ERRORS_OUT, "a") as out:
        for dtype, bound, errors in gemm.recorded_errors:
            out.write(json.dumps({"test": item.nodeid, "dtype": dtype, "bound": bound, "whole": errors["whole"],
                                  "tile": errors["tile"][0], "row": errors["row"][0]}) + "\n")
    gemm.recorded_errors.clear()


@contextlib.contextmanager
def cache_dir_set_to(path):
    """DK_JIT_CACHE_DIR set to path inside the block (for module-scoped fixtures, which have no monkeypatch)."""
    previous = os.environ.get("DK_JIT_CACHE_DIR")
    os.environ["DK_JIT_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            del os.environ["DK_JIT_CACHE_DIR"]
        else:
            os.environ["DK_JIT_CACHE_DIR"] = previous


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty kernel cache for the test."""
    monkeypatch.setenv("DK_JIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
