"""BF16 GEMMs: D = A @ B^T (+ C), dense and grouped (mixture of experts), on the SM90 GEMM engine's Bf16 kind
(the FP8 GEMM's kernel, scheduler, pipeline and epilogue; HGMMA straight into the FP32 accumulators, no
promotion).

Layouts (DeepGEMM's calls and conventions):
    dense       a [M, K] bf16, b [N, K] bf16, each K-major (rows 16-byte aligned) or MN-major (a transposed view:
                a.t() of a [K, M] tensor with M contiguous, its K rows 16-byte aligned); d [M, N] bf16, or FP32 (then
                optionally with c FP32 [M, N] added, c may be d).
    contiguous  a [M_total, K] bf16: every expert's rows back to back, each segment padded to
                get_m_alignment_for_contiguous_layout() rows; m_indices [M_total] int32 (-1 on padding rows);
                b [G, N, K] bf16; d [M_total, N] bf16.
    masked      a [G, M_max, K] bf16; masked_m [G] int32 on the device; expected_m a host-side hint; b [G, N, K];
                d [G, M_max, N] bf16.
The NN / TN / TT forms (bf16_gemm_nn, ...) take B as [K, N] and A as [K, M]: they are the NT call on the transposed
views; wgmma reads an MN-major operand from shared memory transposed, so no copy is made. The grouped GEMMs read
their operands K-major only (an MN-major one is refused, naming the copy).
Constraints: K and N multiples of 16; any M >= 0.
"""

import torch

from deep_kernels import gemm
from deep_kernels.call_cache import checked_call
from deep_kernels.contiguous_layout import call_m_indices, layout_argument
from deep_kernels.device import get_num_sms
from deep_kernels.gemm import FP8_GEMM, check_k_n
from deep_kernels.grouped_gemm import _check_devices, _check_layout_tensor, check_grouped_addresses, launch_grouped
from deep_kernels.heuristics import bf16_gemm as heuristics
from deep_kernels.heuristics import fp8_gemm as fp8_heuristics
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, get_kernel, remember_launch, tensor_map
from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT
from deep_kernels.validation import (
    check_cuda_device, check_deepgemm_options, check_dtype, check_int_range, check_no_overlap, check_rank,
    check_row_major_rows, is_traced,
)

BLOCK_K = heuristics.BLOCK_K
# Rows of M or N per box of an MN-major operand (128 bytes).
MN_MAJOR_BOX = 64
CONTIGUOUS = "m_grouped_contiguous"
MASKED = "m_grouped_masked"


def kernel_spec(config, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, gemm_type: str = "normal",
                mn_major_a: bool = False, mn_major_b: bool = False):
    return FP8_GEMM.spec(*heuristics.template_args(config, n, k, out_dtype, accumulate, gemm_type, mn_major_a,
                                                   mn_major_b))


def _get_kernel(config, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, gemm_type: str = "normal",
                mn_major_a: bool = False, mn_major_b: bool = False):
    return get_kernel(kernel_spec(config, n, k, out_dtype, accumulate, gemm_type, mn_major_a, mn_major_b),
                      smem_bytes=config.smem_bytes)


# ---- validation ----

def _check_k_major(t: torch.Tensor, name: str, rows: str, layout: str) -> None:
    """A grouped GEMM's K-major bf16 operand; an MN-major one (a transposed view) is refused with the copy that makes
    it K-major."""
    check_dtype(t, name, (torch.bfloat16,))
    if t.dim() >= 2 and t.shape[-1] > 1 and t.stride(-1) != 1 and t.stride(-2) == 1:
        raise ValueError(
            f"{name} is {rows}-major (a transposed view, strides {tuple(t.stride())}): the grouped BF16 GEMMs read "
            f"{layout} K-major, so pass {name}.contiguous()")
    check_row_major_rows(t, name)


def is_mn_major(t: torch.Tensor, name: str, rows: str) -> bool:
    """Whether a dense bf16 operand [rows, K] is MN-major (rows contiguous) rather than K-major; neither is an error."""
    check_dtype(t, name, (torch.bfloat16,))
    num_rows, k = t.shape
    if k <= 1 or t.stride(1) == 1:
        check_row_major_rows(t, name)
        return False
    if num_rows <= 1 or t.stride(0) != 1:
        raise ValueError(f"{name} [{rows}, K] must be K-major (K contiguous) or {rows}-major ({rows} contiguous, a "
                         f"transposed view), got strides {tuple(t.stride())}: pass {name}.contiguous()")
    if t.stride(1) < num_rows or t.stride(1) * t.element_size() % 16 or t.data_ptr() % 16:
        raise ValueError(f"{name} is {rows}-major: its K rows must be 16-byte aligned and not overlap, and it must "
                         f"start 16-byte aligned, got strides {tuple(t.stride())}")
    return True


def _check_dense_call(a, b, d, c) -> tuple:
    """Full validation of a dense call; returns (m, n, k, whether a is M-major, whether b is N-major)."""
    check_rank(a, "a", 2)
    check_rank(b, "b", 2)
    mn_major_a = is_mn_major(a, "a", "M")
    mn_major_b = is_mn_major(b, "b", "N")
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(f"a is [M, K] = {tuple(a.shape)} but b is {tuple(b.shape)}: K differs")
    check_k_n(k, n)
    accumulate = c is not None
    check_dtype(d, "d", (torch.float32,) if accumulate else (torch.bfloat16, torch.float32))
    if accumulate:
        check_dtype(c, "c", (torch.float32,))
        if tuple(c.shape) != (m, n):
            raise ValueError(f"c must have shape {(m, n)}, got {tuple(c.shape)}")
    if tuple(d.shape) != (m, n) or not d.is_contiguous():
        raise ValueError(f"d must be a contiguous [M, N] = {(m, n)} tensor, got shape {tuple(d.shape)} "
                         f"strides {tuple(d.stride())}")
    check_row_major_rows(d, "d")
    for tensor, name in ((a, "a"), (b, "b"), (d, "d")) + ((c, "c"),) * accumulate:
        check_cuda_device(tensor, name, like=a)
    return m, n, k, mn_major_a, mn_major_b


def _check_b(b, k: int) -> tuple:
    """Grouped b [G, N, K]; returns (G, N)."""
    check_rank(b, "b", 3)
    _check_k_major(b, "b", "N", "b [G, N, K]")
    num_groups, n, b_k = b.shape
    if b_k != k:
        raise ValueError(f"a has K = {k} but b is [G, N, K] = {tuple(b.shape)}: K differs")
    check_k_n(k, n)
    if num_groups > 1 and b.stride(0) != n * b.stride(1):
        raise ValueError(f"b's groups must follow each other (stride(0) = N * stride(1)), got strides {tuple(b.stride())}")
    return num_groups, n


def _check_grouped_d(d, shape: tuple) -> None:
    check_dtype(d, "d", (torch.bfloat16,))
    if tuple(d.shape) != shape or not d.is_contiguous():
        raise ValueError(f"d must be a contiguous bf16 tensor of shape {shape}, got shape {tuple(d.shape)} "
                         f"strides {tuple(d.stride())}")
    check_row_major_rows(d, "d")


def _check_contiguous_call(a, b, d, m_indices) -> tuple:
    """Full validation; returns (m_total, n, k, G)."""
    check_rank(a, "a", 2)
    _check_k_major(a, "a", "M", "a [M_total, K]")
    m, k = a.shape
    num_groups, n = _check_b(b, k)
    if m % CONTIGUOUS_ALIGNMENT != 0:
        raise ValueError(f"a has M_total = {m} rows: it must be a multiple of "
                         f"get_m_alignment_for_contiguous_layout() = {CONTIGUOUS_ALIGNMENT} (pad each expert's segment)")
    _check_layout_tensor(m_indices, "m_indices", m)
    _check_grouped_d(d, (m, n))
    _check_devices(((a, "a"), (b, "b"), (d, "d"), (m_indices, "m_indices")))
    return m, n, k, num_groups


def _check_masked_call(a, b, d, masked_m, expected_m) -> tuple:
    """Full validation; returns (M_max, n, k, G)."""
    check_rank(a, "a", 3)
    _check_k_major(a, "a", "M", "a [G, M_max, K]")
    a_groups, m_max, k = a.shape
    num_groups, n = _check_b(b, k)
    if a_groups != num_groups:
        raise ValueError(f"a has G = {a_groups} groups but b has {num_groups}")
    if (num_groups > 1 and a.stride(0) < m_max * a.stride(1)) or a.stride(0) * a.element_size() % 16 != 0:
        raise ValueError(f"a's groups must not overlap and start 16-byte aligned, got strides {tuple(a.stride())}")
    _check_layout_tensor(masked_m, "masked_m", num_groups)
    _check_grouped_d(d, (num_groups, m_max, n))
    check_int_range(expected_m, "expected_m", 1, max(m_max, 1))
    _check_devices(((a, "a"), (b, "b"), (d, "d"), (masked_m, "masked_m")))
    return m_max, n, k, num_groups


def _check_addresses(a, b, d) -> None:
    if (a.data_ptr() | b.data_ptr() | d.data_ptr()) % 16:
        raise ValueError("a, b and d must start at 16-byte aligned addresses (TMA)")
    check_no_overlap([("d", d)], [("a", a), ("b", b)], "d and the operands")


# ---- dense ----

_plans = {}


def _plan(m: int, n: int, k: int, out_dtype: torch.dtype, accumulate: bool, num_sms: int, config=None,
          mn_major_a: bool = False, mn_major_b: bool = False) -> tuple:
    """(kernel, config, grid, split-K layout (num_unsplit_tiles, workspace floats, tickets)) of a dense problem,
    with the heuristics' config unless one is given; one dict lookup once seen."""
    key = (m, n, k, out_dtype, accumulate, num_sms, config, mn_major_a, mn_major_b)
    plan = _plans.get(key)
    if plan is None:
        if config is None:
            config = heuristics.get_bf16_gemm_config(m, n, k, num_sms, out_dtype_bytes=out_dtype.itemsize,
                                                     with_accumulation=accumulate, mn_major_b=mn_major_b)
        if not 1 <= config.num_splits <= -(-k // BLOCK_K):
            raise ValueError(f"a BF16 config splits K into at most ceil(K / {BLOCK_K}) parts, got {config.num_splits}")
        if not heuristics.is_legal_tile(config.block_m, config.block_n, mn_major_b=mn_major_b):
            raise ValueError(f"no BF16 kernel for {config.block_m}x{config.block_n} tiles of an N-major b")
        if config.splits_in_cluster and not fp8_heuristics.has_splits_in_cluster(config, m, n, num_sms):
            raise ValueError(f"splits in a cluster need tiles x splits <= SMs: "
                             f"{fp8_heuristics.num_tiles(config, m, n)} tiles x {config.num_splits} splits > {num_sms} SMs")
        kernel = _get_kernel(config, n, k, out_dtype, accumulate, "normal", mn_major_a, mn_major_b)
        grid = (fp8_heuristics.grid_size(config, m, n, num_sms), 1, 1)
        split_layout = (fp8_heuristics.num_unsplit_tiles(config, m, n, num_sms),
                        *fp8_heuristics.split_workspace_sizes(config, m, n, num_sms))
        plan = _plans[key] = (kernel, config, grid, split_layout)
    return plan


def _launch_dense(a, b, d, c, config=None) -> torch.Tensor:
    """A dense call: validated in full on a new signature; a call with the addresses and plan of an earlier one
    (whose address checks passed) encodes no tensor map and checks nothing more."""
    (m, n, k, mn_major_a, mn_major_b), launches = checked_call(_check_dense_call, (a, b, d, c))
    if m == 0:
        _check_addresses(a, b, d)
        return d
    device_index = a.get_device()
    plan = _plan(m, n, k, d.dtype, c is not None, get_num_sms(), config, mn_major_a, mn_major_b)
    # NOTE: the current workspace, unchecked: a launch cached with it was made for a call that fit in it.
    workspace = gemm._split_workspaces.get(device_index) if plan[3][2] else None
    key = (a.data_ptr(), b.data_ptr(), d.data_ptr(), plan, workspace)
    launch = launches.get(key)
    if launch is None:
        launch = _prepare_dense_launch(plan, a, b, d, mn_major_a, mn_major_b, device_index, launches, key)
    if c is not None and c.data_ptr() != d.data_ptr():
        d.copy_(c)
    launch.launch(current_raw_stream(device_index))
    return d


def _prepare_dense_launch(plan: tuple, a, b, d, mn_major_a: bool, mn_major_b: bool, device_index: int,
                          launches: dict, key: tuple):
    """The launch of a validated dense call at its tensors' addresses (checked here), kept in launches under key
    with the split-K workspace it was made with."""
    _check_addresses(a, b, d)
    kernel, config, grid, (num_unsplit_tiles, workspace_floats, num_tickets) = plan
    workspace = gemm._split_workspace(device_index, workspace_floats, num_tickets) if num_tickets else None
    map_a = operand_map(a, config.block_m, mn_major_a)
    # NOTE: the kernel reads no scales with BF16 operands; tmap_sfa and tmap_sfb take A's map so that every parameter
    # is valid.
    encoded = kernel.encode(
        tmap_a=map_a, tmap_b=operand_map(b, config.block_n, mn_major_b), tmap_sfa=map_a,
        tmap_d=tensor_map(d, (64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes), sfb=0,
        shape_m=a.shape[0], grouped_layout=0, num_groups=0, d=0,
        split_workspace=workspace.partials.data_ptr() if workspace else 0,
        split_tickets=workspace.tickets.data_ptr() if workspace else 0, num_unsplit_tiles=num_unsplit_tiles,
        tmap_sfb=map_a)
    return remember_launch(launches, key[:4] + (workspace,), kernel.prepare(grid, device_index, encoded))


def operand_map(t: torch.Tensor, block_rows: int, mn_major: bool) -> tuple:
    """A dense operand's tensor map: K-major boxes {block_rows, 64}, or MN-major boxes of 64 x 64 (the kernel loads
    block_rows / 64 of them per stage)."""
    if mn_major:
        return tensor_map(t, (MN_MAJOR_BOX, BLOCK_K), 128, transpose=True)
    return tensor_map(t, (block_rows, BLOCK_K), 128)


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor = None,
                 *, compiled_dims: str = "nk") -> torch.Tensor:
    """D = A @ B^T (+ C) with bf16 inputs and FP32 accumulation.

    Args:
        a: [M, K] bf16, K-major, or M-major (x.t() of a row-major [K, M] tensor x).
        b: [N, K] bf16, K-major, or N-major (w.t() of a [K, N] tensor).
        d: [M, N] output, bf16 or FP32; FP32 when c is given.
        c: optional FP32 [M, N] added to the product (in FP32); may be d itself.
        compiled_dims: DeepGEMM's option, accepted so that its calls run unchanged; it changes nothing here
            (validation.check_deepgemm_options).

    Returns:
        d.

    Notes:
        Deterministic: the same inputs give the same bits (fixed reduction order, split-K included: at decode
        sizes K may be split over several CTAs per tile, whose FP32 partial tiles meet in fp8_gemm_nt's
        per-device workspace, grown on demand and never during CUDA-graph capture: run a shape once before
        capturing it). No host synchronisation or allocation, so calls can be captured in CUDA graphs.
    """
    check_deepgemm_options(compiled_dims)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.bf16_gemm_nt(a, b, d, c)
    return _launch_dense(a, b, d, c)


def bf16_gemm_nn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor = None,
                 *, compiled_dims: str = "nk") -> torch.Tensor:
    """D = A @ B (+ C) with a [M, K] and b [K, N] (row-major: N-major, read transposed by wgmma; or the transposed
    view of a K-major [N, K] tensor): bf16_gemm_nt(a, b.T, d, c)."""
    return bf16_gemm_nt(a, _transposed(b, "b"), d, c, compiled_dims=compiled_dims)


def bf16_gemm_tn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor = None,
                 *, compiled_dims: str = "nk") -> torch.Tensor:
    """D = A^T @ B (+ C) with a [K, M] and b [K, N] (the weight gradient's layout): bf16_gemm_nt(a.T, b.T, d, c)."""
    return bf16_gemm_nt(_transposed(a, "a"), _transposed(b, "b"), d, c, compiled_dims=compiled_dims)


def bf16_gemm_tt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor = None,
                 *, compiled_dims: str = "nk") -> torch.Tensor:
    """D = A^T @ B^T (+ C) with a [K, M] and b [N, K]: bf16_gemm_nt(a.T, b, d, c)."""
    return bf16_gemm_nt(_transposed(a, "a"), b, d, c, compiled_dims=compiled_dims)


def _transposed(t, name: str) -> torch.Tensor:
    check_rank(t, name, 2)
    return t.t()


# ---- grouped ----

_grouped_plans = {}


def _grouped_plan(gemm_type: str, m: int, n: int, k: int, num_groups: int, config=None) -> tuple:
    """(kernel, config, grid) of a grouped problem (m: total rows, or expected_m when masked)."""
    num_sms = get_num_sms()
    key = (gemm_type, m, n, k, num_groups, num_sms, config)
    plan = _grouped_plans.get(key)
    if plan is None:
        if config is None:
            config = heuristics.get_grouped_bf16_gemm_config(gemm_type, m, n, k, num_groups, num_sms)
        elif config.num_splits != 1 or not heuristics.is_legal_tile(config.block_m, config.block_n, grouped=True):
            raise ValueError("the grouped BF16 GEMMs take neither split-K nor 256-row tiles")
        kernel = _get_kernel(config, n, k, torch.bfloat16, False, gemm_type)
        if gemm_type == MASKED:
            grid = num_sms // config.num_tma_multicast * config.num_tma_multicast
        else:
            grid = fp8_heuristics.grid_size(config, m, n, num_sms)
        plan = _grouped_plans[key] = (kernel, config, (grid, 1, 1))
    return plan


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                      m_indices: torch.Tensor = None, *, grouped_layout: torch.Tensor = None,
                                      compiled_dims: str = "nk", use_psum_layout: bool = False,
                                      ensure_zero_padding: bool = True,
                                      expected_m_for_psum_layout: int = None) -> torch.Tensor:
    """d[r] = a[r] @ b[m_indices[r]]^T for every row r of the contiguous layout (module docstring).

    Args:
        a: [M_total, K] bf16, K-major; M_total a multiple of get_m_alignment_for_contiguous_layout().
        b: [G, N, K] bf16, K-major.
        d: [M_total, N] bf16 output.
        m_indices: [M_total] int32 CUDA tensor: each row's expert in [0, G), -1 on padding rows (ids outside [0, G)
            count as padding); each expert's rows one segment starting on a multiple of the alignment.
        grouped_layout: DeepGEMM's keyword for the layout argument, in place of m_indices (not both).
        compiled_dims: DeepGEMM's option, accepted so that its calls run unchanged; it changes nothing here
            (validation.check_deepgemm_options).
        use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout: as for m_grouped_fp8_gemm_nt_contiguous
            (use_psum_layout=True: m_indices holds the experts' row ends).

    Returns:
        d.

    Notes:
        Padding rows of d are never written. Deterministic; no host synchronisation or allocation (CUDA-graph safe;
        the psum layout allocates its per-row ids).
    """
    check_deepgemm_options(compiled_dims)
    m_indices = call_m_indices(layout_argument(m_indices, grouped_layout), a, b, use_psum_layout, ensure_zero_padding,
                               expected_m_for_psum_layout)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices)
    return _launch_contiguous(a, b, d, m_indices)


def m_grouped_bf16_gemm_nn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                      m_indices: torch.Tensor = None, *, grouped_layout: torch.Tensor = None,
                                      compiled_dims: str = "nk", use_psum_layout: bool = False,
                                      ensure_zero_padding: bool = True) -> torch.Tensor:
    """DeepGEMM's NN form of m_grouped_bf16_gemm_nt_contiguous: b [G, K, N] is the transposed view of the K-major
    [G, N, K] weights the grouped kernel reads (b.mT); the NT call on b.mT."""
    check_rank(b, "b", 3)
    if b.shape[1] > 1 and b.stride(1) != 1:
        raise ValueError(f"b [G, K, N] is N-major (strides {tuple(b.stride())}): the grouped BF16 GEMMs read the "
                         f"weights K-major, so pass the transposed view w.mT of K-major [G, N, K] weights w "
                         f"(b.mT.contiguous().mT copies b into that layout)")
    return m_grouped_bf16_gemm_nt_contiguous(a, b.mT, d, m_indices, grouped_layout=grouped_layout,
                                             compiled_dims=compiled_dims, use_psum_layout=use_psum_layout,
                                             ensure_zero_padding=ensure_zero_padding)


# What the grouped BF16 kernels read, by name, in launch_grouped's order.
CONTIGUOUS_INPUTS = ("a", "b", "m_indices")
MASKED_INPUTS = ("a", "b", "masked_m")


def _launch_contiguous(a, b, d, m_indices, config=None) -> torch.Tensor:
    (m, n, k, num_groups), launches = checked_call(_check_contiguous_call, (a, b, d, m_indices))
    if m == 0 or num_groups == 0:
        check_grouped_addresses((a, b, m_indices), CONTIGUOUS_INPUTS, d)
        return d
    return launch_grouped(launches, _grouped_plan(CONTIGUOUS, m, n, k, num_groups, config), _encode_contiguous,
                          (a, b, m_indices), CONTIGUOUS_INPUTS, d, m, num_groups)


def _encode_contiguous(kernel, config, a, b, m_indices, d, m: int, num_groups: int) -> bytes:
    map_a = tensor_map(a, (config.block_m, BLOCK_K), 128)
    return kernel.encode(
        tmap_a=map_a, tmap_b=tensor_map(b.flatten(0, 1), (config.block_n, BLOCK_K), 128), tmap_sfa=map_a,
        tmap_d=tensor_map(d, (64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes),
        sfb=0, shape_m=m, grouped_layout=m_indices.data_ptr(), num_groups=num_groups, d=d.data_ptr(),
        split_workspace=0, split_tickets=0, num_unsplit_tiles=0, tmap_sfb=map_a)


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int,
                                  *, compiled_dims: str = "nk") -> torch.Tensor:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T for every expert g (masked layout, module docstring).

    Args:
        a: [G, M_max, K] bf16, K-major.
        b: [G, N, K] bf16, K-major.
        d: [G, M_max, N] bf16 output.
        masked_m: [G] int32 CUDA tensor, valid rows per expert, read on the device (clamped to [0, M_max]).
        expected_m: host-side estimate of the valid rows per expert, an integer in [1, max(M_max, 1)]; it only
            steers the tile choice.
        compiled_dims: DeepGEMM's option, accepted so that its calls run unchanged; it changes nothing here
            (validation.check_deepgemm_options).

    Returns:
        d.

    Notes:
        Rows at or past masked_m[g] of d[g] are never written. One CTA per SM whatever masked_m holds; no host
        synchronisation or allocation: the call can be captured in a CUDA graph and replayed with new masked_m.
        Deterministic.
    """
    check_deepgemm_options(compiled_dims)
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)
    return _launch_masked(a, b, d, masked_m, expected_m)


def _launch_masked(a, b, d, masked_m, expected_m, config=None) -> torch.Tensor:
    (m_max, n, k, num_groups), launches = checked_call(_check_masked_call, (a, b, d, masked_m), expected_m)
    if m_max == 0 or num_groups == 0:
        check_grouped_addresses((a, b, masked_m), MASKED_INPUTS, d)
        return d
    return launch_grouped(launches, _grouped_plan(MASKED, expected_m, n, k, num_groups, config), _encode_masked,
                          (a, b, masked_m), MASKED_INPUTS, d, m_max, num_groups)


def _encode_masked(kernel, config, a, b, masked_m, d, m_max: int, num_groups: int) -> bytes:
    map_a = tensor_map(a, (1, config.block_m, BLOCK_K), 128)
    return kernel.encode(
        tmap_a=map_a, tmap_b=tensor_map(b.flatten(0, 1), (config.block_n, BLOCK_K), 128), tmap_sfa=map_a,
        tmap_d=tensor_map(d, (1, 64, config.swizzle_d_bytes // d.element_size()), config.swizzle_d_bytes),
        sfb=0, shape_m=m_max, grouped_layout=masked_m.data_ptr(), num_groups=num_groups, d=d.data_ptr(),
        split_workspace=0, split_tickets=0, num_unsplit_tiles=0, tmap_sfb=map_a)


@precompiled
def precompile_specs() -> list:
    """Every kernel the BF16 heuristics pick over the representative shapes (dense and grouped)."""
    return [FP8_GEMM.spec(*kernel.template_args()) for kernel in heuristics.all_candidate_kernels()]
