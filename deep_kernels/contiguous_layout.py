"""The contiguous grouped layout's three descriptions, as the per-row expert ids the grouped kernels read.

The layout holds every expert's rows back to back in expert order, each expert's rows starting on a multiple of
CONTIGUOUS_ALIGNMENT (128) rows; the rows between one expert's last row and the next one's first are padding.
    m_indices  [M_total] int32: each row's expert, -1 on padding rows (what moe_layout writes and the kernels read);
    offsets    [G + 1] int32: the prefix sum of the expert sizes (offsets[0] = 0); expert g's rows start at the sum of
               the earlier experts' sizes, each rounded up to the alignment;
    psum       [G] int32, DeepGEMM's use_psum_layout=True: ends[g] is the row after expert g's last; expert g's rows
               start at ends[g - 1] rounded up to the alignment (expert 0's at row 0).
The last two become m_indices on the device by a few torch ops (no host synchronisation; M_total int32 allocated):
about 80 us of host time per call on the H200 machine (a whole GEMM call with m_indices: about 17 us); a CUDA graph
replays only their GPU work.
Values that describe no layout (a negative size, decreasing ends) still give each row an expert id or -1.
"""

import torch

from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT
from deep_kernels.validation import check_dtype, check_psum_options, check_rank, check_tensor, deepgemm_alias


def _aligned(rows: torch.Tensor) -> torch.Tensor:
    return (rows + (CONTIGUOUS_ALIGNMENT - 1)) & -CONTIGUOUS_ALIGNMENT


def _m_indices_of_segments(starts: torch.Tensor, ends: torch.Tensor, m_total: int) -> torch.Tensor:
    """Row r is expert g's where r < ends[g], for the last g whose rows start at or before r (starts[0] = 0; an empty
    expert, which starts where the next one does, never takes a row); -1 elsewhere. Few ops: each costs the host
    about 10 us."""
    rows = torch.arange(m_total, dtype=torch.int32, device=starts.device)
    if ends.numel() == 0:
        return rows.fill_(-1)
    group = torch.searchsorted(starts[1:], rows, right=True, out_int32=True)
    return group.masked_fill_(rows >= ends[group], -1)


def m_indices_from_offsets(offsets: torch.Tensor, m_total: int) -> torch.Tensor:
    """m_indices [m_total] of the layout described by the prefix sum of the expert sizes."""
    counts = offsets[1:] - offsets[:-1]
    segments = _aligned(counts)
    starts = torch.cumsum(segments, 0, dtype=torch.int32) - segments
    return _m_indices_of_segments(starts, starts + counts, m_total)


def m_indices_from_psum(ends: torch.Tensor, m_total: int) -> torch.Tensor:
    """m_indices [m_total] of the layout described by the experts' row ends (DeepGEMM's psum layout)."""
    return _m_indices_of_segments(_aligned(torch.nn.functional.pad(ends[:-1], (1, 0))), ends, m_total)


def layout_argument(m_indices, grouped_layout, required: bool = True):
    """A contiguous GEMM's layout argument under either name: m_indices (ours, and DeepGEMM's first) or the keyword
    grouped_layout (DeepGEMM's current name), not both; None where neither is given and it is not required."""
    return deepgemm_alias(m_indices, grouped_layout, "m_indices", "grouped_layout", "the layout argument", required)


def call_m_indices(grouped_layout, a, b, use_psum_layout: bool, ensure_zero_padding: bool,
                   expected_m_for_psum_layout) -> torch.Tensor:
    """The m_indices of a contiguous grouped GEMM call given DeepGEMM's layout options (validation.check_psum_options):
    grouped_layout itself, or with use_psum_layout=True the G experts' row ends for the rows of a (a tensor, or an
    (a, sfa) pair) and the experts of b ([G, N, K], or a (b, sfb) pair), converted."""
    check_psum_options(use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout)
    if not use_psum_layout:
        return grouped_layout
    a, b = (t[0] if isinstance(t, (tuple, list)) and len(t) >= 2 else t for t in (a, b))
    check_tensor(a, "a")
    check_tensor(b, "b")
    check_dtype(grouped_layout, "grouped_layout", (torch.int32,))
    check_rank(grouped_layout, "grouped_layout", 1)
    if a.dim() < 1 or b.dim() != 3 or grouped_layout.shape[0] != b.shape[0]:
        raise ValueError(f"with use_psum_layout=True grouped_layout holds one row end per expert: shape "
                         f"({b.shape[0] if b.dim() == 3 else 'G'},) for b of shape {tuple(b.shape)}, got "
                         f"{tuple(grouped_layout.shape)}")
    if grouped_layout.device != a.device:
        raise ValueError(f"grouped_layout is on {grouped_layout.device} but a is on {a.device}")
    return m_indices_from_psum(grouped_layout, a.shape[0])
