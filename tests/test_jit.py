"""The JIT runtime without a GPU: kernel declarations (spec, keyword launch, the checks against the binary),
the registry, codegen, cache keys, concurrent and corrupt cache entries, ninja precompile, the NVRTC backend and
the native launcher's build."""

import dataclasses
import multiprocessing
import queue as queue_module
import re
import shutil
import time
from pathlib import Path

import pytest
import torch

from deep_kernels import envs
from deep_kernels.jit import cache, compiler, launcher, registry, runtime, signature
from deep_kernels.jit.definition import F32, I32, PTR, TENSOR_MAP, U32, KernelDef, Param
from deep_kernels.jit.precompile import precompile
from deep_kernels.jit.source import KernelSpec
from deep_kernels.quant.common import ScaleLayout
from deep_kernels.quant.fp8 import PER_TOKEN_CAST
from deep_kernels.testing import sass

from conftest import cache_dir_set_to

CAST_SPEC = PER_TOKEN_CAST.spec(InT=torch.bfloat16, GROUP_SIZE=128, kUE8M0=False, kLayout=ScaleLayout.mn_major,
                                kNumWarps=8, kPasses=4, kScaleMode="deep_kernels::ScaleMode::Multiply")
# The same kernel with another number of passes.
OTHER_SPEC = PER_TOKEN_CAST.spec(*CAST_SPEC.template_args[:5], 2, CAST_SPEC.template_args[6])


def test_render_includes_header_and_instantiates_template():
    source = CAST_SPEC.render()
    assert '#include "kernels/smxx_per_token_cast.cuh"' in source
    assert ("&deep_kernels::smxx_per_token_cast_impl<__nv_bfloat16, 128, false, "
            "deep_kernels::ScaleLayout::MNMajor, 8, 4, deep_kernels::ScaleMode::Multiply>") in source
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
    other = OTHER_SPEC
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
    binaries = []
    deadline = time.monotonic() + 600
    while len(binaries) < len(children):
        try:
            binaries.append(queue.get(timeout=1))
        except queue_module.Empty:
            # A child that died (at import, say) never answers: fail now rather than at the deadline.
            failed = [child.exitcode for child in children if child.exitcode not in (None, 0)]
            assert not failed, f"a compiling child exited with {failed}"
            assert time.monotonic() < deadline, "the compiling children gave no result in 600 s"
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
    for spec in registry.precompile_specs():
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
    # The same program again: NVRTC's own cache (12.9+, where a driver is present) would print no report.
    compiler.nvrtc_compile(CAST_SPEC.render(), "90a")
    assert "ptxas info    : Used" in capsys.readouterr().err


@pytest.mark.parametrize("release,no_cache", [((13, 0), True), ((12, 9), True), ((12, 8), False)])
def test_ptxas_verbose_turns_nvrtcs_cache_off_where_it_has_one(monkeypatch, release, no_cache):
    monkeypatch.setattr(compiler, "nvrtc_release", lambda: release)
    assert "--no-cache" not in compiler.nvrtc_options("90a")
    monkeypatch.setenv("DK_JIT_PTXAS_VERBOSE", "1")
    options = compiler.nvrtc_options("90a")
    assert "--ptxas-options=-v" in options and ("--no-cache" in options) == no_cache


def test_ptxas_verbose_prints_the_usage_of_ninja_precompiles(tmp_cache, monkeypatch, capfd):
    monkeypatch.setenv("DK_JIT_PTXAS_VERBOSE", "1")
    precompile([CAST_SPEC], arch="90a", progress=False)
    printed = capfd.readouterr().err
    assert "ptxas info    : Used" in printed and not re.search(r"^\[\d+/\d+\]", printed, re.MULTILINE)


def test_nvrtc_precompiled_gemm_passes_the_sass_checks(tmp_cache, nvrtc_backend):
    spec = KERNEL_SPECS["sm90_fp8_gemm"]
    (entry,) = precompile([spec], arch="90a", progress=False)
    assert sass.kernel_problems(spec.name, entry / cache.BINARY_NAME) == []


def test_precompile_builds_every_spec_once(tmp_cache):
    other = OTHER_SPEC
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


def test_tensor_map_gives_dimensions_of_one_element_a_stride_the_driver_takes():
    wide = torch.empty(3, 2, 1000, dtype=torch.float8_e4m3fn)
    one_row = wide[:1, :1, :900]  # strides (2000, 1000, 1): 1000 bytes is no multiple of 16
    *_, shape, strides, box, _ = runtime.tensor_map(one_row, (1, 1, 128))
    assert shape == (1, 1, 900) and strides == (912, 912, 1) and box == (1, 1, 128)
    # Dimensions of more than one element keep their strides; with transpose the first dimension is innermost.
    column = torch.empty(64, 3, dtype=torch.float32).t()[:, :1]  # shape (3, 1), strides (1, 3)
    assert runtime.tensor_map(column, (3, 1), transpose=True)[3:5] == ((1, 3), (4, 1))
    assert runtime.tensor_map(wide[:, :1, :900], (1, 1, 128))[4] == (2000, 912, 1)


@pytest.mark.parametrize("spec,error,match", [
    ((0, 0, 1, (4, 256), (1, 256), (1, 128), 3), ValueError, "innermost dimension must be dense"),
    ((0, 0, 1, (), (), (), 0), ValueError, "rank 1 to 5"),
    (b"encoded", TypeError, "spec tuple"),
])
def test_tensor_map_specs_are_checked_before_the_driver(tmp_cache, spec, error, match):
    module = launcher.load.__wrapped__()
    with pytest.raises(error, match=match):
        module.launch(0, (1, 1, 1), 32, 0, 1, 0, 0, "T", (spec,))


# ---- kernel declarations ----

@pytest.fixture
def scratch_registry(monkeypatch):
    """KernelDefs declared by the test leave the registry when it ends."""
    monkeypatch.setattr(registry, "_definitions", dict(registry._definitions))


def _toy_def(**changes) -> KernelDef:
    fields = dict(header="kernels/toy.cuh", entry="toy_kernel_impl", template=("InT", "kNumWarps", "kFlag"),
                  params=(Param("tmap_a", TENSOR_MAP), Param("x", PTR), Param("shape_m", U32), Param("offset", I32),
                          Param("scale", F32)),
                  threads=lambda t: t["kNumWarps"] * 32)
    return KernelDef(**{**fields, **changes})


def test_spec_binds_template_arguments_like_a_call(scratch_registry):
    toy = _toy_def()
    spec = toy.spec(torch.bfloat16, kFlag=True, kNumWarps=4)
    assert spec == toy.spec(InT="__nv_bfloat16", kNumWarps=4, kFlag="true")
    assert spec.template_args == ("__nv_bfloat16", 4, "true") and spec.definition is toy
    assert spec.name == "toy_kernel" and toy.param_kinds == "TPIif" and toy.block_threads(spec) == 128
    assert toy.cluster_size(spec) == 1 and not toy.cooperative
    assert toy.spec(torch.float32, 4, ScaleLayout.row_major).template_args[2] == "deep_kernels::ScaleLayout::RowMajor"
    for args, kwargs, match in [((torch.bfloat16, 4), {}, "missing: kFlag"),
                                ((torch.bfloat16, 4, True, 1), {}, "takes 3 template arguments"),
                                ((torch.bfloat16, 4), {"kFlags": True}, "no template parameter 'kFlags'"),
                                ((torch.bfloat16, 4, True), {"kNumWarps": 8}, "given twice"),
                                ((1.5, 4, True), {}, "cannot spell 1.5")]:
        with pytest.raises(TypeError, match=match):
            toy.spec(*args, **kwargs)


def test_declarations_are_checked(scratch_registry):
    with pytest.raises(ValueError, match="declared twice: \\['x'\\]"):
        _toy_def(entry="toy_a_impl", params=(Param("x", PTR), Param("x", U32)))
    for name in ("grid", "values", "torch", "_x", "lambda", "2x"):
        with pytest.raises(ValueError, match=f"'{name}' cannot name a parameter"):
            _toy_def(entry="toy_b_impl", params=(Param(name, PTR),))
    with pytest.raises(TypeError, match="parameters are Param"):
        _toy_def(entry="toy_c_impl", params=(("x", "P"),))
    _toy_def()
    _toy_def()  # the same declaration again (a reloaded module) replaces it
    with pytest.raises(ValueError, match="toy_kernel_impl is declared twice, with different"):
        _toy_def(params=(Param("x", PTR),))


@pytest.fixture
def recorded_launches(monkeypatch):
    """runtime's native launch replaced by a recorder (no driver, no GPU)."""
    calls = []
    monkeypatch.setattr(runtime, "_native_launch", lambda *args: calls.append(args))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)
    return calls


def test_keyword_launch_passes_values_in_declaration_order(scratch_registry, recorded_launches):
    toy = _toy_def()
    kernel = runtime.Kernel(toy, 1234, None, 128, 4096, 2)
    tmap = (0x1000, 9, 2, (8, 64), (64, 1), (8, 64), 3)
    kernel.launch((3, 1, 1), 0, scale=0.5, offset=-2, shape_m=8, x=0x2000, tmap_a=tmap)
    assert recorded_launches == [(1234, (3, 1, 1), 128, 4096, 2, 0, 7, "TPIif", (tmap, 0x2000, 8, -2, 0.5), False)]


@pytest.mark.parametrize("params,match", [
    (dict(x=1, shape_m=8, offset=0, scale=1.0), "missing 1 required keyword-only argument: 'tmap_a'"),
    (dict(tmap_a=(), x=1, shape_m=8, offset=0, scale=1.0, stride=4), "got an unexpected keyword argument 'stride'"),
])
def test_launch_with_wrong_names_raises_before_launching(scratch_registry, recorded_launches, params, match):
    kernel = runtime.Kernel(_toy_def(), 1234, None, 128, 0, 1)
    with pytest.raises(TypeError, match=f"^toy_kernel.launch\\(\\) {match}$"):
        kernel.launch((1, 1, 1), 0, **params)
    assert recorded_launches == []


def test_launch_names_the_parameter_the_launcher_rejects(scratch_registry, monkeypatch):
    def native(*args):
        raise OverflowError("can't convert negative int to unsigned")

    monkeypatch.setattr(runtime, "_native_launch", native)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    kernel = runtime.Kernel(_toy_def(), 1234, None, 128, 0, 1)
    with pytest.raises(OverflowError, match="parameter shape_m \\(uint32_t\\) cannot take -8"):
        kernel.launch((1, 1, 1), 0, tmap_a=(), x=1, shape_m=-8, offset=0, scale=1.0)


def test_keyword_launch_costs_little(scratch_registry, recorded_launches):
    # The hot path: the generated launch binds the names in C and calls the native launcher (here a recorder).
    import timeit

    kernel = runtime.Kernel(_toy_def(), 1234, None, 128, 0, 1)
    params = dict(tmap_a=(), x=1, shape_m=8, offset=0, scale=1.0)
    seconds = min(timeit.repeat(lambda: kernel.launch((1, 1, 1), 0, **params), number=2000, repeat=5)) / 2000
    assert seconds < 20e-6, seconds


def test_param_layout_mismatch_names_kernel_and_parameter():
    layout = [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4), (32, 4), (36, 4), (40, 4)]
    signature.check_param_layout(PER_TOKEN_CAST, layout, CAST_SPEC)
    wrong_size = layout[:3] + [(24, 8)] + layout[4:]
    with pytest.raises(signature.SignatureError, match="smxx_per_token_cast .*parameter 3 'shape_m' is declared "
                                                       "uint32_t \\(4 bytes\\), the kernel's parameter 3 has 8 bytes"):
        signature.check_param_layout(PER_TOKEN_CAST, wrong_size, CAST_SPEC)
    with pytest.raises(signature.SignatureError, match="parameter 7 'amax_clamp' \\(float\\) is declared, but the "
                                                       "kernel takes 7 parameters"):
        signature.check_param_layout(PER_TOKEN_CAST, layout[:-1])
    with pytest.raises(signature.SignatureError, match="the kernel's parameter 8 \\(8 bytes\\) is not declared"):
        signature.check_param_layout(PER_TOKEN_CAST, layout + [(48, 8)])
    signature.check_block_threads(PER_TOKEN_CAST, 256, 1024)
    with pytest.raises(signature.SignatureError, match="declared to run 512 threads a block, the kernel's launch "
                                                       "bounds allow 256"):
        signature.check_block_threads(PER_TOKEN_CAST, 512, 256)
    with pytest.raises(signature.SignatureError, match="128 threads"):
        signature.check_block_threads(PER_TOKEN_CAST, 128, 256, exact=True)


def test_load_checks_the_declaration_against_the_driver(monkeypatch):
    # load_kernel with a fake driver whose kernel takes a parameter fewer than declared: SignatureError before
    # anything is configured.
    from cuda.bindings import driver

    success, invalid = driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_INVALID_VALUE
    sizes = [8, 8, 8, 4, 4, 4, 4]
    fake = dict(
        cuInit=lambda flags: (success,),
        cuLibraryLoadData=lambda *args: (success, "library"),
        cuLibraryGetKernelCount=lambda library: (success, 1),
        cuLibraryEnumerateKernels=lambda count, library: (success, ["kernel"]),
        cuCtxGetCurrent=lambda: (success, 1),
        cuKernelGetParamInfo=lambda kernel, i: (success, 8 * i, sizes[i]) if i < len(sizes) else (invalid, 0, 0),
        cuKernelSetAttribute=lambda *args: pytest.fail("configured a mismatching kernel"),
    )
    for name, function in fake.items():
        monkeypatch.setattr(driver, name, function)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    with pytest.raises(signature.SignatureError, match="parameter 7 'amax_clamp'"):
        runtime.load_kernel(b"", CAST_SPEC)


def test_load_makes_the_current_devices_context_current_where_none_is(monkeypatch):
    # A thread without a current context (autograd's backward threads): the current device's primary context is made
    # current before the driver is asked for the parameters; with one, nothing changes.
    from cuda.bindings import driver

    success = driver.CUresult.CUDA_SUCCESS
    calls = []
    for current in (0, 5):
        fake = dict(
            cuCtxGetCurrent=lambda: (success, current),
            cuDeviceGet=lambda index: (success, f"device {index}"),
            cuDevicePrimaryCtxRetain=lambda device: (calls.append(("retain", device)), (success, "primary"))[1],
            cuCtxSetCurrent=lambda context: (calls.append(("set", context)), (success,))[1],
        )
        for name, function in fake.items():
            monkeypatch.setattr(driver, name, function)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
        runtime._make_a_context_current(driver)
        assert calls == [("retain", "device 3"), ("set", "primary")]


def test_load_configures_the_hopper_devices_only(monkeypatch):
    # A machine with a Hopper GPU and another: the cubin (sm_90a) is configured for the first only, where the other
    # would refuse it.
    from cuda.bindings import driver

    success, invalid = driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_INVALID_VALUE
    layout = [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4), (32, 4), (36, 4), (40, 4)]
    configured = []
    fake = dict(
        cuInit=lambda flags: (success,),
        cuLibraryLoadData=lambda *args: (success, "library"),
        cuLibraryGetKernelCount=lambda library: (success, 1),
        cuLibraryEnumerateKernels=lambda count, library: (success, [7]),
        cuCtxGetCurrent=lambda: (success, 1),
        cuKernelGetParamInfo=lambda kernel, i: (success, *layout[i]) if i < len(layout) else (invalid, 0, 0),
        cuDeviceGet=lambda index: (success, f"device {index}"),
        cuKernelGetAttribute=lambda attribute, kernel, device: (success, 1024),
        cuKernelSetAttribute=lambda attribute, value, kernel, device: configured.append(device) or (success,),
    )
    for name, function in fake.items():
        monkeypatch.setattr(driver, name, function)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: [(8, 0), (9, 0)][index])
    runtime.load_kernel(b"", CAST_SPEC, smem_bytes=1000)
    assert configured == ["device 1"]


def test_elf_info_parses_parameters_and_launch_bounds():
    text = """.nv.info._Z3fooPfj
\tAttribute:\tEIATTR_KPARAM_INFO
\tFormat:\tEIFMT_SVAL
\tValue:\tIndex : 0x0\tOrdinal : 0x1\tOffset  : 0x8\tSize    : 0x4
\tAttribute:\tEIATTR_KPARAM_INFO
\tFormat:\tEIFMT_SVAL
\tValue:\tIndex : 0x0\tOrdinal : 0x0\tOffset  : 0x0\tSize    : 0x8
\tAttribute:\tEIATTR_MAX_THREADS
\tFormat:\tEIFMT_SVAL
\tValue:\t0x80 0x1 0x1 
"""
    assert signature.parse_elf_info(text) == signature.CubinSignature("_Z3fooPfj", [(0, 8), (8, 4)], 128)
    assert signature.param_type_of("float const*") is PTR and signature.param_type_of("unsigned int") is U32
    assert signature.param_type_of("CUtensorMap_st") is TENSOR_MAP and signature.param_type_of("int") is I32


def test_registry_holds_every_family_and_kernel():
    assert set(registry.families()) == {"quant", "gemm", "grouped_gemm", "moe", "fp4_gemm", "k_grouped_gemm", "bf16_gemm",
                                         "k_grouped_bf16_gemm", "nvfp4_gemm"}
    specs = registry.precompile_specs()
    assert all(spec.definition is registry._definitions[spec.entry] for spec in specs)
    assert {d.entry for d in registry.definitions()} == {spec.entry for spec in specs}  # each one precompiled
    with pytest.raises(ValueError, match="unknown kernel families \\['gem'\\]"):
        registry.precompile_specs(["gem"])


@pytest.fixture(scope="module")
def one_cubin_per_kernel(tmp_path_factory):
    with cache_dir_set_to(tmp_path_factory.mktemp("cache")):
        specs = list(KERNEL_SPECS.values())
        yield list(zip(specs, precompile(specs, arch="90a", progress=False)))


def test_every_kernel_binary_matches_its_declaration(one_cubin_per_kernel):
    # Parameter sizes as the driver reports them at load time, C++ parameter types and launch bounds.
    for spec, entry in one_cubin_per_kernel:
        signature.check_cubin(spec, entry / cache.BINARY_NAME)
    assert {spec.name for spec, _ in one_cubin_per_kernel} >= {"smxx_per_token_cast", "sm90_fp8_gemm", "smxx_moe_expand"}


def test_a_wrong_declaration_is_caught_against_the_binary(one_cubin_per_kernel, scratch_registry):
    spec, entry = next((s, e) for s, e in one_cubin_per_kernel if s.name == "smxx_per_token_cast")
    found = signature.cubin_signature(entry / cache.BINARY_NAME)
    swapped = list(PER_TOKEN_CAST.params)
    swapped[3], swapped[7] = swapped[7], swapped[3]  # amax_clamp before the sizes: the same sizes, other types
    for i, (params, match) in enumerate([
            (PER_TOKEN_CAST.params[:-1], "parameter 7 .* is not declared"),
            (swapped, "parameter 3 'amax_clamp' is declared float, the kernel's is unsigned int")]):
        wrong = dataclasses.replace(PER_TOKEN_CAST, entry=f"wrong_cast_{i}_impl", params=tuple(params))
        with pytest.raises(signature.SignatureError, match=match):
            signature.check_param_layout(wrong, found.layout)
            signature.check_param_types(wrong, signature.demangled_param_types(found.symbol))


@pytest.mark.gpu
def test_a_kernel_loads_in_a_thread_without_a_current_context(monkeypatch):
    # Autograd's backward threads may load a kernel the forward did not use before any CUDA runtime call of theirs:
    # the driver then has no current context there, which cuKernelGetParamInfo needs.
    import threading

    from cuda.bindings import driver

    from deep_kernels.quant import transpose

    x = torch.randn((3, 40, 24), device="cuda")
    transpose.batched_transpose(x)  # compiled and cached on disk, so that the thread only loads it
    monkeypatch.setattr(runtime, "_kernels", {})
    transpose._transpose_kernel.cache_clear()
    results = {}

    def first_call():
        try:
            results["context before"] = int(runtime._check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent"))
            results["out"] = transpose.batched_transpose(x)
        except Exception as error:  # reported by the test's thread
            results["error"] = error

    thread = threading.Thread(target=first_call)
    thread.start()
    thread.join()
    transpose._transpose_kernel.cache_clear()  # its kernel came from the patched table
    assert results["context before"] == 0, "the thread had a context already: this test shows nothing"
    assert "error" not in results, results.get("error")
    torch.cuda.synchronize()
    assert torch.equal(results["out"], x.transpose(1, 2))
