"""The JIT runtime without a GPU: codegen, cache keys, concurrent and corrupt cache entries, ninja
precompile, the NVRTC backend and the native launcher's build."""

import multiprocessing
import shutil
from pathlib import Path

import pytest

from deep_kernels import envs
from deep_kernels.__main__ import FAMILIES, _family_specs
from deep_kernels.jit import cache, compiler, launcher, runtime
from deep_kernels.jit.precompile import precompile
from deep_kernels.jit.source import KernelSpec
from deep_kernels.testing import sass

CAST_SPEC = KernelSpec(
    "kernels/smxx_per_token_cast.cuh", "smxx_per_token_cast_impl",
    ("__nv_bfloat16", 128, "false", "deep_kernels::ScaleLayout::MNMajor", 8, 4),
)


def test_render_includes_header_and_instantiates_template():
    source = CAST_SPEC.render()
    assert '#include "kernels/smxx_per_token_cast.cuh"' in source
    assert ("&deep_kernels::smxx_per_token_cast_impl<__nv_bfloat16, 128, false, "
            "deep_kernels::ScaleLayout::MNMajor, 8, 4>") in source
    assert CAST_SPEC.name == "smxx_per_token_cast"


def test_included_headers_are_transitive():
    headers = {p.relative_to(cache.CSRC_ROOT).as_posix() for p in cache.included_headers(CAST_SPEC.render())}
    assert {"kernels/smxx_per_token_cast.cuh", "common/quant.cuh", "common/macros.cuh",
            "common/types.cuh", "common/token_group_tile.cuh"} <= headers


def _copy_csrc(tmp_path: Path) -> Path:
    root = tmp_path / "csrc"
    shutil.copytree(cache.CSRC_ROOT, root)
    return root


def test_key_changes_when_an_included_header_changes(tmp_path):
    root = _copy_csrc(tmp_path)
    source = CAST_SPEC.render()
    before = cache.cache_key(source, "nvcc x", root)
    assert cache.cache_key(source, "nvcc x", root) == before
    # A header included only indirectly (through common/quant.cuh).
    types = root / "common" / "types.cuh"
    types.write_text(types.read_text() + "\n// edited\n")
    assert cache.cache_key(source, "nvcc x", root) != before


def test_key_depends_on_source_compiler_and_arch():
    source = CAST_SPEC.render()
    key = cache.cache_key(source, compiler.compiler_identity("90a"))
    assert cache.cache_key(source + "\n", compiler.compiler_identity("90a")) != key
    assert cache.cache_key(source, compiler.compiler_identity("90")) != key
    other = KernelSpec(CAST_SPEC.header, CAST_SPEC.entry, CAST_SPEC.template_args[:-1] + (2,))
    assert cache.cache_key(other.render(), compiler.compiler_identity("90a")) != key


def test_missing_header_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="no_such_header.cuh"):
        cache.included_headers('#include "no_such_header.cuh"\n')


def _build_in_child(cache_dir: str, queue) -> None:
    import os

    os.environ["DK_JIT_CACHE_DIR"] = cache_dir
    from deep_kernels.jit import runtime as child_runtime

    binary = child_runtime.build_binary(CAST_SPEC, "90a")
    queue.put(binary)


def test_concurrent_compiles_leave_one_valid_entry(tmp_cache):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    children = [context.Process(target=_build_in_child, args=(str(tmp_cache), queue)) for _ in range(4)]
    for child in children:
        child.start()
    binaries = [queue.get(timeout=600) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert all(b == binaries[0] for b in binaries) and binaries[0][:4] == b"\x7fELF"
    entries = [p for p in (tmp_cache / CAST_SPEC.name).iterdir() if p.is_dir()]
    assert len(entries) == 1, entries
    assert cache.read_entry(entries[0]) == binaries[0]


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_checksum"])
def test_corrupt_entry_is_rebuilt(tmp_cache, damage):
    binary = runtime.build_binary(CAST_SPEC, "90a")
    (entry,) = [p for p in (tmp_cache / CAST_SPEC.name).iterdir() if p.is_dir()]
    cubin = entry / cache.BINARY_NAME
    if damage == "truncate":
        cubin.write_bytes(binary[: len(binary) // 2])
    elif damage == "flip":
        cubin.write_bytes(binary[:100] + bytes([binary[100] ^ 0xFF]) + binary[101:])
    else:
        (entry / (cache.BINARY_NAME + ".sha256")).unlink()
    assert cache.read_entry(entry) is None
    assert runtime.build_binary(CAST_SPEC, "90a") == binary
    assert cache.read_entry(entry) == binary


@pytest.fixture
def nvrtc_backend(monkeypatch):
    """DK_JIT_USE_NVRTC=1 for the test; skips it only when libnvrtc cannot be loaded."""
    try:
        compiler.nvrtc_version()
    except RuntimeError as error:
        pytest.skip(str(error).splitlines()[0])
    monkeypatch.setenv("DK_JIT_USE_NVRTC", "1")


def _one_spec_per_kernel() -> dict:
    """{kernel name: its first specialization} over every family's precompile specs."""
    specs = {}
    for spec in _family_specs(FAMILIES):
        specs.setdefault(spec.name, spec)
    return specs


KERNEL_SPECS = _one_spec_per_kernel()


@pytest.mark.parametrize("backend", ["nvcc", "nvrtc"])
def test_keep_source_writes_cu_and_ptx(tmp_cache, monkeypatch, request, backend):
    if backend == "nvrtc":
        request.getfixturevalue("nvrtc_backend")
    monkeypatch.setenv("DK_JIT_KEEP_SOURCE", "1")
    runtime.build_binary(CAST_SPEC, "90a")
    (entry,) = [p for p in (tmp_cache / CAST_SPEC.name).iterdir() if p.is_dir()]
    assert (entry / compiler.SOURCE_NAME).read_text() == CAST_SPEC.render()
    assert ".target sm_90a" in (entry / compiler.PTX_NAME).read_text()


@pytest.mark.parametrize("backend", ["nvcc", "nvrtc"])
def test_compile_error_is_reported_with_the_log(tmp_cache, request, backend):
    if backend == "nvrtc":
        request.getfixturevalue("nvrtc_backend")
    broken = KernelSpec(CAST_SPEC.header, CAST_SPEC.entry, ("not_a_type",) + CAST_SPEC.template_args[1:])
    with pytest.raises(RuntimeError, match=f"^{backend} failed") as error:
        runtime.build_binary(broken, "90a")
    assert 'identifier "not_a_type" is undefined' in str(error.value)


@pytest.mark.parametrize("kernel_name", sorted(KERNEL_SPECS))
def test_nvrtc_compiles_every_kernel_for_sm90a(tmp_cache, nvrtc_backend, kernel_name):
    spec = KERNEL_SPECS[kernel_name]
    binary = runtime.build_binary(spec, "90a")
    assert binary[:4] == b"\x7fELF"
    (entry,) = [p for p in (tmp_cache / spec.name).iterdir() if p.is_dir()]
    assert ".target\tsm_90a" in sass.sass(entry / cache.BINARY_NAME)


def test_nvrtc_key_differs_from_nvcc(nvrtc_backend, monkeypatch):
    source = CAST_SPEC.render()
    nvrtc_identity = compiler.compiler_identity("90a")
    monkeypatch.setenv("DK_JIT_USE_NVRTC", "0")
    nvcc_identity = compiler.compiler_identity("90a")
    assert compiler.nvrtc_version() in nvrtc_identity and "nvrtc" not in nvcc_identity
    assert cache.cache_key(source, nvrtc_identity) != cache.cache_key(source, nvcc_identity)


def test_nvrtc_debug_and_ptxas_verbose_print_options_and_usage(tmp_cache, nvrtc_backend, monkeypatch, capsys):
    monkeypatch.setenv("DK_JIT_DEBUG", "1")
    monkeypatch.setenv("DK_JIT_PTXAS_VERBOSE", "1")
    runtime.build_binary(CAST_SPEC, "90a")
    printed = capsys.readouterr().err
    assert "--ptxas-options=-v" in printed and "--gpu-architecture=sm_90a" in printed
    assert "ptxas info    : Used" in printed


def test_nvrtc_precompiled_gemm_passes_the_sass_checks(tmp_cache, nvrtc_backend):
    spec = KERNEL_SPECS["sm90_fp8_gemm"]
    (entry,) = precompile([spec], arch="90a", progress=False)
    assert sass.kernel_problems(spec.name, entry / cache.BINARY_NAME) == []


def test_precompile_builds_every_spec_once(tmp_cache):
    other = KernelSpec(CAST_SPEC.header, CAST_SPEC.entry, CAST_SPEC.template_args[:-1] + (2,))
    entries = precompile([CAST_SPEC, other, CAST_SPEC], arch="90a", progress=False)
    assert entries[0] == entries[2] != entries[1]
    assert all(cache.read_entry(e) is not None for e in entries)
    # Already cached: the second run compiles nothing and returns the same entries.
    assert precompile([CAST_SPEC, other], arch="90a", progress=False) == entries[:2]


def test_invalid_env_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("DK_JIT_DEBUG", "maybe")
    with pytest.raises(ValueError, match="DK_JIT_DEBUG"):
        envs.get("DK_JIT_DEBUG")


def test_launcher_builds_and_imports(tmp_cache):
    module = launcher.load.__wrapped__()
    assert callable(module.launch)
    with pytest.raises(ValueError, match="1 parameters for a signature of 2"):
        module.launch(0, (1, 1, 1), 32, 0, 1, 0, 0, "PP", (1,))


@pytest.mark.parametrize("spec,error,match", [
    ((0, 0, 1, (4, 256), (1, 256), (1, 128), 3), ValueError, "innermost dimension must be dense"),
    ((0, 0, 1, (), (), (), 0), ValueError, "rank 1 to 5"),
    (b"encoded", TypeError, "spec tuple"),
])
def test_tensor_map_specs_are_checked_before_the_driver(tmp_cache, spec, error, match):
    module = launcher.load.__wrapped__()
    with pytest.raises(error, match=match):
        module.launch(0, (1, 1, 1), 32, 0, 1, 0, 0, "T", (spec,))
