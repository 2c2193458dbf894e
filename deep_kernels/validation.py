"""Input checks shared by the public API: each raises before launch with a message that names the
argument and says what was expected. Device checks come last, so every other check also runs (and is
tested) on CPU tensors."""

import torch

INT32_LIMIT = 2**31 - 1


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def tma_aligned_size(n: int, element_size: int) -> int:
    """n rounded up so that n elements of element_size bytes fill whole 16-byte TMA units."""
    per_unit = 16 // element_size
    return ceil_div(n, per_unit) * per_unit


def check_int_range(value, name: str, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_dtype(t, name: str, dtypes: tuple) -> None:
    check_tensor(t, name)
    if t.dtype not in dtypes:
        expected = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must be {expected}, got {t.dtype}")


def check_rank(t, name: str, rank: int) -> None:
    check_tensor(t, name)
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got shape {tuple(t.shape)}")


def check_row_major_rows(t: torch.Tensor, name: str) -> None:
    """Last dimension contiguous; rows start 16-byte aligned (row stride >= row length)."""
    rows, cols = t.shape[-2:]
    row_stride, col_stride = t.stride()[-2:]
    if cols > 1 and col_stride != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides {tuple(t.stride())}")
    if rows > 1 and cols > 0 and (row_stride < cols or row_stride * t.element_size() % 16 != 0):
        raise ValueError(
            f"{name} rows must be 16-byte aligned and not overlap: row stride {row_stride} elements "
            f"for rows of {cols} {t.dtype} elements"
        )
    if t.data_ptr() % 16 != 0:
        raise ValueError(f"{name} must start at a 16-byte aligned address")


def check_cuda_device(t: torch.Tensor, name: str, like: torch.Tensor = None) -> None:
    if not t.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {t.device}")
    if like is not None and t.get_device() != like.get_device():
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {like.device}")


def check_deepgemm_options(compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """DeepGEMM's GEMM options, accepted so that its calls run unchanged (inference engines pass them on every call);
    neither changes the kernel or its result on Hopper: compiled_dims names the dimensions DeepGEMM's JIT compiles in
    (ours always compiles N and K in and takes M at run time), and disable_ue8m0_cast turns off the rounding of FP32
    scales to UE8M0 that DeepGEMM applies on Blackwell only (FP32 scales are read as given, packed UE8M0 ones
    unpacked)."""
    if not isinstance(compiled_dims, str) or not set(compiled_dims) <= set("mnk"):
        raise ValueError(f"compiled_dims must be a string of the letters m, n and k, got {compiled_dims!r}")
    if not isinstance(disable_ue8m0_cast, bool):
        raise TypeError(f"disable_ue8m0_cast must be a bool, got {type(disable_ue8m0_cast).__name__}")
