"""FP8 GEMM with DeepSeek-V3 fine-grained scaling: D = A @ B^T (+ C).

Two recipes (DeepGEMM's `recipe` argument, the scale block sizes (M, N, K)): (1, 128, 128), the default, for the
forward and input-gradient GEMMs (1 x 128 activation scales, 128 x 128 weight scales), and (1, 1, 128), the weight
gradient's (both operands activation-like, with 1 x 128 scales per row of A and of B).

Layouts (DeepGEMM's, so switching is one line):
    a   [M, K] float8_e4m3fn, K-major (rows 16-byte aligned); sfa FP32 [M, ceil(K / 128)], one scale per row
        and 128 columns, MN-major and TMA-aligned (strides (1, M rounded up to 4)) as
        per_token_cast_to_fp8 writes it. Row-major FP32 and packed UE8M0 (int32) scales are accepted
        and converted first (an extra pass: produce MN-major FP32 to avoid it).
    b   [N, K] float8_e4m3fn, K-major; sfb FP32 [ceil(N / 128), ceil(K / 128)] row-major, one scale per
        128 x 128 block (packed UE8M0 int32 [ceil(N / 128), ceil(K / 512)] also accepted). With recipe (1, 1, 128):
        sfb [N, ceil(K / 128)] in the forms sfa takes (MN-major TMA-aligned FP32 read as is; row-major FP32 and
        packed UE8M0 converted first), as per_token_cast_to_fp8 (or per_channel_cast_transpose_to_fp8 of the
        untransposed tensor) writes it.
    d   [M, N] bf16, or fp32 when accumulating c (c fp32 [M, N]; c may be d).
Constraints: K and N multiples of 16 (with K not a multiple of 128, the last scale group covers the
remaining K % 128 columns, and the kernel zero-fills the rest of its last K block); any M >= 0.
"""

from dataclasses import dataclass, field

import torch

from deep_kernels import envs, tuning
from deep_kernels.device import get_num_sms, has_gpu, target_arch
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.jit.definition import PTR, TENSOR_MAP, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, get_kernel, remember_launch, tensor_map
from deep_kernels.quant import unpack_ue8m0
from deep_kernels.validation import (
    ceil_div, check_cuda_device, check_deepgemm_options, check_dtype, check_no_overlap, check_rank,
    check_row_major_rows, deepgemm_recipe, int_tuple, is_traced, tma_aligned_size,
)
from deep_kernels.workspace import persistent_empty

SCALE_BLOCK = 128

# heuristics.template_args gives the template arguments in order; d is the grouped kinds' row stores, split_workspace,
# split_tickets and num_unsplit_tiles are split-K's, tmap_sfb the per-channel B scales' (any valid map otherwise).
FP8_GEMM = KernelDef(
    heuristics.KERNEL_HEADER, "sm90_fp8_gemm_impl",
    template=("SHAPE_N", "SHAPE_K", "BLOCK_M", "BLOCK_N", "BLOCK_K", "kNumStages", "kNumTMAThreads", "kNumMathThreads",
              "kNumTMAMulticast", "kIsMulticastOnA", "kGemmType", "OutputType", "kWithAccumulation", "kNumSplits",
              "kPipelined", "kOverlapEpilogue", "kOperands", "kIsMNMajorA", "kIsMNMajorB",
              "kMathSchedule", "kSplitsInCluster", "kEvictFirstB", "kThreadMajorSfb"),
    params=(Param("tmap_a", TENSOR_MAP), Param("tmap_b", TENSOR_MAP), Param("tmap_sfa", TENSOR_MAP),
            Param("tmap_d", TENSOR_MAP), Param("sfb", PTR), Param("shape_m", U32), Param("grouped_layout", PTR),
            Param("num_groups", U32), Param("d", PTR), Param("split_workspace", PTR), Param("split_tickets", PTR),
            Param("num_unsplit_tiles", U32), Param("tmap_sfb", TENSOR_MAP)),
    threads=lambda t: int(t["kNumTMAThreads"]) + int(t["kNumMathThreads"]),
    cluster=lambda t: int(t["kNumSplits"]) if t["kSplitsInCluster"] == "true" else int(t["kNumTMAMulticast"]))


def get_mn_major_tma_aligned_tensor(scales: torch.Tensor) -> torch.Tensor:
    """FP32 scales [M, G] or [B, M, G] (any strides) in the layout the GEMM reads: M-major with M rounded
    up to 4, strides (1, M_4) or (M_4 * G, 1, M_4) for batches (the grouped GEMMs' per-group scales).

    Returns the input itself when it is already in that layout.
    """
    check_dtype(scales, "scales", (torch.float32,))
    if scales.dim() not in (2, 3):
        raise ValueError(f"scales must be 2-D [M, G] or 3-D [B, M, G], got shape {tuple(scales.shape)}")
    m, groups = scales.shape[-2:]
    aligned_m = tma_aligned_size(m, 4)
    strides = (aligned_m * groups, 1, aligned_m)[3 - scales.dim():]
    # NOTE: the outer strides are checked even for one group or batch: the tensor map encodes them.
    if (m <= 1 or scales.stride(-2) == 1) and scales.stride(-1) == aligned_m and scales.stride()[:-2] == strides[:-2]:
        return scales
    out = torch.empty_strided(scales.shape, strides, dtype=torch.float32, device=scales.device)
    return out.copy_(scales)


# DeepGEMM's 1.x name of get_mn_major_tma_aligned_tensor.
get_col_major_tma_aligned_tensor = get_mn_major_tma_aligned_tensor


def _fp32_scales(scales, name: str, rows: int, k_blocks: int, num_groups, shape_text: str) -> torch.Tensor:
    """Scales [rows, ceil(K / 128)] (or [G, rows, ceil(K / 128)] with num_groups) checked, as FP32: packed UE8M0 unpacked
    (contiguous), FP32 as given."""
    lead = () if num_groups is None else (num_groups,)
    check_rank(scales, name, len(lead) + 2)
    if scales.dtype == torch.int32:
        packed = lead + (rows, ceil_div(k_blocks, 4))
        if tuple(scales.shape) != packed:
            raise ValueError(f"packed UE8M0 {name} must have shape {packed}, got {tuple(scales.shape)}")
        all_rows = (num_groups or 1) * rows
        return unpack_ue8m0(scales.reshape(all_rows, packed[-1]), all_rows, k_blocks).view(*lead, rows, k_blocks)
    check_dtype(scales, name, (torch.float32, torch.int32))
    if tuple(scales.shape) != lead + (rows, k_blocks):
        raise ValueError(f"{name} must have shape {shape_text} = {lead + (rows, k_blocks)}, "
                         f"got {tuple(scales.shape)}")
    return scales


def scale_a(sfa, m: int, k_blocks: int, num_groups: int = None) -> torch.Tensor:
    """sfa [M, ceil(K / 128)] (or [G, M, ceil(K / 128)] with num_groups) as the kernel reads it: checked, packed UE8M0
    unpacked, converted to MN-major TMA-aligned FP32 (the input itself when it already is)."""
    shape_text = "[M, ceil(K / 128)]" if num_groups is None else "[G, M_max, ceil(K / 128)]"
    return get_mn_major_tma_aligned_tensor(_fp32_scales(sfa, "sfa", m, k_blocks, num_groups, shape_text))


def scale_b(sfb, n_blocks: int, k_blocks: int, num_groups: int = None) -> torch.Tensor:
    """sfb [ceil(N / 128), ceil(K / 128)] (or [G, ...] with num_groups) as the kernel reads it: checked, packed
    UE8M0 unpacked, contiguous FP32."""
    shape_text = "[ceil(N / 128), ceil(K / 128)]" if num_groups is None else "[G, ceil(N / 128), ceil(K / 128)]"
    return _fp32_scales(sfb, "sfb", n_blocks, k_blocks, num_groups, shape_text).contiguous()


def check_n(n: int) -> None:
    """The output width the GEMM kernels compile for."""
    if n % 16 != 0 or n == 0:
        raise ValueError(f"N (the rows of b, the columns of d) must be a positive multiple of 16, got {n}")


def check_k_n(k: int, n: int) -> None:
    """The reduction depth and output width the kernel compiles for."""
    if k % 16 != 0 or k == 0:
        raise ValueError(f"K (the columns of a and b) must be a positive multiple of 16, got {k}")
    check_n(n)


# DeepGEMM's recipes (scale block sizes along M, N, K) -> the kernel's operands (heuristics.GEMM_OPERANDS).
RECIPES = {(1, 128, 128): "fp8_block_scaled", (1, 1, 128): "fp8_channel_scaled"}
BLOCK_SCALED = "fp8_block_scaled"
CHANNEL_SCALED = "fp8_channel_scaled"


def operands_of_recipe(recipe) -> str:
    """The kernel's operands of a DeepGEMM recipe: None or (1, 128, 128) block-scaled B, (1, 1, 128) per-channel."""
    if recipe is None:
        return BLOCK_SCALED
    key = int_tuple(recipe)
    if key not in RECIPES:
        raise ValueError(f"recipe must be None, (1, 128, 128) or (1, 1, 128), got {recipe!r}")
    return RECIPES[key]


def kernel_spec(config, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, gemm_type: str = "normal",
                operands: str = BLOCK_SCALED):
    return FP8_GEMM.spec(*heuristics.template_args(config, n, k, out_dtype, accumulate, gemm_type, operands))


def get_gemm_kernel(config, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, gemm_type: str = "normal",
                    operands: str = BLOCK_SCALED):
    return get_kernel(kernel_spec(config, n, k, out_dtype, accumulate, gemm_type, operands),
                      smem_bytes=config.smem_bytes)


# DK_FP8_GEMM_CONFIG's fields and the make_config argument each sets.
OVERRIDE_FIELDS = {"block_m": "block_m", "block_n": "block_n", "stages": "num_stages", "multicast": "num_tma_multicast",
                   "multicast_on_a": "multicast_on_a", "splits": "num_splits", "pipelined": "pipelined",
                   "overlap_epilogue": "overlap_epilogue", "ping_pong": "ping_pong", "own_tiles": "own_tiles",
                   "splits_in_cluster": "splits_in_cluster", "evict_first_b": "evict_first_b",
                   "thread_major_sfb": "thread_major_sfb"}
# The op's name in the measured-tuning store (deep_kernels/tuning.py, `python -m deep_kernels tune`).
TUNING_OP = "fp8_gemm_nt"


def parse_config_override(text: str) -> dict:
    """"block_m=128,block_n=112,stages=5,multicast=2,multicast_on_a=1" (or ...,splits=4, ...,pipelined=0,
    ...,overlap_epilogue=1, ...,ping_pong=1, ...,own_tiles=1) as {field: int}; an unknown field or a value that is not an integer raises."""
    fields = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in OVERRIDE_FIELDS:
            raise ValueError(f"DK_FP8_GEMM_CONFIG: {item.strip()!r} is not field=value with a field of "
                             f"{sorted(OVERRIDE_FIELDS)} (in {text!r})")
        try:
            fields[key] = int(value)
        except ValueError:
            raise ValueError(f"DK_FP8_GEMM_CONFIG: {key} must be an integer, got {value!r}") from None
    return fields


def _config_override():
    """DK_FP8_GEMM_CONFIG's fields (read once per process), or None."""
    text = envs.get_once("DK_FP8_GEMM_CONFIG")
    return parse_config_override(text) if text else None


def apply_config_override(config, override: dict, out_bytes: int, k: int, grouped: bool = False,
                          operands: str = BLOCK_SCALED):
    """`config` with the override's fields replaced. The config's epilogue overlap carries over only to a tiling
    that has one (128 rows, or 256 with block scales; no split-K; M-grouped: BLOCK_N a multiple of 64), its ping-pong
    schedule only to one that takes it (128 or 256 rows, the plain K loop, block scales); ping_pong=1 alone selects
    the plain K loop. Its own-tile ping-pong carries over to a tiling that takes it (64 or 128 rows per math warpgroup,
    block scales, no split-K); with own tiles the epilogue overlap and the shared-tile ping-pong are off unless given."""
    fields = heuristics.config_fields(config)
    fields.pop("num_stages")  # as many as fit, unless given
    fields.pop("pipelined")  # wherever the tile allows, unless given
    fields.update({OVERRIDE_FIELDS[key]: value for key, value in override.items()})
    if "ping_pong" not in override:
        fields["ping_pong"] = config.ping_pong and operands == BLOCK_SCALED and heuristics.can_ping_pong(
            fields["block_m"], bool(fields.get("pipelined")))
    if "overlap_epilogue" not in override:
        fields["overlap_epilogue"] = config.overlap_epilogue and heuristics.has_epilogue_overlap(
            fields["block_m"], fields["block_n"], fields["num_splits"], grouped, operands)
    if "own_tiles" not in override:
        fields["own_tiles"] = config.own_tiles and heuristics.can_own_tiles(
            fields["block_m"], fields["block_n"], fields["num_splits"], grouped, operands)
    if fields["own_tiles"]:
        for flag in ("overlap_epilogue", "ping_pong"):
            if flag not in override:
                fields[flag] = False
    if "splits_in_cluster" not in override:
        # NOTE: only onto the same tiles and splits (other tiles or splits may not fit the SMs as clusters).
        fields["splits_in_cluster"] = config.splits_in_cluster and not {"block_m", "block_n", "splits"} & set(override)
    if "thread_major_sfb" not in override:
        # NOTE: only onto the same tile and K loop (the picks take it where it was measured faster).
        fields["thread_major_sfb"] = config.thread_major_sfb and not {"block_m", "block_n", "pipelined"} & set(override)
    if "evict_first_b" not in override:
        fields["evict_first_b"] = config.evict_first_b and not grouped and (
            fields["num_tma_multicast"] == 1 or not fields["multicast_on_a"])
    for flag in ("multicast_on_a", "pipelined", "overlap_epilogue", "ping_pong", "own_tiles", "splits_in_cluster",
                 "evict_first_b", "thread_major_sfb"):
        if flag in fields:
            fields[flag] = bool(fields[flag])
    if grouped and (fields["num_splits"] != 1 or
                    not heuristics.is_legal_tile(fields["block_m"], fields["block_n"], True, operands) or
                    not heuristics.is_legal_multicast(fields["block_m"], fields["num_tma_multicast"],
                                                      fields["multicast_on_a"], grouped=True)):
        raise ValueError("DK_FP8_GEMM_CONFIG: the grouped GEMMs take no split-K, and 256-row tiles only with block "
                         "scales, at most 128 columns and multicast on A if any")
    config = heuristics.make_config(out_dtype_bytes=out_bytes, operands=operands, **fields)
    if config.smem_bytes > heuristics.SMEM_CAPACITY_BYTES:
        raise ValueError(f"DK_FP8_GEMM_CONFIG: {config.num_stages} stages of {config.block_m}x{config.block_n} tiles "
                         f"need {config.smem_bytes} bytes of shared memory, more than an SM's "
                         f"{heuristics.SMEM_CAPACITY_BYTES}")
    if grouped and config.num_stages > heuristics.max_stages(config.block_m, config.block_n, out_bytes,
                                                             operands=operands):
        raise ValueError(f"DK_FP8_GEMM_CONFIG: the grouped GEMMs' {config.block_m}x{config.block_n} tiles take at most "
                         f"{heuristics.max_stages(config.block_m, config.block_n, out_bytes, operands=operands)} stages")
    if not 1 <= config.num_splits <= ceil_div(k, SCALE_BLOCK):
        raise ValueError(f"DK_FP8_GEMM_CONFIG: splits must be in 1..ceil(K / 128) = {ceil_div(k, SCALE_BLOCK)}, "
                         f"got {config.num_splits}")
    return config


def _tuned_config(m: int, n: int, k: int, num_sms: int, out_bytes: int, accumulate: bool):
    """The config `python -m deep_kernels tune` measured fastest for this problem on this GPU, or None."""
    if not has_gpu():
        return None
    path = tuning.tuning_file(torch.cuda.get_device_name())
    if not path.is_file():
        return None
    fields = tuning.lookup(path, TUNING_OP, tuning.source_identity(heuristics.KERNEL_HEADER, target_arch()),
                           tuning.problem_key(m, n, k, out_bytes, accumulate, num_sms))
    return None if fields is None else heuristics.make_config(out_dtype_bytes=out_bytes, **fields)


def _choose_config(m: int, n: int, k: int, num_sms: int, out_bytes: int, accumulate: bool,
                   operands: str = BLOCK_SCALED):
    """DK_FP8_GEMM_CONFIG over the tuned config of the problem (if any; measured for block-scaled B), else over the
    model's pick."""
    tuned = _tuned_config(m, n, k, num_sms, out_bytes, accumulate) if operands == BLOCK_SCALED else None
    config = tuned or heuristics.get_fp8_gemm_config(m, n, k, num_sms, out_dtype_bytes=out_bytes,
                                                     with_accumulation=accumulate, allow_split_k=True,
                                                     operands=operands)
    override = _config_override()
    if override:
        config = apply_config_override(config, override, out_bytes, k, operands=operands)
    return config


class _SplitWorkspace:
    """One device's split-K buffers: FP32 partial tiles and zeroed uint32 tickets (int32 tensors here)."""

    def __init__(self, device_index: int, num_floats: int, num_tickets: int):
        self.partials = persistent_empty(num_floats, torch.float32, device_index)
        self.tickets = persistent_empty(num_tickets, torch.int32, device_index).zero_()


# Device index -> its _SplitWorkspace; the buffers those replaced (see _split_workspace).
_split_workspaces = {}
_retired_split_workspaces = []


def _split_workspace(device_index: int, num_floats: int, num_tickets: int) -> _SplitWorkspace:
    """The device's persistent split-K workspace, grown (never shrunk) to hold the request.

    A launch leaves its tickets zero again, so stream-ordered launches (eager or replayed from CUDA
    graphs) share one buffer without clearing it. Growing allocates, so it is refused during CUDA-graph
    capture (run the call once before capturing). Replaced buffers are kept alive, since graphs captured
    earlier still point at them; growth at least doubles, so they add up to less than the live buffer.
    """
    workspace = _split_workspaces.get(device_index)
    if workspace is not None and workspace.partials.numel() >= num_floats and workspace.tickets.numel() >= num_tickets:
        return workspace
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "fp8_gemm_nt: this split-K shape needs a larger workspace, which cannot be allocated during CUDA-graph "
            "capture; run the same call (or one of the same shape) once before capturing")
    if workspace is not None:
        _retired_split_workspaces.append(workspace)
        num_floats = max(num_floats, 2 * workspace.partials.numel())
        num_tickets = max(num_tickets, 2 * workspace.tickets.numel())
    workspace = _split_workspaces[device_index] = _SplitWorkspace(device_index, num_floats, num_tickets)
    return workspace


_plans = {}


def _plan(m: int, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, num_sms: int = None,
          operands: str = BLOCK_SCALED):
    """(kernel, config, grid, split-K layout: (num_unsplit_tiles, workspace floats, tickets)) of a problem on
    num_sms SMs (default: get_num_sms()); one dict lookup once seen."""
    num_sms = num_sms or get_num_sms()
    key = (m, n, k, out_dtype, accumulate, num_sms, operands)
    plan = _plans.get(key)
    if plan is None:
        config = _choose_config(m, n, k, num_sms, out_dtype.itemsize, accumulate, operands)
        plan = _plans[key] = _plan_of(config, m, n, k, out_dtype, accumulate, num_sms, operands)
    return plan


def _plan_of(config, m: int, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, num_sms: int,
             operands: str = BLOCK_SCALED) -> tuple:
    if config.splits_in_cluster and not heuristics.has_splits_in_cluster(config, m, n, num_sms):
        raise ValueError(f"splits in a cluster need tiles x splits <= SMs: {heuristics.num_tiles(config, m, n)} tiles x "
                         f"{config.num_splits} splits > {num_sms} SMs")
    kernel = get_gemm_kernel(config, n, k, out_dtype, accumulate, operands=operands)
    grid = (heuristics.grid_size(config, m, n, num_sms), 1, 1)
    split_layout = (heuristics.num_unsplit_tiles(config, m, n, num_sms),
                    *heuristics.split_workspace_sizes(config, m, n, num_sms))
    return kernel, config, grid, split_layout


def scale_b_channels(sfb, n: int, k_blocks: int) -> torch.Tensor:
    """Per-channel sfb [N, ceil(K / 128)] (recipe (1, 1, 128)) as the kernel reads it: as sfa (scale_a)."""
    return get_mn_major_tma_aligned_tensor(_fp32_scales(sfb, "sfb", n, k_blocks, None, "[N, ceil(K / 128)]"))


def kernel_scales(sfa, sfb, m: int, n: int, k: int, operands: str) -> tuple:
    """(sfa, sfb) in the kernel's layouts (each the input itself when it already is)."""
    k_blocks = ceil_div(k, SCALE_BLOCK)
    if operands == CHANNEL_SCALED:
        return scale_a(sfa, m, k_blocks), scale_b_channels(sfb, n, k_blocks)
    return scale_a(sfa, m, k_blocks), scale_b(sfb, ceil_div(n, SCALE_BLOCK), k_blocks)


def check_output(d, c, m: int, n: int) -> None:
    """d: a contiguous [m, n] bf16 tensor, or FP32 with c (an FP32 [m, n] tensor accumulated into it, may be d)."""
    check_dtype(d, "d", (torch.float32,) if c is not None else (torch.bfloat16, torch.float32))
    if c is not None:
        check_dtype(c, "c", (torch.float32,))
        if tuple(c.shape) != (m, n):
            raise ValueError(f"c must have shape {(m, n)}, got {tuple(c.shape)}")
    elif d.dtype == torch.float32:
        raise TypeError("d must be torch.bfloat16 without c (fp32 d is for accumulation: pass c, which may be d)")
    if tuple(d.shape) != (m, n) or not d.is_contiguous():
        raise ValueError(f"d must be a contiguous [M, N] = {(m, n)} tensor, got shape {tuple(d.shape)} "
                         f"strides {tuple(d.stride())}")


def _check_call(a, sfa, b, sfb, d, c, operands: str = BLOCK_SCALED) -> tuple:
    """Full validation of a call; returns (m, n, k, whether sfa and sfb are already in the kernel's
    layouts). Raises a clear error for anything the kernel cannot take."""
    check_dtype(a, "a", (torch.float8_e4m3fn,))
    check_dtype(b, "b", (torch.float8_e4m3fn,))
    check_rank(a, "a", 2)
    check_rank(b, "b", 2)
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(f"a is [M, K] = {tuple(a.shape)} but b is {tuple(b.shape)}: K differs")
    check_k_n(k, n)
    check_row_major_rows(a, "a")
    check_row_major_rows(b, "b")
    check_output(d, c, m, n)
    kernel_sfa, kernel_sfb = kernel_scales(sfa, sfb, m, n, k, operands)
    for tensor, name in ((a, "a"), (sfa, "sfa"), (b, "b"), (sfb, "sfb"), (d, "d")) + ((c, "c"),) * (c is not None):
        check_cuda_device(tensor, name, like=a)
    return m, n, k, kernel_sfa is sfa and kernel_sfb is sfb


def _gemm_signature(a, sfa, b, sfb, d, c, operands: str) -> tuple:
    """call_signature(a, sfa, b, sfb, d, c) and the operands, in one flat tuple: the hot path's form of it."""
    return (a.dtype, a.shape, a.stride(), a.get_device(), sfa.dtype, sfa.shape, sfa.stride(), sfa.get_device(),
            b.dtype, b.shape, b.stride(), b.get_device(), sfb.dtype, sfb.shape, sfb.stride(), sfb.get_device(),
            d.dtype, d.shape, d.stride(), d.get_device(),
            None if c is None else (c.dtype, c.shape, c.stride(), c.get_device()), operands)


@dataclass(frozen=True)
class _PreparedCall:
    """What a validated call signature fixes: the problem, the kernel and grid, and the tensor maps but for
    their addresses (tensor_map specs without their first field)."""

    m: int
    n: int
    k: int
    scales_ready: bool  # sfa and sfb already in the kernel's layouts
    operands: str = BLOCK_SCALED
    num_sms: int = None  # the SM count the grid was planned for
    device_index: int = None  # every tensor's device (the signature holds it)
    kernel: object = None  # None when M = 0: nothing to launch
    grid: tuple = None
    split_layout: tuple = (0, 0, 0)  # (num_unsplit_tiles, workspace floats, tickets)
    map_a: tuple = None
    map_b: tuple = None
    map_sfa: tuple = None
    map_d: tuple = None
    map_sfb: tuple = None  # per-channel B scales only
    # The kernel's prepared launches (Kernel.prepare) by the call's addresses (a, b, sfa, d, sfb) and split-K
    # workspace (a _SplitWorkspace, never freed, so that its identity stands for its addresses; None without split-K).
    launches: dict = field(default_factory=dict, compare=False)


def _prepare_call(a, sfa, b, sfb, d, c, config=None, operands: str = BLOCK_SCALED) -> _PreparedCall:
    """The call's _PreparedCall with the chosen config, or with `config` when given."""
    m, n, k, scales_ready = _check_call(a, sfa, b, sfb, d, c, operands)
    if m == 0:
        return _PreparedCall(m, n, k, scales_ready, operands)
    kernel_sfa, kernel_sfb = kernel_scales(sfa, sfb, m, n, k, operands)
    num_sms = get_num_sms()
    if config is None:
        kernel, config, grid, split_layout = _plan(m, n, k, d.dtype, c is not None, num_sms, operands)
    else:
        kernel, config, grid, split_layout = _plan_of(config, m, n, k, d.dtype, c is not None, num_sms, operands)
    map_sfa = tensor_map(kernel_sfa, (config.block_m, 1), transpose=True)[1:]
    return _PreparedCall(
        m, n, k, scales_ready, operands, num_sms, a.get_device(), kernel, grid, split_layout,
        map_a=tensor_map(a, (config.block_m, SCALE_BLOCK), 128)[1:],
        map_b=tensor_map(b, (config.block_n, SCALE_BLOCK), 128)[1:],
        map_sfa=map_sfa,
        map_d=tensor_map(d, (64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes)[1:],
        map_sfb=(tensor_map(kernel_sfb, (config.block_n, 1), transpose=True)[1:] if operands == CHANNEL_SCALED
                 else None),
    )


# Signatures of calls that passed validation -> their _PreparedCall.
_prepared_calls = {}


def fp8_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None, recipe_a=None,
                recipe_b=None, *, compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> torch.Tensor:
    """D = A @ B^T (+ C) with FP8 inputs, 1x128 activation and 128x128 weight scales (or 1x128 scales on both,
    recipe (1, 1, 128): the weight gradient's), FP32 accumulation.

    Args:
        a: (a [M, K] float8_e4m3fn, sfa) as per_token_cast_to_fp8 returns it.
        b: (b [N, K] float8_e4m3fn, sfb [ceil(N / 128), ceil(K / 128)] FP32); with recipe (1, 1, 128),
            sfb [N, ceil(K / 128)] one scale per row and 128 columns, in the forms sfa takes.
        d: [M, N] output, bf16; fp32 when c is given.
        c: optional fp32 [M, N] added to the product; may be d itself.
        recipe: None or (1, 128, 128) (block-scaled B), or (1, 1, 128) (per-channel B scales).
        recipe_a, recipe_b: DeepGEMM's per-operand spelling of the recipe, in place of it: (1, 128) with (128, 128)
            or with (1, 128) (validation.deepgemm_recipe).
        compiled_dims, disable_ue8m0_cast: DeepGEMM's options, accepted so that its calls run unchanged; neither
            changes anything here (validation.check_deepgemm_options).

    Returns:
        d.

    Notes:
        Deterministic: the same inputs give the same bits (fixed reduction order, split-K included).
        Split-K: where the output has fewer tiles than SMs (decode sizes), the heuristics may split K
        over several CTAs per tile, and with more tiles than SMs split the tiles of the last, partial wave
        the same way; their FP32 partial tiles meet in a persistent per-device workspace
        (grown on demand, never during CUDA-graph capture: run a shape once before capturing it) and the
        last CTA of each tile sums them in split order. Split-K launches on one device share that
        workspace, so they must not run concurrently on different streams.
        Each 128-deep K block is accumulated by the tensor cores, then scaled by sfa * sfb (sfa[row] * sfb[column]
        with recipe (1, 1, 128)) and added in FP32 registers. No host synchronisation or allocation (with MN-major FP32 sfa and FP32
        sfb), so calls can be captured in CUDA graphs. A call whose tensors have the dtypes, shapes,
        strides and devices of an earlier valid call (and the same SM count) reuses its validation, kernel,
        grid and tensor-map fields: only the addresses are read and checked again.
    """
    check_deepgemm_options(compiled_dims, disable_ue8m0_cast)
    recipe = deepgemm_recipe(recipe, recipe_a, recipe_b)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.fp8_gemm_nt(a, b, d, c, recipe)
    if not (isinstance(a, (tuple, list)) and len(a) == 2 and isinstance(b, (tuple, list)) and len(b) == 2):
        raise TypeError("a and b must be (tensor, scales) pairs")
    (a, sfa), (b, sfb) = a, b
    operands = operands_of_recipe(recipe)
    try:
        signature = _gemm_signature(a, sfa, b, sfb, d, c, operands)
    except AttributeError:  # not tensors: the full check below says which
        signature = None
    call = _prepared_calls.get(signature)
    if call is None or (call.kernel is not None and call.num_sms != get_num_sms()):
        call = _prepare_call(a, sfa, b, sfb, d, c, operands=operands)
        if signature is not None:
            _prepared_calls[signature] = call
    return _launch(call, a, sfa, b, sfb, d, c)


# The casts that write each operand K-major, named by the transposed forms' errors.
K_MAJOR_CASTS = {"a": "per_token_cast_to_fp8 of [M, K] data, per_channel_cast_transpose_to_fp8 of [K, M] data",
                 "b": "per_block_cast_to_fp8 of [N, K] weights (recipe (1, 1, 128): per_token_cast_to_fp8 of [N, K] "
                      "data, per_channel_cast_transpose_to_fp8 of [K, N] data)"}


def transposed_pair(pair, name: str, rows: str) -> tuple:
    """(t.mT, scales.mT) of an operand that a DeepGEMM transposed form (nn, tn, tt) takes as t [..., K, rows] with
    scales [..., ceil(K / 128), rows or row blocks]: the NT call's pair. Hopper's FP8 wgmma reads K-major operands only,
    so t must be the transposed view of a K-major [..., rows, K] tensor; a rows-major t is refused, naming the casts
    that write the K-major layout."""
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise TypeError(f"{name} must be a (tensor, scales) pair")
    t, scales = pair
    check_dtype(t, name, (torch.float8_e4m3fn,))
    if t.dim() < 2:
        raise ValueError(f"{name} must be at least 2-D [K, {rows}], got shape {tuple(t.shape)}")
    check_rank(scales, f"sf{name}", t.dim())
    if t.shape[-2] > 1 and t.stride(-2) != 1:
        raise ValueError(
            f"{name} [K, {rows}] is {rows}-major (strides {tuple(t.stride())}): Hopper's FP8 wgmma reads K-major "
            f"operands only, so pass the transposed view {name}.mT of a K-major [{rows}, K] tensor "
            f"({K_MAJOR_CASTS[name]} writes one)")
    return t.mT, scales.mT


def fp8_gemm_nn(a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None, recipe_a=None,
                recipe_b=None, *, compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> torch.Tensor:
    """D = A @ B (+ C), DeepGEMM's NN form: b = (b [K, N], sfb) is the NT form's pair transposed (b.T K-major,
    sfb [ceil(K / 128), ceil(N / 128)], or [ceil(K / 128), N] with recipe (1, 1, 128)); fp8_gemm_nt(a, (b.T, sfb.T), d,
    c, recipe)."""
    return fp8_gemm_nt(a, transposed_pair(b, "b", "N"), d, c, recipe, recipe_a, recipe_b, compiled_dims=compiled_dims,
                       disable_ue8m0_cast=disable_ue8m0_cast)


def fp8_gemm_tn(a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None, recipe_a=None,
                recipe_b=None, *, compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> torch.Tensor:
    """D = A^T @ B (+ C), DeepGEMM's TN form: a = (a [K, M], sfa [ceil(K / 128), M]) and b = (b [K, N], sfb) are the
    NT form's pairs transposed (a.T and b.T K-major); fp8_gemm_nt((a.T, sfa.T), (b.T, sfb.T), d, c, recipe)."""
    return fp8_gemm_nt(transposed_pair(a, "a", "M"), transposed_pair(b, "b", "N"), d, c, recipe, recipe_a, recipe_b,
                       compiled_dims=compiled_dims, disable_ue8m0_cast=disable_ue8m0_cast)


def fp8_gemm_tt(a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None, recipe_a=None,
                recipe_b=None, *, compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> torch.Tensor:
    """D = A^T @ B^T (+ C), DeepGEMM's TT form: a = (a [K, M], sfa [ceil(K / 128), M]) is the NT form's pair transposed
    (a.T K-major); fp8_gemm_nt((a.T, sfa.T), b, d, c, recipe)."""
    return fp8_gemm_nt(transposed_pair(a, "a", "M"), b, d, c, recipe, recipe_a, recipe_b, compiled_dims=compiled_dims,
                       disable_ue8m0_cast=disable_ue8m0_cast)


def forced_config_call(config, a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None):
    """A function that runs fp8_gemm_nt(a, b, d, c, recipe) with `config` in place of the chosen one (measured tuning
    and side-by-side timing of configs); validated once, here."""
    (a, sfa), (b, sfb) = a, b
    call = _prepare_call(a, sfa, b, sfb, d, c, config, operands_of_recipe(recipe))
    return lambda: _launch(call, a, sfa, b, sfb, d, c)


def _launch(call: _PreparedCall, a, sfa, b, sfb, d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The per-call part of a validated call: scale conversion where needed, address checks, the launch. The
    prepared launches are cached on the call's addresses, so a call with the addresses of an earlier one (whose
    checks passed) encodes no tensor map and passes no parameter."""
    if not call.scales_ready:
        sfa, sfb = kernel_scales(sfa, sfb, call.m, call.n, call.k, call.operands)
    d_ptr = d.data_ptr()
    if call.kernel is None:
        _check_tma_addresses(a.data_ptr(), b.data_ptr(), sfa.data_ptr(), d_ptr,
                             sfb.data_ptr() if call.operands == CHANNEL_SCALED else 0)
        return d
    device_index = call.device_index
    # NOTE: the current workspace, unchecked: a launch cached with it was made for a call that fit in it.
    workspace = _split_workspaces.get(device_index) if call.split_layout[2] else None
    key = (a.data_ptr(), b.data_ptr(), sfa.data_ptr(), d_ptr, sfb.data_ptr(), workspace)
    launch = call.launches.get(key)
    if launch is None:
        check_d_over_operands(d, a, sfa, b, sfb)
        launch = _prepare_launch(call, key)
    if c is not None and c.data_ptr() != d_ptr:
        d.copy_(c)
    launch.launch(current_raw_stream(device_index))
    return d


def _prepare_launch(call: _PreparedCall, key: tuple):
    """The launch of a validated call at the addresses of key (_launch's), its addresses checked, cached in the
    call under the key they have with the workspace they use."""
    a_ptr, b_ptr, sfa_ptr, d_ptr, sfb_ptr, _ = key
    channel_scaled = call.operands == CHANNEL_SCALED
    _check_tma_addresses(a_ptr, b_ptr, sfa_ptr, d_ptr, sfb_ptr if channel_scaled else 0)
    num_unsplit_tiles, workspace_floats, num_tickets = call.split_layout
    workspace = _split_workspace(call.device_index, workspace_floats, num_tickets) if num_tickets else None
    tmap_sfa = (sfa_ptr,) + call.map_sfa
    encoded = call.kernel.encode(
        tmap_a=(a_ptr,) + call.map_a, tmap_b=(b_ptr,) + call.map_b, tmap_sfa=tmap_sfa, tmap_d=(d_ptr,) + call.map_d,
        sfb=sfb_ptr, shape_m=call.m, grouped_layout=0, num_groups=0, d=0,
        split_workspace=workspace.partials.data_ptr() if workspace else 0,
        split_tickets=workspace.tickets.data_ptr() if workspace else 0, num_unsplit_tiles=num_unsplit_tiles,
        tmap_sfb=(sfb_ptr,) + call.map_sfb if channel_scaled else tmap_sfa)
    return remember_launch(call.launches, key[:5] + (workspace,),
                           call.kernel.prepare(call.grid, call.device_index, encoded))


def check_d_over_operands(d: torch.Tensor, a, sfa, b, sfb=None) -> None:
    """d shares no byte with a, sfa, b or sfb (a ValueError naming the pair); sfb None: b holds its own scales (the
    FP4 GEMMs' prepared weights)."""
    check_no_overlap([("d", d)], [("a", a), ("sfa", sfa), ("b", b)] + ([] if sfb is None else [("sfb", sfb)]),
                     "d and the operands")


def _check_tma_addresses(a_ptr: int, b_ptr: int, sfa_ptr: int, d_ptr: int, channel_sfb_ptr: int = 0) -> None:
    if (a_ptr | b_ptr | d_ptr | sfa_ptr | channel_sfb_ptr) % 16:
        raise ValueError("a, b, d, sfa (and per-channel sfb) must start at 16-byte aligned addresses (TMA)")


def _specs(kernels) -> list:
    return [FP8_GEMM.spec(*kernel.template_args()) for kernel in kernels]


@precompiled
def precompile_specs() -> list:
    """Every kernel the heuristics pick over the representative shapes (both recipes)."""
    return _specs(heuristics.all_candidate_configs() + heuristics.wgrad_candidate_kernels())


def compile_coverage_specs() -> list:
    """precompile_specs() plus the code paths the picks leave out (multicast, grouped kinds, D swizzles)."""
    return _specs(heuristics.compile_coverage_kernels())
