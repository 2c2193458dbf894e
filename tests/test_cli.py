"""The command line without a GPU: info, precompile, and clear refusals."""

import subprocess
import sys

import pytest
import torch


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "deep_kernels", *args], capture_output=True, text=True, env=env)


def test_info_lists_every_variable():
    from deep_kernels import envs

    result = _run("info")
    assert result.returncode == 0, result.stderr
    assert "nvcc:" in result.stdout and "kernel cache:" in result.stdout
    for name in envs.VARIABLES:
        assert name in result.stdout


def test_precompile_fills_the_cache(tmp_cache):
    import os

    result = _run("precompile", "--family", "quant", "-j", "2", env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert len(list(tmp_cache.rglob("kernel.cubin"))) >= 10


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_bench_without_gpu_says_so():
    result = _run("bench")
    assert result.returncode == 2 and "needs a GPU" in result.stderr


def test_test_command_passes_arguments_to_pytest():
    result = _run("test", "-q", "--co", "-k", "test_info_lists_every_variable")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_info_lists_every_variable" in result.stdout


def test_readme_lists_every_variable():
    from pathlib import Path

    from deep_kernels import envs

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name in envs.VARIABLES:
        assert f"| `{name}` |" in readme, name
