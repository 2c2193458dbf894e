"""Input checks shared by the public API: each raises before launch with a message that names the
argument and says what was expected. The inputs' device checks come after their other checks, so those also run
(and are tested) on CPU tensors; out= tensors are checked after the inputs' devices (their tests run on the GPU)."""

import operator

import torch
from torch.compiler import is_compiling, is_dynamo_compiling, is_exporting

INT32_LIMIT = 2**31 - 1
FLOAT32_MAX = torch.finfo(torch.float32).max


def is_traced() -> bool:
    """Whether dynamo or torch.export is tracing the caller. The public functions then call their custom ops
    (deep_kernels.ops), whose implementations run the eager functions, every check included, when the graph runs;
    checks that read data pointers cannot run while tracing. Eager calls pay one flag read."""
    return is_compiling() and (is_dynamo_compiling() or is_exporting())


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def tma_aligned_size(n: int, element_size: int) -> int:
    """n rounded up so that n elements of element_size bytes fill whole 16-byte TMA units."""
    per_unit = 16 // element_size
    return ceil_div(n, per_unit) * per_unit


def check_bool(value, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_fp32_number(value, name: str, positive: bool = False) -> float:
    """value as a kernel's FP32 parameter: a number (not a bool) that stays finite in FP32, and above 0 if positive
    (1e39 is a finite float but inf in FP32)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= FLOAT32_MAX
            or (positive and not value > 0)):
        raise ValueError(f"{name} must be a {'positive ' if positive else ''}finite FP32 number, got {value!r}")
    return float(value)


def int_tuple(value):
    """value's items as a tuple of ints (a recipe's block sizes), or None: never truncated (1.5 is no block size)."""
    try:
        return tuple(operator.index(x) for x in value)
    except TypeError:
        return None


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
    # The kernels take a row stride as a 32-bit parameter.
    if rows > 1 and row_stride > 2**32 - 1:
        raise ValueError(f"{name}'s row stride ({row_stride} elements) must be below 2^32")
    check_aligned(t, name)


def check_aligned(t: torch.Tensor, name: str) -> None:
    """t starts at a 16-byte aligned address (the kernels' vector loads and stores, TMA)."""
    if t.data_ptr() % 16 != 0:
        raise ValueError(f"{name} must start at a 16-byte aligned address")


def extent_bytes(t: torch.Tensor) -> int:
    """Bytes from t's first element to just past its last."""
    return (1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))) * t.element_size()


def check_no_overlap(written: list, read: list, what: str) -> None:
    """No tensor of `written` shares a byte with another of `written` or one of `read` ((name, tensor) pairs; read
    tensors may share bytes among themselves): a kernel must not read what it writes. Else a ValueError saying
    `what` must not overlap, naming the pair."""
    spans = [(t.data_ptr(), t.data_ptr() + extent_bytes(t), name) for name, t in written + read if t.numel() > 0]
    num_written = sum(1 for _, t in written if t.numel() > 0)
    for i, (start, end, name) in enumerate(spans[:num_written]):
        for other_start, other_end, other in spans[i + 1:]:
            if start < other_end and other_start < end:
                raise ValueError(f"{what} must not overlap: {name} and {other} do")


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
    check_bool(disable_ue8m0_cast, "disable_ue8m0_cast")


def deepgemm_alias(value, alias, name: str, alias_name: str, what: str, required: bool = True):
    """An argument given under our name (value) or under DeepGEMM's current keyword for it (alias), not both; None where
    neither is given and it is not required."""
    if alias is not None:
        if value is not None:
            raise TypeError(f"pass {what} as {name} or as {alias_name} (DeepGEMM's name for it), not both")
        return alias
    if value is None and required:
        raise TypeError(f"missing {what}: {name} (DeepGEMM's keyword: {alias_name})")
    return value


def scale_block_sizes(value, name: str) -> tuple:
    """A DeepGEMM per-operand recipe (rows, K) as a pair of ints."""
    sizes = int_tuple(value)
    if sizes is None or len(sizes) != 2:
        raise ValueError(f"{name} must be a pair (rows, K) of scale block sizes, got {value!r}")
    return sizes


def deepgemm_recipe(recipe, recipe_a, recipe_b):
    """DeepGEMM's recipe: the scale block sizes (M, N, K) as `recipe`, or per operand as `recipe_a` (M, K) with
    `recipe_b` (N, K) (DeepGEMM's other spelling; recipe_a (1, 128) with recipe_b (128, 128) is recipe (1, 128, 128)).
    Returns the (M, N, K) recipe, or None when neither spelling is given (the default)."""
    if recipe_a is None and recipe_b is None:
        return recipe
    if recipe is not None:
        raise ValueError("pass either recipe or recipe_a with recipe_b, not both")
    if recipe_a is None or recipe_b is None:
        raise ValueError("recipe_a and recipe_b go together: pass both or neither")
    (rows_a, k_a), (rows_b, k_b) = scale_block_sizes(recipe_a, "recipe_a"), scale_block_sizes(recipe_b, "recipe_b")
    if k_a != k_b:
        raise ValueError(f"recipe_a {recipe_a!r} and recipe_b {recipe_b!r} must scale the same K blocks")
    return rows_a, rows_b, k_a


def check_psum_options(use_psum_layout: bool, ensure_zero_padding: bool, expected_m_for_psum_layout) -> None:
    """DeepGEMM's contiguous-layout options: use_psum_layout says the layout argument holds the experts' row ends
    (deep_kernels.contiguous_layout); ensure_zero_padding (whether DeepGEMM's Blackwell kernels may write padding rows
    with zeros) and expected_m_for_psum_layout (a tile-size hint) change nothing here: padding rows are never written."""
    check_bool(use_psum_layout, "use_psum_layout")
    check_bool(ensure_zero_padding, "ensure_zero_padding")
    if expected_m_for_psum_layout is not None:
        if not use_psum_layout:
            raise ValueError("expected_m_for_psum_layout is a hint for use_psum_layout=True only")
        check_int_range(expected_m_for_psum_layout, "expected_m_for_psum_layout", 1, INT32_LIMIT)
