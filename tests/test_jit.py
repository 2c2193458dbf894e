"""The JIT runtime without a GPU: codegen, cache keys, concurrent and corrupt cache entries, ninja
precompile and the native launcher's build."""

import multiprocessing
import shutil
from pathlib import Path

import pytest

from deep_kernels import envs
from deep_kernels.jit import cache, compiler, launcher, runtime
from deep_kernels.jit.precompile import precompile
from deep_kernels.jit.source import KernelSpec

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


def test_keep_source_writes_cu_and_ptx(tmp_cache, monkeypatch):
    monkeypatch.setenv("DK_JIT_KEEP_SOURCE", "1")
    runtime.build_binary(CAST_SPEC, "90a")
    (entry,) = [p for p in (tmp_cache / CAST_SPEC.name).iterdir() if p.is_dir()]
    assert (entry / compiler.SOURCE_NAME).read_text() == CAST_SPEC.render()
    assert ".target sm_90a" in (entry / compiler.PTX_NAME).read_text()


def test_compile_error_is_reported_with_the_command(tmp_cache):
    broken = KernelSpec(CAST_SPEC.header, CAST_SPEC.entry, ("not_a_type",) + CAST_SPEC.template_args[1:])
    with pytest.raises(RuntimeError, match="nvcc failed"):
        runtime.build_binary(broken, "90a")


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
