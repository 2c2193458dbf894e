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


@pytest.mark.host_only
def test_precompile_fills_the_cache(tmp_cache):
    import os

    result = _run("precompile", "--family", "quant", "-j", "2", env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert len(list(tmp_cache.rglob("kernel.cubin"))) >= 10


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_bench_without_gpu_says_so():
    result = _run("bench")
    assert result.returncode == 2 and "needs a GPU" in result.stderr


@pytest.mark.host_only
def test_test_command_passes_arguments_to_pytest():
    result = _run("test", "-q", "--co", "-k", "test_info_lists_every_variable")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_info_lists_every_variable" in result.stdout


@pytest.mark.host_only
def test_full_flag_adds_the_compile_check():
    # Without --full the compile-every-kernel check skips, saying how to run it; with --full it is set up to run
    # (--setup-plan shows its fixture planned, compiling nothing). This test also runs under --full itself.
    import os
    import re

    quick_env = {name: value for name, value in os.environ.items() if name != "DK_FULL_TEST"}
    args = ("-q", "-rs", "--setup-plan", "-p", "no:cacheprovider", "-k", "test_every_family_has_kernels")
    quick = _run("test", *args, env=quick_env)
    assert quick.returncode == 0, quick.stdout + quick.stderr
    assert "1 skipped" in quick.stdout and "python -m deep_kernels test --full" in quick.stdout
    full = _run("test", "--full", *args, env=quick_env)
    assert full.returncode == 0, full.stdout + full.stderr
    assert re.search(r"SETUP\s+M compiled", full.stdout) and "skipped" not in full.stdout, full.stdout


def test_ci_runs_the_readme_quick_start():
    # .ci/run is the README's path: every Quick start command but the clone and the GPU benchmarks, in order.
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    block = re.search(r"## Quick start\n+```bash\n(.*?)```", (root / "README.md").read_text(), re.S).group(1)
    not_in_ci = ("git clone", "python -m deep_kernels bench")  # CI has made the clone and has no GPU
    commands = [line.split(" #")[0].strip() for line in block.splitlines()]
    wanted = [command for command in commands if command and not command.startswith(not_in_ci)]
    ci = [line.strip().removeprefix("run_tests ") for line in (root / ".ci" / "run").read_text().splitlines()]
    assert len(wanted) >= 5 and all(command in ci for command in wanted), (wanted, ci)
    assert [ci.index(command) for command in wanted] == sorted(ci.index(command) for command in wanted)


def test_readme_lists_every_variable():
    from pathlib import Path

    from deep_kernels import envs

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name in envs.VARIABLES:
        assert f"| `{name}` |" in readme, name


def test_tune_rejects_malformed_shapes_and_needs_a_gpu(capsys, monkeypatch):
    from deep_kernels import device
    from deep_kernels.__main__ import main

    assert main(["tune", "--shapes", "4096x7168", "64xKx2048"]) == 2
    assert "shapes are MxNxK" in capsys.readouterr().err
    monkeypatch.setattr(device, "has_gpu", lambda: False)
    assert main(["tune", "--shapes", "64x2112x7168"]) == 2
    assert "tune needs a GPU" in capsys.readouterr().err


def test_tune_grouped_shapes_name_their_kind(capsys, monkeypatch):
    from deep_kernels import device
    from deep_kernels.__main__ import main

    monkeypatch.setattr(device, "has_gpu", lambda: False)
    assert main(["tune", "--suite", "grouped_gemm", "--shapes", "16x64x4096x7168"]) == 2
    assert "contiguous:GxMxNxK" in capsys.readouterr().err
    assert main(["tune", "--suite", "grouped_gemm", "--shapes", "masked:16x64x4096x7168"]) == 2
    assert "tune needs a GPU" in capsys.readouterr().err
