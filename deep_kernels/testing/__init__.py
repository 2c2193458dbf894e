"""Helpers shared by the tests and the benchmarks: input generation, comparisons, poisoning."""

import torch


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """Similarity error 1 - 2 sum(xy) / sum(x^2 + y^2) in float64: 0 for equal finite tensors (all zeros included),
    inf where either holds a NaN or an infinity (an unwritten, poisoned element must never score as a match)."""
    x, y = x.double(), y.double()
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        return float("inf")
    denominator = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denominator) if denominator > 0 else 0.0


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, name: str = "tensor") -> None:
    """Same dtype, shape, strides (of dimensions longer than 1) and bytes of every element."""
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    for dim, size in enumerate(actual.shape):
        assert size <= 1 or actual.stride(dim) == expected.stride(dim), (
            f"{name}: strides {actual.stride()} != {expected.stride()}"
        )
    if actual.numel() == 0:
        return
    a, e = _dense_bytes(actual), _dense_bytes(expected)
    if not torch.equal(a, e):
        mismatch = (a.view(-1) != e.view(-1)).nonzero()
        raise AssertionError(f"{name}: {mismatch.numel()} of {a.numel()} bytes differ, first at byte {int(mismatch[0])}")


def _dense_bytes(t: torch.Tensor) -> torch.Tensor:
    # NOTE: one-byte types (e4m3, e8m0, packed e2m1) are copied as their bytes: torch cannot copy every
    # one of them on every device. Not contiguous(): it keeps odd strides of size-1 dimensions, which
    # view(uint8) rejects.
    if t.element_size() == 1:
        t = t.view(torch.uint8)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t).view(-1).view(torch.uint8)


def empty_like_strided(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor with t's shape, dtype, device and exact strides (empty_like drops
    the strides of non-dense views such as TMA-aligned scales)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill every byte of t's storage with 0xFF (NaN for floating types), so unwritten outputs fail checks."""
    t.untyped_storage().fill_(0xFF)
    return t


def one_row_of_wider_rows(t: torch.Tensor, extra: int, poisoned: bool = False) -> torch.Tensor:
    """One-row t's values (or NaN, poisoned) in a view into a row `extra` elements longer, whose stride is no
    multiple of 16 bytes."""
    wide = torch.empty((1, t.shape[1] + extra), device=t.device, dtype=t.dtype)
    view = wide[:, :t.shape[1]]
    assert view.stride(0) * view.element_size() % 16 != 0, "extra leaves the row stride 16-byte aligned"
    return poison_(wide)[:, :t.shape[1]] if poisoned else view.copy_(t)


def copy_with_output_over_it(operand: torch.Tensor, output: torch.Tensor) -> tuple:
    """(a contiguous copy of operand, a tensor of output's dtype and shape over the copy's first bytes): an output
    over an input, which the calls must refuse."""
    operand_bytes, output_bytes = operand.numel() * operand.element_size(), output.numel() * output.element_size()
    shared = torch.empty(max(operand_bytes, output_bytes), dtype=torch.uint8, device=operand.device)
    copy = shared[:operand_bytes].view(operand.dtype).view(operand.shape).copy_(operand)
    return copy, shared[:output_bytes].view(output.dtype).view(output.shape)


# Poison bytes of int32 outputs whose valid values include -1 (0xFF bytes): 0x80808080 is no index, count or size.
INT32_POISON_BYTE = 0x80


def poison_cached_memory(byte: int = 0xFF) -> None:
    """Fills torch's allocator cache with `byte` (0xFF: NaN in e4m3, bf16 and FP32, -1 in integers;
    INT32_POISON_BYTE for int32 outputs that may hold -1) in both of its pools (blocks up to 1 MiB and larger ones),
    so that the buffers a call allocates itself most likely start poisoned: an element it returns without writing
    shows. (Best effort: the allocator decides which blocks it reuses.)"""
    torch.cuda.empty_cache()
    blocks = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(64)]
    blocks.append(torch.empty(512 << 20, dtype=torch.uint8, device="cuda"))
    for block in blocks:
        block.fill_(byte)
    del blocks


def random_activations(m: int, k: int, dtype=torch.bfloat16, device="cuda", seed=None) -> torch.Tensor:
    """Normal values with per-row magnitudes spread over several decades, as real activations have."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    x = torch.randn((m, k), generator=generator, device=device, dtype=torch.float32)
    row_scale = torch.exp2(torch.randint(-8, 8, (m, 1), generator=generator, device=device).float())
    return (x * row_scale).to(dtype)
