"""Plain-torch reference of deep_kernels.quant.swiglu: the definition the kernels match bit for bit.

Every step is one elementwise torch operation in FP32, in the kernels' order, so on the GPU (where
torch.exp is CUDA's expf, and tensor-by-tensor division is the IEEE quotient) each value is the
kernels'. On the CPU torch.exp may differ from expf in the last bit, so CPU results agree only to
within rounding. Rows the kernels skip (position -1, or past masked_m) keep what `out` held.
"""

import torch

from deep_kernels.reference.common import DEFAULT_AMAX_CLAMP, ceil_div, empty_scales, pack_scales
from deep_kernels.reference.quant.fp8 import per_token_cast_to_fp8

GROUP_SIZE = 128
# The backward kernel's reduction geometry: a warp's 32 lanes hold 8 consecutive columns each.
_LANES, _LANE_COLUMNS = 32, 8


def _clamped_halves(x: torch.Tensor, clamp):
    """(gate, up, gc, uc, c) in FP32: x's halves, their clamped values (the halves themselves without
    clamp) and the clamp as a 0-d tensor (None without clamp)."""
    hidden = x.shape[-1] // 2
    gate, up = x[..., :hidden].float(), x[..., hidden:].float()
    if clamp is None:
        return gate, up, gate, up, None
    c = torch.tensor(clamp, dtype=torch.float32, device=x.device)
    return gate, up, torch.minimum(gate, c), torch.maximum(torch.minimum(up, c), -c), c


def _row_weights(weights, pos, rows_shape: tuple, device) -> tuple:
    """(valid rows, each row's weight or None): rows whose position is outside [0, weights.numel())
    (or negative, without weights) are not valid."""
    if pos is None:
        valid = torch.ones(rows_shape, dtype=torch.bool, device=device)
        return valid, None if weights is None else weights.reshape(rows_shape)
    if weights is None:
        return pos >= 0, None
    valid = (pos >= 0) & (pos < weights.numel())
    return valid, weights.reshape(-1)[torch.where(valid, pos, 0).long()]


def _swiglu_values(x: torch.Tensor, clamp, weights, pos) -> tuple:
    """(y [..., H] FP32, valid rows [...]): the forward's values, as the kernels compute them."""
    _, _, gc, uc, _ = _clamped_halves(x, clamp)
    y = gc / (torch.exp(-gc) + 1) * uc
    valid, row_weights = _row_weights(weights, pos, tuple(x.shape[:-1]), x.device)
    if row_weights is not None:
        y = y * row_weights.unsqueeze(-1)
    return y, valid


def _write_rows(out: torch.Tensor, values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """values into out's valid rows (leading dimensions of valid), out's other rows unchanged."""
    as_bytes = lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
    mask = valid.reshape(*valid.shape, *([1] * (out.dim() - valid.dim())))
    as_bytes(out).copy_(torch.where(mask, as_bytes(values), as_bytes(out)))
    return out


def swiglu_cast_to_fp8(x: torch.Tensor, clamp: float = None, weights: torch.Tensor = None, pos: torch.Tensor = None,
                       ue8m0: bool = False, scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                       scale_mode: str = "mul", check_pos: bool = True, out=None):
    y, valid = _swiglu_values(x, clamp, weights, pos)
    q, scales = per_token_cast_to_fp8(y, GROUP_SIZE, ue8m0, scale_layout, amax_clamp, scale_mode)
    if out is None and pos is None:
        return q, scales
    if out is None:
        out = (torch.empty_like(q), torch.empty_strided(scales.shape, scales.stride(), dtype=scales.dtype,
                                                        device=scales.device))
    return _write_rows(out[0], q, valid), _write_rows(out[1], scales, valid)


def swiglu_cast_to_fp8_masked(x: torch.Tensor, masked_m: torch.Tensor, clamp: float = None,
                              weights: torch.Tensor = None, pos: torch.Tensor = None, ue8m0: bool = False,
                              scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                              scale_mode: str = "mul", check_pos: bool = True, out=None):
    num_experts, max_tokens, width = x.shape
    hidden = width // 2
    y, valid = _swiglu_values(x, clamp, weights, pos)
    rows = torch.arange(max_tokens, device=x.device)
    valid &= rows < masked_m.to(x.device).clamp(0, max_tokens).unsqueeze(1)
    q, row_major = per_token_cast_to_fp8(y.reshape(-1, hidden), GROUP_SIZE, ue8m0, "row_major", amax_clamp,
                                         scale_mode)
    row_major = row_major.view(num_experts, max_tokens, -1)
    scales = empty_scales(max_tokens, hidden // GROUP_SIZE, scale_layout, x.device, batches=num_experts)
    for expert in range(num_experts):
        scales[expert].copy_(pack_scales(row_major[expert], scale_layout))
    if out is None:
        out = (torch.empty_like(q.view(num_experts, max_tokens, hidden)),
               empty_scales(max_tokens, hidden // GROUP_SIZE, scale_layout, x.device, batches=num_experts))
    return _write_rows(out[0], q.view(num_experts, max_tokens, hidden), valid), _write_rows(out[1], scales, valid)


def swiglu_forward(x: torch.Tensor, clamp: float = None, weights: torch.Tensor = None, pos: torch.Tensor = None,
                   check_pos: bool = True, out: torch.Tensor = None) -> torch.Tensor:
    y, valid = _swiglu_values(x, clamp, weights, pos)
    y = y.to(torch.bfloat16)
    if out is None and pos is None:
        return y
    return _write_rows(torch.empty_like(y) if out is None else out, y, valid)


def _row_sums(values: torch.Tensor) -> torch.Tensor:
    """Sums of the rows of values [N, H] in the backward kernel's order: per lane and element, a running
    sum over the 256-column chunks in order; then elements pairwise; then lanes by xor-butterfly."""
    num_rows, hidden = values.shape
    chunks = ceil_div(hidden, _LANES * _LANE_COLUMNS)
    padded = values.new_zeros((num_rows, chunks * _LANES * _LANE_COLUMNS))
    padded[:, :hidden] = values
    lanes = padded.view(num_rows, chunks, _LANES, _LANE_COLUMNS)
    partial = values.new_zeros((num_rows, _LANES, _LANE_COLUMNS))
    for chunk in range(chunks):
        partial = partial + lanes[:, chunk]
    while partial.shape[2] > 1:
        partial = partial[:, :, 0::2] + partial[:, :, 1::2]
    partial = partial[:, :, 0]
    while partial.shape[1] > 1:
        half = partial.shape[1] // 2
        partial = partial[:, :half] + partial[:, half:]
    return partial[:, 0]


def swiglu_backward(x: torch.Tensor, dy: torch.Tensor, clamp: float = None, weights: torch.Tensor = None,
                    pos: torch.Tensor = None, check_pos: bool = True, out=None):
    gate, up, gc, uc, c = _clamped_halves(x, clamp)
    denominator = torch.exp(-gc) + 1
    sigmoid = torch.ones_like(denominator) / denominator
    silu = gc / denominator
    grad = dy.float()
    valid, row_weights = _row_weights(weights, pos, (x.shape[0],), x.device)
    grad_weighted = grad if row_weights is None else grad * row_weights.unsqueeze(1)
    dgate = grad_weighted * uc * (sigmoid * (gc * (1 - sigmoid) + 1))
    dup = grad_weighted * silu
    if c is not None:
        dgate = torch.where(gate > c, 0.0, dgate)
        dup = torch.where((up > c) | (up < -c), 0.0, dup)
    dx = torch.cat([dgate, dup], dim=1).to(torch.bfloat16)
    dweights = _row_sums(grad * (silu * uc))
    if out is None and pos is None:
        return dx, dweights
    if out is None:
        out = (torch.empty_like(dx), torch.empty_like(dweights))
    return _write_rows(out[0], dx, valid), _write_rows(out[1], dweights, valid)
