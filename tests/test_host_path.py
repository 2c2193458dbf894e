"""The lean host path: a call whose signature (dtypes, shapes, strides, devices, arguments) was validated before runs
no check but the look-up, and the FP8 and BF16 GEMMs (dense, M-grouped and k-grouped) and the FP8 x FP4 GEMMs launch
from parameters encoded once per set of addresses.

CPU: the native launcher's encode / launch_encoded (what they check before the driver, the bytes they produce); on
the kernels' call paths with a fake kernel (no driver), which calls encode, that a cached signature still checks what
it does not fix (addresses), that each validation error fires on a new signature even after valid calls, and that
the encodings per signature are bounded. GPU: fp8_gemm_nt, bf16_gemm_nt, the M- and k-grouped GEMMs and the FP8 x FP4
GEMMs through many address sets of one signature (more than the cache holds) against the reference, eager and in a
CUDA graph; topk_gate_with_layout's cached plan against the reference.
"""

import dataclasses
import struct

import pytest
import torch

import deep_kernels
from deep_kernels import (
    bf16_gemm, call_cache, fp4_gemm, gemm, grouped_gemm, k_grouped_bf16_gemm, k_grouped_gemm, nvfp4_gemm,
)
from deep_kernels.jit import launcher, runtime
from deep_kernels.jit.definition import TENSOR_MAP
from deep_kernels.moe import gate, layout, routing
from deep_kernels.quant import fp8
from deep_kernels.reference import bf16_gemm as reference_bf16
from deep_kernels.reference import fp4_gemm as reference_fp4
from deep_kernels.reference import gemm as reference
from deep_kernels.reference import k_grouped_gemm as reference_k_grouped
from deep_kernels.reference import moe as reference_moe
from deep_kernels.testing import assert_bitwise_equal, copy_with_output_over_it, poison_, random_activations
from deep_kernels.testing.fp4_gemm import make_fp4_gemm_inputs, make_nvfp4_gemm_inputs, mxfp4_weights
from deep_kernels.testing.gemm import assert_gemm_close, make_gemm_inputs
from deep_kernels.testing.grouped import make_contiguous_inputs, make_masked_inputs
from deep_kernels.testing.wgrad import make_k_grouped_bf16_inputs, make_k_grouped_inputs

SLOT_BYTES = 128  # launcher.cpp's ParamSlot: a CUtensorMap's size


# ---- the native launcher (CPU: no driver needed before the driver call) ----

@pytest.fixture(scope="module")
def native(tmp_path_factory):
    import os

    previous = os.environ.get("DK_JIT_CACHE_DIR")
    os.environ["DK_JIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("jit"))
    try:
        yield launcher.load.__wrapped__()
    finally:
        if previous is None:
            del os.environ["DK_JIT_CACHE_DIR"]
        else:
            os.environ["DK_JIT_CACHE_DIR"] = previous


def test_encode_lays_out_one_slot_per_parameter(native):
    encoded = native.encode("PIif", (0x123456789A, 7, -3, 0.5))
    assert len(encoded) == 4 * SLOT_BYTES
    slots = [encoded[i * SLOT_BYTES:(i + 1) * SLOT_BYTES] for i in range(4)]
    assert struct.unpack("<Q", slots[0][:8]) == (0x123456789A,)
    assert struct.unpack("<I", slots[1][:4]) == (7,)
    assert struct.unpack("<i", slots[2][:4]) == (-3,)
    assert struct.unpack("<f", slots[3][:4]) == (0.5,)
    assert all(slot[8:] == bytes(SLOT_BYTES - 8) for slot in slots)  # zeroed past each value: deterministic bytes
    assert native.encode("PIif", (0x123456789A, 7, -3, 0.5)) == encoded


@pytest.mark.parametrize("kinds,values,error,match", [
    ("PP", (1,), ValueError, "1 parameters for a signature of 2"),
    ("T", ((0, 0, 1, (4, 256), (1, 256), (1, 128), 3),), ValueError, "innermost dimension must be dense"),
    ("T", (b"encoded",), TypeError, "spec tuple"),
    ("I", (-1,), OverflowError, "negative"),
])
def test_encode_checks_values_before_the_driver(native, kinds, values, error, match):
    with pytest.raises(error, match=match):
        native.encode(kinds, values)


def test_launch_encoded_rejects_bytes_that_are_no_encoding(native):
    with pytest.raises(ValueError, match="not the encoding"):
        native.launch_encoded(0, (1, 1, 1), 32, 0, 1, 0, 0, bytes(SLOT_BYTES + 4))
    with pytest.raises(ValueError, match="not the encoding"):
        native.launch_encoded(0, (1, 1, 1), 32, 0, 1, 0, 0, bytes(33 * SLOT_BYTES))


def test_prepare_rejects_bytes_that_are_no_encoding(native):
    with pytest.raises(ValueError, match="not the encoding"):
        native.prepare(0, (1, 1, 1), 32, 0, 1, 0, bytes(SLOT_BYTES + 4))
    with pytest.raises(ValueError, match="not the encoding"):
        native.prepare(0, (1, 1, 1), 32, 0, 1, 0, bytes(33 * SLOT_BYTES))
    launch = native.prepare(0, (1, 1, 1), 32, 0, 1, 0, native.encode("PI", (1, 2)))
    with pytest.raises(TypeError, match="an integer is required"):
        launch.launch("not a stream")


# ---- fp8_gemm_nt's cached path, with a fake kernel (CPU) ----

# The GEMM kernels the fake stands for, by their parameters' names.
_GEMM_KERNELS = {frozenset(param.name for param in definition.params): definition
                 for definition in (gemm.FP8_GEMM, fp4_gemm.FP8_FP4_SWAP_AB_GEMM, nvfp4_gemm.FP8_NVFP4_SWAP_AB_GEMM)}


class _FakeKernel:
    """Records encode() and the launches of prepare()'s launches instead of reaching the driver. An encoding must
    name every parameter of one of the GEMM kernels, with a tensor map spec (runtime.tensor_map's tuple) for each
    tensor map and a Python number for the others."""

    def __init__(self):
        self.encoded, self.launched = [], []

    def encode(self, **params):
        definition = _GEMM_KERNELS.get(frozenset(params))
        assert definition is not None, f"no GEMM kernel takes exactly {sorted(params)}"
        for param in definition.params:
            value = params[param.name]
            if param.type is TENSOR_MAP:
                assert isinstance(value, tuple) and len(value) == 7, f"{param.name}: {value!r} is no tensor map spec"
            else:
                assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{param.name}: {value!r}"
        self.encoded.append(params)
        return bytes(len(self.encoded))

    def prepare(self, grid, device_index, encoded):
        kernel = self

        class Launch:
            def launch(self, stream):
                kernel.launched.append(encoded)
        return Launch()


def _fake_call_path(monkeypatch, module, caches: tuple, kernel_getter: str) -> _FakeKernel:
    """module's GEMM call path with its caches emptied, the device checks off, a fixed SM count, a split-K workspace
    of CPU tensors and a _FakeKernel from its kernel_getter."""
    kernel = _FakeKernel()
    for cache in caches:
        monkeypatch.setattr(module, cache, {})
    monkeypatch.setattr(module, "check_cuda_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(module, "get_num_sms", lambda: 132)
    monkeypatch.setattr(module, kernel_getter, lambda *args, **kwargs: kernel)
    monkeypatch.setattr(module, "current_raw_stream", lambda device_index: 0)
    workspace = gemm._SplitWorkspace.__new__(gemm._SplitWorkspace)
    workspace.partials, workspace.tickets = torch.empty(1 << 22), torch.zeros(4096, dtype=torch.int32)
    monkeypatch.setattr(gemm, "_split_workspaces", {-1: workspace})  # CPU tensors' device index
    monkeypatch.setattr(gemm, "_split_workspace", lambda *args: workspace)
    return kernel


@pytest.fixture
def fake_gemm(monkeypatch):
    monkeypatch.setattr(gemm, "_tuned_config", lambda *args: None)
    return _fake_call_path(monkeypatch, gemm, ("_prepared_calls", "_plans"), "get_gemm_kernel")


def _cpu_gemm(m=64, n=256, k=512):
    a, b = make_gemm_inputs(m, n, k, device="cpu")
    return a, b, torch.empty(m, n, dtype=torch.bfloat16)


def test_a_cached_call_encodes_once_per_address_set(fake_gemm):
    a, b, d = _cpu_gemm()
    for _ in range(3):
        deep_kernels.fp8_gemm_nt(a, b, d)
    assert len(fake_gemm.encoded) == 1 and len(fake_gemm.launched) == 3
    params = fake_gemm.encoded[0]
    assert params["tmap_a"][0] == a[0].data_ptr() and params["tmap_d"][0] == d.data_ptr()
    assert params["sfb"] == b[1].data_ptr() and params["shape_m"] == 64
    other_d = torch.empty_like(d)
    deep_kernels.fp8_gemm_nt(a, b, other_d)  # new address: encoded again, with it
    assert len(fake_gemm.encoded) == 2 and fake_gemm.encoded[1]["tmap_d"][0] == other_d.data_ptr()
    assert fake_gemm.launched[-1] != fake_gemm.launched[0]


def test_encodings_per_signature_are_bounded(fake_gemm):
    a, b, d = _cpu_gemm()
    outputs = [torch.empty_like(d) for _ in range(runtime.LAUNCHES_PER_SIGNATURE + 5)]
    for out in outputs:
        deep_kernels.fp8_gemm_nt(a, b, out)
    (call,) = gemm._prepared_calls.values()
    assert len(call.launches) == runtime.LAUNCHES_PER_SIGNATURE
    deep_kernels.fp8_gemm_nt(a, b, outputs[-1])  # the newest are kept
    assert len(fake_gemm.encoded) == len(outputs)


def test_a_cached_signature_still_checks_the_addresses(fake_gemm):
    a, b, d = _cpu_gemm()
    deep_kernels.fp8_gemm_nt(a, b, d)
    _check_cached_signature_addresses(deep_kernels.fp8_gemm_nt, a, b, d)
    assert len(fake_gemm.launched) == 2


def _check_cached_signature_addresses(gemm_call, a, b, d) -> None:
    """After a valid gemm_call(a, b, d) (a an (a, sfa) pair): its signature with d 8 bytes off (TMA needs 16), then
    with d over a's memory, are refused; the call with a alone moved (launched) goes through."""
    storage = torch.empty(d.numel() + 4, dtype=torch.bfloat16)
    misaligned = storage[4:].view(d.shape)
    assert misaligned.stride() == d.stride() and misaligned.data_ptr() % 16 == 8
    with pytest.raises(ValueError, match="16-byte aligned addresses"):
        gemm_call(a, b, misaligned)
    a_in_shared, d_over_a = copy_with_output_over_it(a[0], d)
    gemm_call((a_in_shared, a[1]), b, d)
    with pytest.raises(ValueError, match="d and the operands must not overlap: d and a"):
        gemm_call((a_in_shared, a[1]), b, d_over_a)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d: ((a[0].view(torch.uint8), a[1]), b, d), TypeError, "a must be torch.float8_e4m3fn"),
    (lambda a, b, d: (a, (b[0][:, :256], b[1][:, :2]), d), ValueError, "K differs"),
    (lambda a, b, d: (a, b, d.float()), TypeError, "fp32 d is for accumulation"),
    (lambda a, b, d: (a, b, d[:, :128]), ValueError, "d must be a contiguous"),
    (lambda a, b, d: ((a[0], a[1][:, :1]), b, d), ValueError, "sfa must have shape"),
    (lambda a, b, d: (a, (b[0], b[1][:1]), d), ValueError, "sfb must have shape"),
    (lambda a, b, d: ((a[0][:, :496], a[1]), b, d), ValueError, "K differs"),
])
def test_each_check_fires_after_valid_calls(fake_gemm, mutate, error, match):
    # Valid calls first, so that the cache holds signatures; each bad call has a new one and is checked in full.
    a, b, d = _cpu_gemm()
    deep_kernels.fp8_gemm_nt(a, b, d)
    deep_kernels.fp8_gemm_nt(a, b, d)
    launched = len(fake_gemm.launched)
    with pytest.raises(error, match=match):
        deep_kernels.fp8_gemm_nt(*mutate(a, b, d))
    assert len(fake_gemm.launched) == launched


# ---- bf16_gemm_nt's cached launches, with a fake kernel (CPU) ----

@pytest.fixture
def fake_bf16(monkeypatch):
    monkeypatch.setattr(call_cache, "_checked_calls", {})
    return _fake_call_path(monkeypatch, bf16_gemm, ("_plans",), "_get_kernel")


def _cpu_bf16_gemm(m=64, n=256, k=512):
    return torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16(), torch.empty(m, n, dtype=torch.bfloat16)


def test_bf16_gemm_encodes_once_per_address_set_and_plan(fake_bf16, monkeypatch):
    a, b, d = _cpu_bf16_gemm()
    for _ in range(3):
        deep_kernels.bf16_gemm_nt(a, b, d)
    assert len(fake_bf16.encoded) == 1 and len(fake_bf16.launched) == 3
    params = fake_bf16.encoded[0]
    assert params["tmap_a"][0] == a.data_ptr() and params["tmap_b"][0] == b.data_ptr()
    assert params["tmap_d"][0] == d.data_ptr() and params["shape_m"] == 64
    other_d = torch.empty_like(d)
    deep_kernels.bf16_gemm_nt(a, b, other_d)  # a new address: encoded again, with it
    assert len(fake_bf16.encoded) == 2 and fake_bf16.encoded[1]["tmap_d"][0] == other_d.data_ptr()
    monkeypatch.setattr(bf16_gemm, "get_num_sms", lambda: 1)  # a new plan (set_num_sms): encoded again
    deep_kernels.bf16_gemm_nt(a, b, d)
    assert len(fake_bf16.encoded) == 3 and len(fake_bf16.launched) == 5
    assert fake_bf16.launched[-1] != fake_bf16.launched[0]


def test_bf16_gemm_cached_signature_still_checks_the_addresses(fake_bf16):
    a, b, d = _cpu_bf16_gemm()
    deep_kernels.bf16_gemm_nt(a, b, d)
    storage = torch.empty(d.numel() + 4, dtype=torch.bfloat16)
    misaligned = storage[4:].view(d.shape)  # the same signature 8 bytes off: TMA needs 16
    with pytest.raises(ValueError, match="16-byte aligned addresses"):
        deep_kernels.bf16_gemm_nt(a, b, misaligned)
    # The same signature again, d now over a's memory.
    shared = torch.empty(a.numel(), dtype=torch.bfloat16)
    a_in_shared = shared.view(a.shape).copy_(a)
    deep_kernels.bf16_gemm_nt(a_in_shared, b, d)
    with pytest.raises(ValueError, match="d and the operands"):
        deep_kernels.bf16_gemm_nt(a_in_shared, b, shared[:d.numel()].view(d.shape))
    assert len(fake_bf16.launched) == 2


# ---- the grouped GEMMs' cached launches, with a fake kernel (CPU) ----

GROUPED_KINDS = ["contiguous", "masked", "bf16_contiguous", "bf16_masked", "fp4_contiguous", "fp4_masked",
                 "fp4_masked_prepared"]


@pytest.fixture
def fake_grouped(monkeypatch):
    monkeypatch.setattr(grouped_gemm, "_tuned_config", lambda *args: None)
    monkeypatch.setattr(bf16_gemm, "_grouped_plans", {})
    monkeypatch.setattr(call_cache, "_checked_calls", {})
    kernel = _fake_call_path(monkeypatch, grouped_gemm, ("_plans",), "get_gemm_kernel")
    for name in ("check_cuda_device", "get_num_sms", "current_raw_stream"):
        monkeypatch.setattr(bf16_gemm, name, getattr(grouped_gemm, name))
    monkeypatch.setattr(bf16_gemm, "_get_kernel", lambda *args, **kwargs: kernel)
    monkeypatch.setattr(fp4_gemm, "_plans", {})
    for name in ("check_cuda_device", "get_num_sms"):
        monkeypatch.setattr(fp4_gemm, name, getattr(grouped_gemm, name))
    for name in ("_kernel", "_swap_ab_kernel"):
        monkeypatch.setattr(fp4_gemm, name, lambda *args: kernel)
    return kernel


def _cpu_grouped(kind: str, n=256, k=512) -> tuple:
    """(call(a, b, d, layout), a, b, d, layout) of a small grouped problem on the CPU (a and b: (tensor, scales)
    pairs for FP8 and MXFP4 weights, tensors for BF16; b prepared weights for fp4_masked_prepared)."""
    sizes, masked_m, m_max = [100, 0, 200], [5, 70], 128
    if kind == "fp4_contiguous":
        a, _, m_indices, _ = make_contiguous_inputs(sizes, n, k, device="cpu")
        return (deep_kernels.m_grouped_fp8_fp4_gemm_nt_contiguous, a, mxfp4_weights(n, k, "cpu", num_groups=3),
                torch.empty(m_indices.numel(), n, dtype=torch.bfloat16), m_indices)
    if kind.startswith("fp4_masked"):
        a, _, masked_m = make_masked_inputs(masked_m, m_max, n, k, device="cpu")
        b = mxfp4_weights(n, k, "cpu", num_groups=2)
        if kind == "fp4_masked_prepared":
            b = deep_kernels.prepare_fp4_weights(*b)
        return (lambda *args: deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked(*args, expected_m=64), a, b,
                torch.empty(2, m_max, n, dtype=torch.bfloat16), masked_m)
    if kind == "contiguous":
        a, b, m_indices, _ = make_contiguous_inputs(sizes, n, k, device="cpu")
        return (deep_kernels.m_grouped_fp8_gemm_nt_contiguous, a, b,
                torch.empty(m_indices.numel(), n, dtype=torch.bfloat16), m_indices)
    if kind == "masked":
        a, b, masked_m = make_masked_inputs(masked_m, m_max, n, k, device="cpu")
        return (lambda *args: deep_kernels.m_grouped_fp8_gemm_nt_masked(*args, expected_m=64), a, b,
                torch.empty(2, m_max, n, dtype=torch.bfloat16), masked_m)
    if kind == "bf16_contiguous":
        m_indices = make_contiguous_inputs(sizes, n, k, device="cpu")[2]
        return (deep_kernels.m_grouped_bf16_gemm_nt_contiguous, torch.randn(m_indices.numel(), k).bfloat16(),
                torch.randn(3, n, k).bfloat16(), torch.empty(m_indices.numel(), n, dtype=torch.bfloat16), m_indices)
    return (lambda *args: deep_kernels.m_grouped_bf16_gemm_nt_masked(*args, expected_m=64),
            torch.randn(2, m_max, k).bfloat16(), torch.randn(2, n, k).bfloat16(),
            torch.empty(2, m_max, n, dtype=torch.bfloat16), torch.tensor(masked_m, dtype=torch.int32))


def _data(operand) -> torch.Tensor:
    return operand[0] if isinstance(operand, tuple) else operand


def _with_data(operand, data: torch.Tensor):
    return (data, operand[1]) if isinstance(operand, tuple) else data


def _d_and_layout(kind: str, params: dict) -> tuple:
    """The addresses of d and of the group layout a grouped kernel was encoded with."""
    if kind == "fp4_masked_prepared":  # direct row stores: no tensor map of d
        return params["d"], params["masked_m"]
    return params["tmap_d"][0], params["grouped_layout"]


@pytest.mark.parametrize("kind", GROUPED_KINDS)
def test_grouped_gemm_encodes_once_per_address_set_and_plan(fake_grouped, monkeypatch, kind):
    call, a, b, d, group_layout = _cpu_grouped(kind)
    for _ in range(3):
        call(a, b, d, group_layout)
    assert len(fake_grouped.encoded) == 1 and len(fake_grouped.launched) == 3
    params = fake_grouped.encoded[0]
    assert params["tmap_a"][0] == _data(a).data_ptr() and _d_and_layout(kind, params) == (d.data_ptr(),
                                                                                        group_layout.data_ptr())
    if isinstance(a, tuple):
        assert params["tmap_sfa"][0] == a[1].data_ptr()
    if kind == "fp4_masked_prepared":
        assert params["prepared_weights"] == b.data.data_ptr() and params["num_groups"] == b.data.shape[0]
        assert params["shape_n"] == 256 and params["shape_k"] == 512
    else:
        assert params["tmap_b"][0] == _data(b).data_ptr() and params["num_groups"] == _data(b).shape[0]
        if isinstance(b, tuple):
            assert params["sfb"] == b[1].data_ptr()
    call(a, b, torch.empty_like(d), group_layout)  # a new address: encoded again, with it
    call(a, b, d, group_layout.clone())
    assert len(fake_grouped.encoded) == 3
    assert _d_and_layout(kind, fake_grouped.encoded[1])[0] != d.data_ptr()
    assert _d_and_layout(kind, fake_grouped.encoded[2])[1] != group_layout.data_ptr()
    for module in (grouped_gemm, bf16_gemm, fp4_gemm):  # a new plan (set_num_sms): encoded again
        monkeypatch.setattr(module, "get_num_sms", lambda: 1)
    call(a, b, d, group_layout)
    assert len(fake_grouped.encoded) == 4 and len(fake_grouped.launched) == 6
    assert fake_grouped.launched[-1] != fake_grouped.launched[0]


@pytest.mark.parametrize("kind", GROUPED_KINDS)
def test_grouped_gemm_cached_signature_still_checks_the_addresses(fake_grouped, kind):
    call, a, b, d, group_layout = _cpu_grouped(kind)
    call(a, b, d, group_layout)
    storage = torch.empty(d.numel() + 4, dtype=torch.bfloat16)
    misaligned = storage[4:].view(d.shape)  # the same signature 8 bytes off: TMA needs 16
    with pytest.raises(ValueError, match="16-byte aligned addresses"):
        call(a, b, misaligned, group_layout)
    # The same signature again, d now over a's memory, then over the layout's.
    a_in_shared, d_over_a = copy_with_output_over_it(_data(a), d)
    call(_with_data(a, a_in_shared), b, d, group_layout)
    with pytest.raises(ValueError, match="d and the inputs must not overlap: d and a"):
        call(_with_data(a, a_in_shared), b, d_over_a, group_layout)
    layout_in_shared, d_over_layout = copy_with_output_over_it(group_layout, d)
    call(a, b, d, layout_in_shared)
    with pytest.raises(ValueError, match="d and the inputs must not overlap: d and (m_indices|masked_m)"):
        call(a, b, d_over_layout, layout_in_shared)
    assert len(fake_grouped.launched) == 3


def test_fp4_masked_prepared_weights_of_the_other_layout_get_their_own_launch(fake_grouped, monkeypatch):
    # Prepared weights of either layout may come to lie at the same address: the kernel, in the plan, tells them apart.
    other_layout = _FakeKernel()
    monkeypatch.setattr(fp4_gemm, "_swap_ab_kernel", lambda *args: other_layout if args[-1] else fake_grouped)
    call, a, prepared, d, masked_m = _cpu_grouped("fp4_masked_prepared")
    call(a, prepared, d, masked_m)
    call(a, dataclasses.replace(prepared, tile_scaled=not prepared.tile_scaled), d, masked_m)
    call(a, prepared, d, masked_m)
    assert len(fake_grouped.encoded) == 1 and len(fake_grouped.launched) == 2
    assert len(other_layout.encoded) == 1 and len(other_layout.launched) == 1


# ---- the k-grouped GEMMs' cached launches, with a fake kernel (CPU) ----

@pytest.fixture
def fake_k_grouped(monkeypatch):
    kernel = _FakeKernel()
    for module, kernel_getter in ((k_grouped_gemm, "get_gemm_kernel"), (k_grouped_bf16_gemm, "get_kernel")):
        for cache in ("_checked_calls", "_plans"):
            monkeypatch.setattr(module, cache, {})
        monkeypatch.setattr(module, "check_cuda_device", lambda *args, **kwargs: None)
        monkeypatch.setattr(module, "get_num_sms", lambda: 132)
        monkeypatch.setattr(module, kernel_getter, lambda *args, **kwargs: kernel)
    monkeypatch.setattr(grouped_gemm, "current_raw_stream", lambda device_index: 0)
    return kernel


def _cpu_k_grouped(bf16: bool, ks=(128, 0, 256), m=8, n=32) -> tuple:
    """(call(a, b, d, ks, ks_tensor, c=None), a, b, d, ks, ks_tensor) of a small k-grouped problem on the CPU: FP8
    (tensor, scales) pairs, or the BF16 tn layout's transposes (M- and N-major)."""
    if bf16:
        dy, x, ks_tensor = make_k_grouped_bf16_inputs(list(ks), m, n, device="cpu")
        a, b, call = dy.T, x.T, deep_kernels.k_grouped_bf16_gemm_nt_contiguous
    else:
        a, b, ks_tensor = make_k_grouped_inputs(list(ks), m, n, device="cpu")
        call = deep_kernels.k_grouped_fp8_gemm_nt_contiguous
    return call, a, b, torch.empty(len(ks), m, n), list(ks), ks_tensor


def _a_with_d_over_it(a, d: torch.Tensor) -> tuple:
    """(a with its data copied into memory that d_over_a then covers, d_over_a): the BF16 kind's M-major a, a
    transposed view, is copied as the contiguous tensor it views."""
    data = _data(a)
    transposed = not data.is_contiguous()
    shared, d_over_a = copy_with_output_over_it(data.T if transposed else data, d)
    return _with_data(a, shared.T if transposed else shared), d_over_a


@pytest.mark.parametrize("bf16", [False, True])
def test_k_grouped_gemm_encodes_once_per_address_set_and_plan(fake_k_grouped, monkeypatch, bf16):
    call, a, b, d, ks, ks_tensor = _cpu_k_grouped(bf16)
    call(a, b, d, ks, ks_tensor)
    call(a, b, d, [256, 0, 128], ks_tensor)  # other group sizes of the same sum: the same launch
    call(a, b, d, ks, ks_tensor)
    assert len(fake_k_grouped.encoded) == 1 and len(fake_k_grouped.launched) == 3
    params = fake_k_grouped.encoded[0]
    assert params["tmap_a"][0] == _data(a).data_ptr() and params["tmap_b"][0] == _data(b).data_ptr()
    assert params["tmap_d"][0] == d.data_ptr() and params["grouped_layout"] == ks_tensor.data_ptr()
    assert params["num_groups"] == 3 and params["shape_m"] == 8
    if not bf16:
        assert params["tmap_sfa"][0] == a[1].data_ptr() and params["tmap_sfb"][0] == b[1].data_ptr()
    call(a, b, torch.empty_like(d), ks, ks_tensor)  # a new address: encoded again, with it
    call(a, b, d, ks, ks_tensor.clone())
    assert len(fake_k_grouped.encoded) == 3
    assert fake_k_grouped.encoded[1]["tmap_d"][0] != d.data_ptr()
    assert fake_k_grouped.encoded[2]["grouped_layout"] != ks_tensor.data_ptr()
    for module in (k_grouped_gemm, k_grouped_bf16_gemm):  # a new plan (set_num_sms): encoded again
        monkeypatch.setattr(module, "get_num_sms", lambda: 1)
    call(a, b, d, ks, ks_tensor)
    assert len(fake_k_grouped.encoded) == 4 and len(fake_k_grouped.launched) == 6
    assert fake_k_grouped.launched[-1] != fake_k_grouped.launched[0]


@pytest.mark.parametrize("bf16", [False, True])
def test_k_grouped_gemm_cached_signature_still_checks_the_addresses(fake_k_grouped, bf16):
    call, a, b, d, ks, ks_tensor = _cpu_k_grouped(bf16)
    call(a, b, d, ks, ks_tensor)
    storage = torch.empty(d.numel() + 1)
    with pytest.raises(ValueError, match="16-byte aligned addresses"):  # the same signature 4 bytes off
        call(a, b, storage[1:].view(d.shape), ks, ks_tensor)
    # The same signature again, d now over a's memory, then over the group sizes'.
    a_in_shared, d_over_a = _a_with_d_over_it(a, d)
    call(a_in_shared, b, d, ks, ks_tensor)
    with pytest.raises(ValueError, match="d and the inputs must not overlap: d and a"):
        call(a_in_shared, b, d_over_a, ks, ks_tensor)
    sizes_in_shared, d_over_sizes = copy_with_output_over_it(ks_tensor, d)
    call(a, b, d, ks, sizes_in_shared)
    with pytest.raises(ValueError, match="d and the inputs must not overlap: d and ks_tensor"):
        call(a, b, d_over_sizes, ks, sizes_in_shared)
    assert len(fake_k_grouped.launched) == 3


def test_k_grouped_fp8_gemm_checks_the_weight_scales_alignment(fake_k_grouped):
    # The k-grouped kind reads sfb by TMA: 16 bytes, where the M-grouped kinds need 4.
    call, a, b, d, ks, ks_tensor = _cpu_k_grouped(False)
    sfb = b[1]
    storage = torch.empty(sfb.numel() + 1)
    misaligned = storage[1:].as_strided(sfb.shape, sfb.stride()).copy_(sfb)
    with pytest.raises(ValueError, match="a, sfa, b, sfb and d must start at 16-byte aligned addresses"):
        call(a, (b[0], misaligned), d, ks, ks_tensor)
    assert not fake_k_grouped.launched


@pytest.mark.parametrize("bf16", [False, True])
def test_k_grouped_gemm_copies_c_after_the_address_checks(fake_k_grouped, bf16):
    call, a, b, d, ks, ks_tensor = _cpu_k_grouped(bf16)
    c = torch.randn(d.shape)
    call(a, b, d, ks, ks_tensor, c)  # the fake kernel adds nothing: d holds c
    assert_bitwise_equal(d, c)
    # d.copy_(c) before the address checks would write c over a, then refuse the call.
    a_in_shared, d_over_a = _a_with_d_over_it(a, d)
    with pytest.raises(ValueError, match="d and the inputs must not overlap: d and a"):
        call(a_in_shared, b, d_over_a, ks, ks_tensor, c)
    assert_bitwise_equal(_data(a_in_shared), _data(a))
    assert len(fake_k_grouped.launched) == 1


@pytest.mark.parametrize("bf16", [False, True])
def test_k_grouped_gemm_without_tokens_writes_c_or_zeros(fake_k_grouped, bf16):
    call, a, b, d, ks, ks_tensor = _cpu_k_grouped(bf16, ks=(0, 0, 0))
    c = torch.randn(d.shape)
    call(a, b, d, ks, ks_tensor, c)
    assert_bitwise_equal(d, c)
    call(a, b, d, ks, ks_tensor)
    assert_bitwise_equal(d, torch.zeros_like(d))
    assert not fake_k_grouped.launched


# ---- the FP8 x FP4 decode GEMMs' cached launches, with a fake kernel (CPU) ----

@pytest.fixture
def fake_fp4(monkeypatch):
    kernel = _FakeKernel()
    monkeypatch.setattr(call_cache, "_checked_calls", {})
    monkeypatch.setattr(fp4_gemm, "_plans", {})
    monkeypatch.setattr(nvfp4_gemm, "_configs", {})
    workspace = gemm._SplitWorkspace.__new__(gemm._SplitWorkspace)
    workspace.partials, workspace.tickets = torch.empty(1 << 22), torch.zeros(4096, dtype=torch.int32)
    for module in (fp4_gemm, nvfp4_gemm):
        monkeypatch.setattr(module, "check_cuda_device", lambda *args, **kwargs: None)
        monkeypatch.setattr(module, "get_num_sms", lambda: 132)
        monkeypatch.setattr(module, "current_raw_stream", lambda device_index: 0)
        monkeypatch.setattr(module, "_split_workspace", lambda *args: workspace)
    monkeypatch.setattr(fp4_gemm, "_swap_ab_kernel", lambda *args: kernel)
    monkeypatch.setattr(fp4_gemm, "_kernel", lambda *args: kernel)
    monkeypatch.setattr(nvfp4_gemm, "get_kernel", lambda *args, **kwargs: kernel)
    return kernel


def _cpu_fp4(nvfp4: bool, m=16, n=512, k=1024) -> tuple:
    """((a, sfa), b, d) of a decode problem on the CPU: MXFP4 (codes, sfb) or NVFP4 (codes, sfb, global scale)."""
    a = make_gemm_inputs(m, n, k, device="cpu")[0]
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    if nvfp4:
        b = (codes, torch.full((n, k // 16), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn), torch.ones(1))
    else:
        b = (codes, torch.full((n, k // 32), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    return a, b, torch.empty(m, n, dtype=torch.bfloat16)


@pytest.mark.parametrize("nvfp4", [False, True])
def test_fp4_decode_gemm_encodes_once_per_address_set_and_config(fake_fp4, nvfp4):
    a, b, d = _cpu_fp4(nvfp4)
    for _ in range(3):
        deep_kernels.fp8_fp4_gemm_nt(a, b, d)
    assert len(fake_fp4.encoded) == 1 and len(fake_fp4.launched) == 3
    params = fake_fp4.encoded[0]
    assert params["tmap_a"][0] == a[0].data_ptr() and params["tmap_sfa"][0] == a[1].data_ptr()
    assert params["tmap_d"][0] == d.data_ptr() and params["tmap_codes"][0] == b[0].data_ptr()
    assert params["sfb" if nvfp4 else "sfb_words"] == b[1].data_ptr()
    deep_kernels.fp8_fp4_gemm_nt(a, b, torch.empty_like(d))  # a new address: encoded again, with it
    assert len(fake_fp4.encoded) == 2 and fake_fp4.encoded[1]["tmap_d"][0] != d.data_ptr()
    # A forced config (at the addresses of the first call, without split-K as the chosen one): its own launch.
    if nvfp4:
        from deep_kernels.heuristics import fp8_nvfp4_swap_ab as swap_ab
    else:
        from deep_kernels.heuristics import fp8_fp4_swap_ab as swap_ab
    config = swap_ab.make_config(32)
    assert config.num_splits == 1 and config != swap_ab.get_config(16, 512, 1024, 132)
    fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, d)
    fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, d)
    assert len(fake_fp4.encoded) == 3
    assert len(fake_fp4.launched) == 6 and fake_fp4.launched[-1] != fake_fp4.launched[0]


@pytest.mark.parametrize("nvfp4", [False, True])
def test_fp4_decode_gemm_cached_signature_still_checks_the_addresses(fake_fp4, nvfp4):
    a, b, d = _cpu_fp4(nvfp4)
    deep_kernels.fp8_fp4_gemm_nt(a, b, d)
    _check_cached_signature_addresses(deep_kernels.fp8_fp4_gemm_nt, a, b, d)
    assert len(fake_fp4.launched) == 2


def test_fp4_expanding_gemm_encodes_once_per_address_set(fake_fp4):
    # 256 tokens of unprepared weights with a forced config of the FP8 engine's kind that expands the codes.
    from deep_kernels.heuristics import fp8_fp4_gemm as expanding
    a, b, d = _cpu_fp4(False, m=256)
    config = expanding.get_config(256, 512, 1024, 132, d.element_size(), False)
    for _ in range(2):
        fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, d)
    assert len(fake_fp4.encoded) == 1 and len(fake_fp4.launched) == 2
    params = fake_fp4.encoded[0]
    assert params["tmap_a"][0] == a[0].data_ptr() and params["tmap_sfa"][0] == a[1].data_ptr()
    assert params["tmap_b"][0] == b[0].data_ptr() and params["sfb"] == b[1].data_ptr()
    assert params["tmap_d"][0] == d.data_ptr() and params["shape_m"] == 256
    fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, torch.empty_like(d))
    assert len(fake_fp4.encoded) == 2 and fake_fp4.encoded[1]["tmap_d"][0] != d.data_ptr()
    _check_cached_signature_addresses(lambda *args: fp4_gemm.fp8_fp4_gemm_nt_with_config(config, *args), a, b, d)
    assert len(fake_fp4.launched) == 4


@pytest.mark.parametrize("nvfp4", [False, True])
def test_fp4_gemm_refuses_d_over_a_before_copying_c(fake_fp4, nvfp4):
    # d.copy_(c) before the address checks would write c over a, then refuse the call.
    a, b, _ = _cpu_fp4(nvfp4)
    c = torch.randn(a[0].shape[0], 512)
    a_in_shared, d_over_a = copy_with_output_over_it(a[0], c)
    with pytest.raises(ValueError, match="d and the operands must not overlap: d and a"):
        deep_kernels.fp8_fp4_gemm_nt((a_in_shared, a[1]), b, d_over_a, c=c)
    assert_bitwise_equal(a_in_shared, a[0])
    assert not fake_fp4.launched


# ---- the gate's, the layout's and the cast's cached plans (CPU, fake kernel) ----

def _cpu_layout_workspace(device_index, num_block_counts, stream=None):
    return torch.zeros(32 + num_block_counts, dtype=torch.int32)


class _RecordingKernel:
    """A kernel whose prepared launches record their parameters instead of reaching the driver."""

    def __init__(self):
        self.launched = []

    def encode(self, **params):
        return params

    def prepare(self, grid, device_index, params):
        launched = self.launched

        class Launch:
            def launch(self, stream):
                launched.append(params)
        return Launch()


@pytest.fixture
def fake_routing(monkeypatch):
    """routing with the device checks off, a fixed SM count, a CPU workspace and a recording kernel."""
    kernel = _RecordingKernel()
    monkeypatch.setattr(routing, "_plans", {})
    monkeypatch.setattr(routing, "_out_calls", {})
    monkeypatch.setattr(routing, "current_raw_stream", lambda device_index: 0)
    monkeypatch.setattr(routing, "check_cuda_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(routing, "get_num_sms", lambda: 132)
    monkeypatch.setattr(routing, "fill_blocks", lambda num_ints: 8)
    monkeypatch.setattr(routing, "_fused_kernel", lambda *args: kernel)
    monkeypatch.setattr(routing, "_workspace", _cpu_layout_workspace)
    return kernel.launched


_GATE = dict(k=4, scoring="sigmoid", num_groups=4, topk_groups=2, routed_scaling_factor=2.5)


@pytest.mark.parametrize("changes,error,match", [
    (dict(k=4.0), ValueError, "k must be an integer"),
    (dict(renormalize=1), TypeError, "renormalize must be a bool"),
    (dict(num_groups=4.0), ValueError, "num_groups must be an integer"),
    (dict(max_tokens=0), ValueError, "max_tokens"),
    (dict(routed_scaling_factor=float("inf")), ValueError, "routed_scaling_factor"),
    (dict(bias=torch.zeros(15)), ValueError, "bias must be a contiguous tensor of shape \\(16,\\)"),
    (dict(logits=torch.zeros(8, 16, dtype=torch.float16)), TypeError, "logits must be"),
    (dict(k=[4]), ValueError, "k must be an integer"),
])
def test_gate_with_layout_checks_fire_after_valid_calls(fake_routing, changes, error, match):
    arguments = dict(_GATE, logits=torch.randn(8, 16), bias=torch.zeros(16), max_tokens=None)
    for _ in range(2):
        routing.topk_gate_with_layout(**arguments)
    assert len(fake_routing) == 2 and len(routing._plans) == 1
    with pytest.raises(error, match=match):
        routing.topk_gate_with_layout(**dict(arguments, **changes))
    assert len(fake_routing) == 2


@pytest.mark.parametrize("changes,error,match", [
    (dict(k=4.0), ValueError, "k must be an integer"),
    (dict(renormalize=1), TypeError, "renormalize must be a bool"),
    (dict(routed_scaling_factor=float("nan")), ValueError, "routed_scaling_factor"),
    (dict(bias=torch.zeros(15)), ValueError, "bias must be a contiguous tensor of shape \\(16,\\)"),
    (dict(logits=torch.zeros(8, 16, dtype=torch.float16)), TypeError, "logits must be"),
    (dict(max_tokens=3), TypeError, "out's masked_slots must be a torch.Tensor"),
])
def test_gate_with_layout_into_out_checks_fire_after_valid_calls(fake_routing, changes, error, match):
    """A call into out= repeating an earlier one launches without checks: any other argument is checked again."""
    arguments = dict(_GATE, logits=torch.randn(8, 16), bias=torch.zeros(16), max_tokens=None)
    out = _fresh_outputs(8, None)
    for _ in range(2):
        routing.topk_gate_with_layout(**arguments, out=out)
    assert len(fake_routing) == 2 and len(routing._out_calls) == 1
    with pytest.raises(error, match=match):
        routing.topk_gate_with_layout(**dict(arguments, **changes), out=out)
    assert len(fake_routing) == 2


def test_gate_with_layout_replans_for_a_new_sm_count(fake_routing, monkeypatch):
    logits = torch.randn(8, 16)
    routing.topk_gate_with_layout(logits, **_GATE)
    monkeypatch.setattr(routing, "get_num_sms", lambda: 1)
    routing.topk_gate_with_layout(logits, **_GATE)
    (plan,) = routing._plans.values()
    assert plan.num_sms == 1 and len(fake_routing) == 2


def test_gate_with_layout_into_out_launches_with_a_changed_argument(fake_routing):
    logits, out = torch.randn(8, 16), _fresh_outputs(8, None)
    for topk_groups in (2, 3, 2):
        routing.topk_gate_with_layout(logits, **dict(_GATE, topk_groups=topk_groups), out=out)
    assert [params["topk_groups"] for params in fake_routing] == [2, 3, 2]


def test_gate_with_layout_into_out_replans_for_a_new_sm_count(fake_routing, monkeypatch):
    logits, out = torch.randn(8, 16), _fresh_outputs(8, None)
    routing.topk_gate_with_layout(logits, **_GATE, out=out)
    monkeypatch.setattr(routing, "get_num_sms", lambda: 1)
    routing.topk_gate_with_layout(logits, **_GATE, out=out)
    (call,) = routing._out_calls.values()
    assert call.num_sms == 1 and len(fake_routing) == 2


def _fresh_outputs(num_tokens: int, max_tokens):
    """Separately allocated outputs of a _GATE call with 16 experts."""
    k, num_experts = _GATE["k"], 16
    max_rows = layout.contiguous_max_rows(num_tokens * k, num_experts)
    ints = lambda *shape: torch.empty(shape, dtype=torch.int32)
    masked = max_tokens is not None
    return (torch.empty(num_tokens, k), ints(num_tokens, k),
            layout.MoeLayout(ints(num_experts), ints(1), ints(max_rows), ints(max_rows), ints(num_tokens, k),
                             ints(num_experts, max_tokens) if masked else None, ints(num_experts) if masked else None))


@pytest.mark.parametrize("max_tokens", [None, 3])
def test_gate_with_layout_writes_out(fake_routing, max_tokens):
    logits = torch.randn(8, 16)
    out = _fresh_outputs(8, max_tokens)
    for _ in range(2):
        result = routing.topk_gate_with_layout(logits, **_GATE, max_tokens=max_tokens, out=out)
        assert result[0] is out[0] and result[1] is out[1] and result[2] is out[2]
    assert len(fake_routing) == 2
    params = fake_routing[-1]
    assert params["weights"] == out[0].data_ptr() and params["indices"] == out[1].data_ptr()
    for name in ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row", "masked_slots", "masked_m"):
        tensor = getattr(out[2], name)
        assert params[name] == (0 if tensor is None else tensor.data_ptr()), name
    # The allocating form of the same call lays its outputs out as out's.
    allocated = routing.topk_gate_with_layout(logits, **_GATE, max_tokens=max_tokens)
    for given, made in zip(_output_tensors(out), _output_tensors(allocated)):
        assert (given is None) == (made is None)
        if given is not None:
            assert (given.dtype, given.shape, given.stride()) == (made.dtype, made.shape, made.stride())


def _output_tensors(result) -> list:
    weights, indices, routed = result
    return [weights, indices] + [getattr(routed, name) for name in layout.MoeLayout.__dataclass_fields__]


def _replaced(out, name: str, value):
    weights, indices, routed = out
    if name == "weights":
        return value, indices, routed
    if name == "indices":
        return weights, value, routed
    return weights, indices, dataclasses.replace(routed, **{name: value})


@pytest.mark.parametrize("name,value,error,match", [
    ("weights", torch.empty(8, 4, dtype=torch.float64), ValueError, "out's weights must be a contiguous torch.float32"),
    ("indices", torch.empty(4, 8, dtype=torch.int32), ValueError, "out's indices must be .* shape \\(8, 4\\)"),
    ("slot_to_row", torch.empty(4, 8, dtype=torch.int32).t(), ValueError, "out's slot_to_row must be a contiguous"),
    ("m_indices", torch.empty(3, dtype=torch.int32), ValueError, "out's m_indices must be"),
    ("masked_m", torch.empty(16, dtype=torch.int32), ValueError, "out's masked_m must be None without max_tokens"),
    ("counts", "counts", TypeError, "out's counts must be a torch.Tensor"),
    ("layout", None, TypeError, "out must be \\(weights, indices, layout\\)"),
])
def test_gate_with_layout_rejects_bad_out(fake_routing, name, value, error, match):
    logits = torch.randn(8, 16)
    out = _fresh_outputs(8, None)
    routing.topk_gate_with_layout(logits, **_GATE, out=out)
    bad = (out[0], out[1], value) if name == "layout" else _replaced(out, name, value)
    with pytest.raises(error, match=match):
        routing.topk_gate_with_layout(logits, **_GATE, out=bad)
    assert len(fake_routing) == 1


def test_gate_with_layout_rejects_overlapping_or_misaligned_out(fake_routing):
    logits = torch.randn(8, 16)
    out = _fresh_outputs(8, None)
    with pytest.raises(ValueError, match="must not overlap: indices and slot_to_row do"):
        routing.topk_gate_with_layout(logits, **_GATE, out=_replaced(out, "slot_to_row", out[1]))
    with pytest.raises(ValueError, match="must not overlap"):
        routing.topk_gate_with_layout(logits, **_GATE, out=_replaced(out, "weights", logits.view(-1)[:32].view(8, 4)))
    max_rows = out[2].m_indices.numel()
    shifted = torch.empty(max_rows + 1, dtype=torch.int32)[1:]
    with pytest.raises(ValueError, match="out's m_indices must start at a 16-byte aligned address"):
        routing.topk_gate_with_layout(logits, **_GATE, out=_replaced(out, "m_indices", shifted))
    assert not fake_routing


@pytest.fixture
def fake_gate(monkeypatch):
    kernel = _RecordingKernel()
    monkeypatch.setattr(gate, "_plans", {})
    monkeypatch.setattr(gate, "current_raw_stream", lambda device_index: 0)
    monkeypatch.setattr(gate, "check_cuda_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(gate, "_gate_kernel", lambda *args: kernel)
    return kernel.launched


@pytest.mark.parametrize("changes,error,match", [
    (dict(k=4.0), ValueError, "k must be an integer"),
    (dict(renormalize=1), TypeError, "renormalize must be a bool"),
    (dict(topk_groups=5), ValueError, "topk_groups must be an integer in \\[1, 4\\]"),
    (dict(scoring="relu"), ValueError, "scoring must be one of"),
    (dict(bias=torch.zeros(16, dtype=torch.float64)), TypeError, "bias must be torch.float32"),
    (dict(logits=torch.zeros(8, 32)[:, ::2]), ValueError, "logits must have a contiguous last dimension"),
    (dict(k=[4]), ValueError, "k must be an integer"),  # unhashable: no look-up, the full check
])
def test_gate_checks_fire_after_valid_calls(fake_gate, changes, error, match):
    arguments = dict(_GATE, logits=torch.randn(8, 16), bias=torch.zeros(16))
    for _ in range(2):
        weights, indices = gate.topk_gate(**arguments)
    assert len(fake_gate) == 2 and len(gate._plans) == 1
    assert fake_gate[-1]["weights"] == weights.data_ptr() and fake_gate[-1]["indices"] == indices.data_ptr()
    with pytest.raises(error, match=match):
        gate.topk_gate(**dict(arguments, **changes))
    assert len(fake_gate) == 2


@pytest.fixture
def fake_layout(monkeypatch):
    kernel = _RecordingKernel()
    monkeypatch.setattr(layout, "_plans", {})
    monkeypatch.setattr(layout, "current_raw_stream", lambda device_index: 0)
    monkeypatch.setattr(layout, "check_cuda_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(layout, "get_num_sms", lambda: 132)
    monkeypatch.setattr(layout, "_layout_kernel", lambda *args: kernel)
    monkeypatch.setattr(layout, "layout_workspace", _cpu_layout_workspace)
    return kernel.launched


@pytest.mark.parametrize("changes,error,match", [
    (dict(num_experts=16.0), ValueError, "num_experts must be an integer"),
    (dict(max_tokens=0), ValueError, "max_tokens must be an integer"),
    (dict(topk_idx=torch.zeros(8, 4, dtype=torch.int16)), TypeError, "topk_idx must be"),
    (dict(topk_idx=torch.zeros(4, 8, dtype=torch.int32).t()), ValueError, "topk_idx must be contiguous"),
    (dict(max_tokens=[3]), ValueError, "max_tokens must be an integer"),  # unhashable: the full check
])
def test_layout_checks_fire_after_valid_calls(fake_layout, changes, error, match):
    arguments = dict(topk_idx=torch.randint(0, 16, (8, 4), dtype=torch.int32), num_experts=16, max_tokens=3)
    for _ in range(2):
        routed = layout.moe_layout(**arguments)
    assert len(fake_layout) == 2 and len(layout._plans) == 1
    assert fake_layout[-1]["m_indices"] == routed.m_indices.data_ptr()
    assert fake_layout[-1]["masked_slots"] == routed.masked_slots.data_ptr()
    with pytest.raises(error, match=match):
        layout.moe_layout(**dict(arguments, **changes))
    assert len(fake_layout) == 2


@pytest.mark.parametrize("num_tokens,k,num_experts,max_tokens", [(128, 8, 256, 128), (7, 3, 5, None), (7, 3, 5, 3),
                                                                 (1, 1, 1, 1)])
def test_layout_tensors_are_disjoint_aligned_views_of_one_allocation(num_tokens, k, num_experts, max_tokens):
    ints_layout = layout.LayoutInts(num_tokens, k, num_experts, max_tokens, with_gate=True)
    ints = torch.zeros(ints_layout.numel, dtype=torch.int32)
    weights, indices, routed = ints_layout.carve(ints)
    expected = reference_moe.moe_layout(torch.zeros(num_tokens, k, dtype=torch.int32), num_experts, max_tokens)
    pointers = ints_layout.pointers(ints.data_ptr())
    tensors = {"weights": weights, "indices": indices}
    tensors.update({name: getattr(routed, name) for name in layout.MoeLayout.__dataclass_fields__})
    for value, (name, tensor) in enumerate(tensors.items(), start=1):
        # The gate's outputs: [T, k] row-major, as topk_gate returns them.
        wanted = torch.empty(num_tokens, k) if name in ("weights", "indices") else getattr(expected, name)
        assert (tensor is None) == (wanted is None), name
        if tensor is None:
            continue
        assert tensor.shape == wanted.shape, name
        assert tensor.is_contiguous() and tensor.stride() == wanted.stride(), name
        dtype = torch.float32 if name == "weights" else torch.int32
        assert tensor.dtype == dtype and tensor.data_ptr() == pointers[name], name
        assert tensor.data_ptr() % 16 == 0, name
        tensor.fill_(value)
    # Each tensor kept its own value: none overlaps another.
    for value, (name, tensor) in enumerate(tensors.items(), start=1):
        if tensor is not None:
            assert bool((tensor == value).all()), name


@pytest.fixture
def fake_cast(monkeypatch):
    kernel = _RecordingKernel()
    monkeypatch.setattr(fp8, "_plans", {})
    monkeypatch.setattr(fp8, "current_raw_stream", lambda device_index: 0)
    monkeypatch.setattr(fp8, "check_cuda_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(fp8, "_cast_kernel", lambda *args: kernel)
    return kernel.launched


@pytest.mark.parametrize("changes,error,match", [
    (dict(group_size=100), ValueError, "group_size"),
    (dict(scale_layout="columns"), ValueError, "scale_layout"),
    (dict(amax_clamp=-1.0), ValueError, "amax_clamp"),
    (dict(x=torch.zeros(64, 256, dtype=torch.float16)), TypeError, "x must be"),
    (dict(x="x"), TypeError, "x must be a torch.Tensor"),
])
def test_cast_checks_fire_after_valid_calls(fake_cast, changes, error, match):
    arguments = dict(x=torch.randn(64, 256, dtype=torch.bfloat16))
    for _ in range(2):
        q, scales = fp8.per_token_cast_to_fp8(**arguments)
    assert len(fake_cast) == 2 and len(fp8._plans) == 1
    assert fake_cast[-1]["q"] == q.data_ptr() and fake_cast[-1]["scales"] == scales.data_ptr()
    assert scales.stride() == (1, 64) and q.shape == (64, 256)
    with pytest.raises(error, match=match):
        fp8.per_token_cast_to_fp8(**dict(arguments, **changes))
    assert len(fake_cast) == 2


def test_a_cached_cast_still_checks_the_address(fake_cast):
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    fp8.per_token_cast_to_fp8(x)
    # The same signature (dtype, shape, strides) at an address 8 bytes off.
    storage = torch.empty(x.numel() + 4, dtype=torch.bfloat16)
    misaligned = storage[4:].view(x.shape)
    assert misaligned.stride() == x.stride() and misaligned.data_ptr() % 16 == 8
    with pytest.raises(ValueError, match="x must start at a 16-byte aligned address"):
        fp8.per_token_cast_to_fp8(misaligned)
    assert len(fake_cast) == 1


# ---- GPU ----

def _tensors(operand) -> tuple:
    return tuple(operand) if isinstance(operand, tuple) else (operand,)


def _check_address_sets(gemm_call, a, b, expected: torch.Tensor, d_dtype=torch.bfloat16) -> None:
    """gemm_call(a_i, b_i, d) over more address sets of one signature than the cache holds, every operand moved (a
    and b: tensors or (tensor, scales) pairs, cloned with their strides; d of d_dtype): the first output against its
    float64 reference, the others bitwise equal to it. Every set stays alive (distinct addresses), its inputs
    poisoned once used, so that a stale encoding reads NaN. Then the original operands, once the cache has filled."""
    first, kept = None, []
    for i in range(runtime.LAUNCHES_PER_SIGNATURE + 6):
        a_i, b_i = (tuple(t.clone() for t in _tensors(x)) for x in (a, b))
        d = poison_(torch.empty(expected.shape, device="cuda", dtype=d_dtype))
        gemm_call(a_i if isinstance(a, tuple) else a_i[0], b_i if isinstance(b, tuple) else b_i[0], d)
        if first is None:
            assert_gemm_close(d, expected)
            first = d
        else:
            assert_bitwise_equal(d, first, f"address set {i}")
        for t in (*a_i, *b_i):
            poison_(t)
        kept.append((*a_i, *b_i, d))
    assert len({t.data_ptr() for tensors in kept for t in tensors}) == len(kept[0]) * len(kept)
    d = poison_(torch.empty(expected.shape, device="cuda", dtype=d_dtype))
    assert_bitwise_equal(gemm_call(a, b, d), first, "the original set after eviction")


@pytest.mark.gpu
def test_fp8_gemm_over_more_address_sets_than_the_cache_holds():
    m, n, k = 64, 4096, 7168  # split-K: the workspace's addresses are part of the key
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    _check_address_sets(deep_kernels.fp8_gemm_nt, a, b, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("n_major_b", [False, True])
def test_bf16_gemm_over_more_address_sets_than_the_cache_holds(n_major_b):
    m, n, k = 64, 4096, 7168
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((m, k), device="cuda", generator=g).bfloat16()
    b = torch.randn((n, k), device="cuda", generator=g).bfloat16()
    if n_major_b:
        b = b.t().contiguous().t()
    _check_address_sets(deep_kernels.bf16_gemm_nt, a, b, a.double() @ b.double().t())


# Per family of GROUPED_KINDS: (its contiguous GEMM, its masked GEMM, their references).
_GROUPED_GEMMS = {
    "fp8": (deep_kernels.m_grouped_fp8_gemm_nt_contiguous, deep_kernels.m_grouped_fp8_gemm_nt_masked,
            reference.m_grouped_fp8_gemm_nt_contiguous, reference.m_grouped_fp8_gemm_nt_masked),
    "bf16": (deep_kernels.m_grouped_bf16_gemm_nt_contiguous, deep_kernels.m_grouped_bf16_gemm_nt_masked,
             reference_bf16.m_grouped_bf16_gemm_nt_contiguous, reference_bf16.m_grouped_bf16_gemm_nt_masked),
    "fp4": (deep_kernels.m_grouped_fp8_fp4_gemm_nt_contiguous, deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked,
            reference_fp4.m_grouped_fp8_fp4_gemm_nt_contiguous, reference_fp4.m_grouped_fp8_fp4_gemm_nt_masked),
}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GROUPED_KINDS)
def test_grouped_gemm_over_more_address_sets_than_the_cache_holds(kind):
    n, k, sizes, masked_m, m_max = 512, 1024, [100, 0, 200], [5, 70, 0], 128
    family = kind.split("_")[0] if kind.startswith(("bf16", "fp4")) else "fp8"
    contiguous_gemm, masked_gemm, contiguous_reference, masked_reference = _GROUPED_GEMMS[family]
    contiguous = kind.endswith("contiguous")
    if contiguous:
        a, b, m_indices, _ = make_contiguous_inputs(sizes, n, k)
    else:
        a, b, masked_m = make_masked_inputs(masked_m, m_max, n, k)
    if family == "bf16":
        a = random_activations(a[0].numel() // k, k).view(a[0].shape)
        b = torch.randn(len(sizes), n, k, device="cuda").bfloat16()
    elif family == "fp4":
        b = mxfp4_weights(n, k, num_groups=len(sizes))
    # Padding rows and rows past masked_m stay NaN, as in the poisoned d.
    expected = torch.full((*_data(a).shape[:-1], n), float("nan"), device="cuda", dtype=torch.float64)
    if contiguous:
        contiguous_reference(a, b, expected, m_indices)
        call = lambda a, b, d: contiguous_gemm(a, b, d, m_indices)
    else:
        masked_reference(a, b, expected, masked_m, 64)
        expected = expected.flatten(0, 1)
        call = lambda a, b, d: masked_gemm(a, b, d.view(len(sizes), m_max, n), masked_m, 64).flatten(0, 1)
        if kind == "fp4_masked_prepared":  # b: the prepared data, moved like any operand
            prepared, unprepared = deep_kernels.prepare_fp4_weights(*b), call
            b = prepared.data
            call = lambda a, data, d: unprepared(a, dataclasses.replace(prepared, data=data), d)
    _check_address_sets(call, a, b, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_k_grouped_gemm_over_more_address_sets_than_the_cache_holds(bf16):
    ks, m, n = [256, 0, 384], 256, 512
    if bf16:  # the tn layout's operands as nt transposes (M- and N-major)
        dy, x, ks_tensor = make_k_grouped_bf16_inputs(ks, m, n)
        a, b, gemm = dy.T, x.T, deep_kernels.k_grouped_bf16_gemm_nt_contiguous
        expected = reference_k_grouped.k_grouped_bf16_gemm_tn_contiguous(
            dy, x, torch.empty((len(ks), m, n), device="cuda", dtype=torch.float64), ks)
    else:
        a, b, ks_tensor = make_k_grouped_inputs(ks, m, n)
        gemm = deep_kernels.k_grouped_fp8_gemm_nt_contiguous
        expected = reference_k_grouped.k_grouped_fp8_gemm_nt_contiguous(
            a, b, torch.empty((len(ks), m, n), device="cuda", dtype=torch.float64), ks)
    call = lambda a, b, d: gemm(a, b, d.view(len(ks), m, n), ks, ks_tensor).flatten(0, 1)
    _check_address_sets(call, a, b, expected.flatten(0, 1), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("nvfp4", [False, True])
def test_fp4_decode_gemm_over_more_address_sets_than_the_cache_holds(nvfp4):
    m, n, k = 16, 2048, 1024
    a, b = (make_nvfp4_gemm_inputs if nvfp4 else make_fp4_gemm_inputs)(m, n, k)
    expected = reference_fp4.fp8_fp4_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    _check_address_sets(deep_kernels.fp8_fp4_gemm_nt, a, b, expected)


@pytest.mark.gpu
def test_fp4_expanding_gemm_over_more_address_sets_than_the_cache_holds():
    from deep_kernels.heuristics import fp8_fp4_gemm as expanding
    m, n, k = 256, 2048, 1024
    a, b = make_fp4_gemm_inputs(m, n, k)
    expected = reference_fp4.fp8_fp4_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    config = expanding.get_config(m, n, k, 132, 2, False)
    _check_address_sets(lambda *args: fp4_gemm.fp8_fp4_gemm_nt_with_config(config, *args), a, b, expected)


@pytest.mark.gpu
def test_fp8_gemm_cached_call_in_a_cuda_graph():
    m, n, k = 64, 4096, 7168
    a, b = make_gemm_inputs(m, n, k)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    deep_kernels.fp8_gemm_nt(a, b, d)  # cached, encoded
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.fp8_gemm_nt(a, b, d)
    poison_(d)
    graph.replay()
    assert_gemm_close(d, reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64)))


@pytest.mark.gpu
@pytest.mark.parametrize("max_tokens", [None, 128])
def test_gate_with_layout_out_matches_reference_eager_and_in_a_graph(max_tokens):
    gate = dict(k=8, scoring="sigmoid", num_groups=8, topk_groups=4, routed_scaling_factor=2.5, max_tokens=max_tokens)
    bias = torch.randn(256, device="cuda") * 0.01
    logits = torch.randn(128, 256, device="cuda")
    out = deep_kernels.topk_gate_with_layout(logits, **gate, bias=bias)
    out = tuple(t.clone() for t in out[:2]) + (dataclasses.replace(out[2], **{
        name: t.clone() for name, t in _layout_items(out[2])}),)  # separate allocations

    def check():
        expected = reference_moe.topk_gate_with_layout(logits, **gate, bias=bias)
        for actual, wanted, name in zip(_output_tensors(out), _output_tensors(expected), _OUTPUT_NAMES):
            assert (actual is None) == (wanted is None), name
            if actual is not None:
                assert_bitwise_equal(actual, wanted, name)

    for seed in range(2):
        torch.manual_seed(seed)
        logits.copy_(torch.randn(128, 256, device="cuda"))
        _poison_outputs(out)
        result = deep_kernels.topk_gate_with_layout(logits, **gate, bias=bias, out=out)
        assert all(r is o for r, o in zip(result, out))
        check()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.topk_gate_with_layout(logits, **gate, bias=bias, out=out)
    for seed in range(2, 4):
        torch.manual_seed(seed)
        logits.copy_(torch.randn(128, 256, device="cuda"))
        _poison_outputs(out)
        graph.replay()
        check()


_OUTPUT_NAMES = ("weights", "indices") + tuple(layout.MoeLayout.__dataclass_fields__)


def _poison_outputs(out) -> None:
    """NaN weights, and int32 outputs of a value no layout holds (-1, the kernel's fill, would hide a missed one)."""
    for t in _output_tensors(out):
        if t is not None and t.is_floating_point():
            poison_(t)
        elif t is not None:
            t.fill_(123456789)


def _layout_items(routed) -> list:
    return [(name, getattr(routed, name)) for name in layout.MoeLayout.__dataclass_fields__
            if getattr(routed, name) is not None]


@pytest.mark.gpu
@pytest.mark.parametrize("max_tokens", [None, 128])
def test_gate_with_layout_cached_plan_matches_reference(max_tokens):
    gate = dict(k=8, scoring="sigmoid", num_groups=8, topk_groups=4, routed_scaling_factor=2.5)
    bias = torch.randn(256, device="cuda") * 0.01
    for seed in range(3):  # the first call plans, the others reuse it
        torch.manual_seed(seed)
        logits = torch.randn(128, 256, device="cuda")
        weights, indices, layout = deep_kernels.topk_gate_with_layout(logits, **gate, bias=bias, max_tokens=max_tokens)
        # On the GPU: the reference matches the kernel bit for bit there (the same expf).
        expected = reference_moe.topk_gate_with_layout(logits, **gate, bias=bias, max_tokens=max_tokens)
        assert_bitwise_equal(weights, expected[0], "weights")
        assert_bitwise_equal(indices, expected[1], "indices")
        for name in ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row", "masked_slots", "masked_m"):
            actual, wanted = getattr(layout, name), getattr(expected[2], name)
            assert (actual is None) == (wanted is None), name
            if actual is not None:
                assert_bitwise_equal(actual, wanted, name)
