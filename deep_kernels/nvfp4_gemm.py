"""The FP8-activation x NVFP4-weight dense GEMM behind fp8_fp4_gemm_nt((a, sfa), (b, sfb, global_scale), d, c).

Layouts:
    a     [M, K] float8_e4m3fn with 1x128 scales sfa, as for fp8_gemm_nt.
    b     e2m1 codes [N, K / 2] torch.float4_e2m1fn_x2 or uint8 (element 2i in the low nibble of byte i, rows
          contiguous); sfb the E4M3 scales, one per row and 16 columns, [N, K / 16] torch.float8_e4m3fn, contiguous;
          global_scale a float32 CUDA tensor of one element. This is what per_token_cast_to_nvfp4(w, global_scale)
          returns (its "row_major" scales) with the global scale it was given: the weight is
          e2m1(code) * float(sfb) * global_scale.
    d     [M, N] bf16, or FP32 when accumulating c (c may be d).
Constraints: K a positive multiple of 128, N of 16.

Numerics (exact expansion): each weight's e2m1 value times its E4M3 group scale (at most 6 significant bits, within
[2^-10, 2688]) is formed exactly in f16 on chip, the e4m3 activations are converted to f16 exactly, the tensor cores
(f16 wgmma, FP32 accumulation) sum each 128-deep block, and the block's FP32 sum is promoted with
sfa[row, block] * global_scale, as the FP8 recipe promotes every 128 K. A NaN scale gives NaN columns.
Deterministic (fixed reduction order, split-K included).
Kernel: csrc/kernels/sm90_fp8_nvfp4_gemm_swap_ab.cuh, A and B swapped (the weights as wgmma's register operand, up
to 128 tokens as its N). Above 128 rows the same kernel runs once per 128 rows (the weights are read again for each
such slice: correct and exact, but slower than an FP8 GEMM at prefill sizes).
"""

import torch

from deep_kernels.call_cache import checked_call
from deep_kernels.device import get_num_sms
from deep_kernels.gemm import SCALE_BLOCK, _split_workspace, check_n, check_output, scale_a
from deep_kernels.heuristics import fp8_nvfp4_swap_ab as heuristics
from deep_kernels.jit.definition import PTR, TENSOR_MAP, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, get_kernel, remember_launch, tensor_map
from deep_kernels.validation import check_cuda_device, check_dtype, check_no_overlap, check_rank, check_row_major_rows

NVFP4_GROUP_SIZE = 16
CODE_DTYPES = (torch.float4_e2m1fn_x2, torch.uint8)

FP8_NVFP4_SWAP_AB_GEMM = KernelDef(
    heuristics.KERNEL_HEADER, "sm90_fp8_nvfp4_gemm_swap_ab_impl",
    template=("BLOCK_T", "kNumMathWarpgroups", "kNumStages", "OutputType", "kWithAccumulation", "kNumChains",
              "kNumCTAsPerSM"),
    params=(Param("tmap_a", TENSOR_MAP), Param("tmap_codes", TENSOR_MAP), Param("tmap_sfa", TENSOR_MAP),
            Param("tmap_d", TENSOR_MAP), Param("sfb", PTR), Param("global_scale", PTR), Param("shape_n", U32),
            Param("shape_k", U32), Param("num_splits", U32), Param("split_workspace", PTR),
            Param("split_tickets", PTR)),
    threads=lambda t: 128 + 128 * int(t["kNumMathWarpgroups"]))


def kernel_spec(config, out_dtype: torch.dtype, accumulate: bool):
    return FP8_NVFP4_SWAP_AB_GEMM.spec(*heuristics.template_args(config, out_dtype, accumulate))


def _check_weights(b, sfb, global_scale, k: int) -> int:
    """The NVFP4 weights for reduction depth k; returns N."""
    check_dtype(b, "b", CODE_DTYPES)
    check_rank(b, "b", 2)
    n = b.shape[0]
    if b.shape[1] * 2 != k:
        raise ValueError(f"b must hold K / 2 = {k // 2} bytes of e2m1 codes per row (two codes a byte, a is "
                         f"[..., K = {k}]), got shape {tuple(b.shape)}")
    check_n(n)
    if not b.is_contiguous():
        raise ValueError(f"b must be contiguous, got strides {tuple(b.stride())}")
    check_dtype(sfb, "sfb", (torch.float8_e4m3fn,))
    shape = (n, k // NVFP4_GROUP_SIZE)
    if tuple(sfb.shape) != shape or not sfb.is_contiguous():
        raise ValueError(f"sfb must be contiguous E4M3 scales of shape {shape} (one per row and 16 columns, "
                         f"per_token_cast_to_nvfp4's row_major layout), got shape {tuple(sfb.shape)} strides "
                         f"{tuple(sfb.stride())}")
    check_dtype(global_scale, "global_scale", (torch.float32,))
    if global_scale.numel() != 1:
        raise ValueError(f"global_scale must hold one element (the NVFP4 global scale), got shape "
                         f"{tuple(global_scale.shape)}")
    return n


def _check_call(a, sfa, b, sfb, global_scale, d, c) -> tuple:
    """Full validation; returns (m, n, k, whether sfa is kernel-ready)."""
    check_dtype(a, "a", (torch.float8_e4m3fn,))
    check_rank(a, "a", 2)
    m, k = a.shape
    if k % SCALE_BLOCK != 0 or k == 0:
        raise ValueError(f"K must be a positive multiple of 128 for NVFP4 weights (one promotion per 128-deep "
                         f"block of eight 16-wide scale groups), got {k}")
    n = _check_weights(b, sfb, global_scale, k)
    check_row_major_rows(a, "a")
    check_output(d, c, m, n)
    kernel_sfa = scale_a(sfa, m, k // SCALE_BLOCK)
    tensors = ((global_scale, "global_scale"), (a, "a"), (sfa, "sfa"), (b, "b"), (sfb, "sfb"), (d, "d"))
    for tensor, name in tensors + ((c, "c"),) * (c is not None):
        check_cuda_device(tensor, name, like=a)
    return m, n, k, kernel_sfa is sfa


def _check_addresses(a, sfa, b, sfb, d) -> None:
    if (a.data_ptr() | b.data_ptr() | d.data_ptr() | sfa.data_ptr()) % 16 or sfb.data_ptr() % 4:
        raise ValueError("a, b, d and sfa must start at 16-byte aligned addresses (TMA), sfb at a 4-byte one")


_configs = {}


def _config(m: int, n: int, k: int, out_dtype: torch.dtype):
    key = (m, n, k, out_dtype, get_num_sms())
    if key not in _configs:
        _configs[key] = heuristics.get_config(m, n, k, key[-1], out_dtype.itemsize)
    return _configs[key]


def _prepared_launch(launches: dict, config, a, sfa, b, sfb, global_scale, d, m: int, n: int, k: int,
                     accumulate: bool):
    """The launch over m <= config.block_t tokens (sfa kernel-ready), split-K through the FP8 GEMM's workspace,
    prepared (Kernel.prepare) once per address set, config and workspace and kept in launches, the validated call
    signature's."""
    if config.block_t < m:
        raise ValueError(f"a swapped config of {config.block_t} tokens cannot take m = {m}")
    if not 1 <= config.num_splits <= k // SCALE_BLOCK:
        raise ValueError(f"num_splits must be in 1..K / 128 = {k // SCALE_BLOCK}, got {config.num_splits}")
    device_index = a.get_device()
    num_tiles = -(-n // config.block_w)
    workspace = None
    if config.num_splits > 1:
        workspace = _split_workspace(device_index, num_tiles * config.block_w * config.block_t * config.num_splits,
                                     num_tiles * config.num_math_warpgroups)
    key = (a.data_ptr(), sfa.data_ptr(), b.data_ptr(), sfb.data_ptr(), global_scale.data_ptr(), d.data_ptr(), config,
           workspace)
    launch = launches.get(key)
    if launch is None:
        check_no_overlap([("d", d)], [("a", a), ("sfa", sfa), ("b", b), ("sfb", sfb), ("global_scale", global_scale)],
                         "d and the operands")
        kernel = get_kernel(kernel_spec(config, d.dtype, accumulate), smem_bytes=heuristics.smem_of(config))
        encoded = kernel.encode(
            tmap_a=tensor_map(a, (config.block_t, SCALE_BLOCK), 128),
            tmap_codes=tensor_map(b.view(torch.uint8), (config.block_w, SCALE_BLOCK // 2), 64),
            tmap_sfa=tensor_map(sfa, (config.block_t, 1), transpose=True),
            tmap_d=tensor_map(d, (config.block_t, 128 // d.element_size()), 128),
            sfb=sfb.data_ptr(), global_scale=global_scale.data_ptr(), shape_n=n, shape_k=k,
            num_splits=config.num_splits, split_workspace=workspace.partials.data_ptr() if workspace else 0,
            split_tickets=workspace.tickets.data_ptr() if workspace else 0)
        launch = remember_launch(launches, key, kernel.prepare((num_tiles * config.num_splits, 1, 1), device_index,
                                                               encoded))
    return launch


def fp8_nvfp4_gemm_nt(a, sfa, b, sfb, global_scale, d: torch.Tensor, c: torch.Tensor = None,
                      config=None) -> torch.Tensor:
    """fp8_fp4_gemm_nt's NVFP4 form (the module docstring). config: a heuristics.fp8_nvfp4_swap_ab config instead
    of the chosen one (tests, tuning); it runs every 128-row slice."""
    (m, n, k, sfa_ready), launches = checked_call(_check_call, (a, sfa, b, sfb, global_scale, d, c))
    if not sfa_ready:
        sfa = scale_a(sfa, m, k // SCALE_BLOCK)
    _check_addresses(a, sfa, b, sfb, d)
    if m == 0:
        return d
    accumulate = c is not None
    # NOTE: prepared (their address checks passed) before c is copied into d.
    slices = []
    for first in range(0, m, heuristics.MAX_TOKENS):
        rows = min(heuristics.MAX_TOKENS, m - first)
        slices.append(_prepared_launch(launches, config or _config(rows, n, k, d.dtype), a[first:first + rows],
                                       sfa[first:first + rows], b, sfb, global_scale, d[first:first + rows], rows, n,
                                       k, accumulate))
    if c is not None and c.data_ptr() != d.data_ptr():
        d.copy_(c)
    stream = current_raw_stream(a.get_device())
    for launch in slices:
        launch.launch(stream)
    return d


# (M, N, K) the heuristics' picks are precompiled for: DeepSeek-V3's dense shapes at decode sizes.
REPRESENTATIVE_MNK = tuple((m, n, k) for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
                                                  (4096, 7168), (7168, 2048)) for m in (1, 16, 64, 128))


@precompiled
def precompile_specs() -> list:
    """The heuristics' picks over REPRESENTATIVE_MNK (bf16 D)."""
    specs = {}
    for m, n, k in REPRESENTATIVE_MNK:
        config = heuristics.get_config(m, n, k, 132)
        args = tuple(heuristics.template_args(config, torch.bfloat16, False))
        specs.setdefault(args, FP8_NVFP4_SWAP_AB_GEMM.spec(*args))
    return list(specs.values())
