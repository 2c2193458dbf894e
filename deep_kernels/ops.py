"""torch custom ops of the public functions (torch.ops.deep_kernels.*), so that torch.compile(fullgraph=True) and
torch.export trace code that calls them without a graph break, and the compiled code can be captured in CUDA graphs.

The public functions stay the entry point and keep their eager path: only while dynamo or torch.export traces them
does a public function call its namesake here instead, which passes its tensors to the op (the (tensor, scales)
pairs of the GEMMs and a MoeLayout's fields as separate arguments; the layout is rebuilt from the op's outputs;
fp8_fp4_gemm_nt and m_grouped_fp8_fp4_gemm_nt_masked with prepared weights call their _prepared twins).
Eager calls pay one flag read for it, torch.compiler.is_compiling(); that flag alone would not do, since torch holds
it for a whole compile session, during which an op may also run for real (inductor's constant folding, a backend
running the graph), and its implementation must then take the eager path. An op's implementation calls the eager
function, so it validates, launches and synchronizes (or not) exactly as an eager call does, raising the same errors,
at run time; its fake implementation gives the outputs' dtypes, shapes and strides (those of the eager function's
allocations) and launches nothing. Checks of the arguments that the trace itself needs (the pairs, the MoeLayout)
raise the eager errors while tracing.

Overloads: a function that allocates its outputs has the default overload, which returns new tensors (out=None),
and `.out`, which writes out's tensors (the op's last arguments, declared mutated) and returns nothing. The GEMMs
write d (declared mutated); c is d (accumulating in place) is the flag c_is_d, so that no input of the op aliases
the d it writes. Written tensors are read-write for torch: what the kernels leave unwritten (padding rows, masked
rows, skipped rows) keeps its contents as in eager calls.

Not ops (they launch nothing of their own, and trace as they are): get_mn_major_tma_aligned_tensor,
nvfp4_global_scale and prepare_fp4_weights (torch ops), tma_aligned_size, get_m_alignment_for_contiguous_layout
(get_mk_alignment_for_contiguous_layout, get_k_alignment_for_contiguous_layout),
get_theoretical_mk_alignment_for_contiguous_layout,
set_mk_alignment_for_contiguous_layout, get_tma_aligned_size, transform_sf_into_required_layout,
fp8_m_grouped_gemm_nt_masked (DeepGEMM's other name of m_grouped_fp8_gemm_nt_masked),
get_num_sms, set_num_sms, bf16_gemm_nn / tn / tt and k_grouped_bf16_gemm_tn_contiguous (transposed views handed to the nt function, which
traces to its op).
"""

from dataclasses import fields

import torch

from deep_kernels import bf16_gemm, fp4_gemm, fp4_weights, gemm, grouped_gemm, k_grouped_bf16_gemm, k_grouped_gemm
from deep_kernels.grouped_gemm import _split_pairs
from deep_kernels.moe import expand, expert_parallel, gate, layout, routing
from deep_kernels.moe.expand import _layout_sizes, expanded_scale_geometry
from deep_kernels.moe.layout import MoeLayout, new_layout
from deep_kernels.quant import e5m6, fp4, fp8, requant, swiglu, transpose
from deep_kernels.quant.common import ScaleLayout, cast_outputs, empty_scales, parse_layout
from deep_kernels.quant.fp4 import Fp4Format, _parse_fp4_layout, empty_fp4_scales
from deep_kernels.quant.swiglu import GROUP_SIZE, empty_masked_scales
from deep_kernels.validation import ceil_div

_LIBRARY = torch.library.Library("deep_kernels", "DEF")
_OPS = torch.ops.deep_kernels
_LAYOUT_FIELDS = tuple(field.name for field in fields(MoeLayout))
# A MoeLayout as op arguments: its fields in order, the masked ones None without max_tokens.
_LAYOUT_SCHEMA = ("Tensor counts, Tensor num_rows, Tensor m_indices, Tensor row_to_slot, Tensor slot_to_row, "
                  "Tensor? masked_slots, Tensor? masked_m")


def _register(name: str, implementation, fake) -> None:
    """The implementations of deep_kernels::<name>: the real one for every device, the fake one, and none for
    autograd: as in eager calls (whose kernels torch does not see), the outputs are constants to autograd."""
    _LIBRARY.impl(name, implementation, "CompositeExplicitAutograd")
    _LIBRARY.impl(name, torch.library.fallthrough_kernel, "Autograd")
    torch.library.register_fake(f"deep_kernels::{name}", fake, lib=_LIBRARY)


def _define(schema: str, implementation, fake, outputs: str = None):
    """Defines deep_kernels::<schema>, run by implementation(*arguments) and traced through fake(*arguments).

    With outputs (the schema of the tensors out= gives, e.g. "Tensor(a!) q, Tensor(b!) scales") it also defines the .out
    overload: the same arguments followed by those tensors, which implementation(*arguments, out=...) writes (one
    tensor or a tuple, as the public function takes out=); it returns nothing. Returns the traced call for the
    public function: (*arguments, out) with outputs, else (*arguments).
    """
    name = schema.partition("(")[0]
    _LIBRARY.define(schema)
    _register(name, implementation, fake)
    op = getattr(_OPS, name)
    if outputs is None:
        return op.default
    num_outputs = len(outputs.split(","))
    arguments = schema.partition("(")[2].rpartition(") ->")[0]
    _LIBRARY.define(f"{name}.out({arguments}, {outputs}) -> ()")

    def write(*arguments_and_outputs):
        written = arguments_and_outputs[-num_outputs:]
        implementation(*arguments_and_outputs[:-num_outputs], out=written if num_outputs > 1 else written[0])

    _register(f"{name}.out", write, _writes_only)

    def traced(*arguments_and_out):
        *arguments, out = arguments_and_out
        if out is None:
            return op.default(*arguments)
        written = tuple(out) if num_outputs > 1 else (out,)
        op.out(*arguments, *written)
        return written if num_outputs > 1 else out

    return traced


def _writes_only(*arguments) -> None:
    """The fake of an op that only writes its arguments."""
    return None


def _groups(size, group_size):
    """Groups (or blocks) of group_size covering size; a group size the function rejects is left to its validation
    at run time."""
    return ceil_div(size, group_size) if group_size > 0 else 0


# ---- GEMMs: d is written ----

def _fp8_gemm_nt(a, sfa, b, sfb, d, c, c_is_d, recipe=None) -> None:
    gemm.fp8_gemm_nt((a, sfa), (b, sfb), d, d if c_is_d else c, recipe)


_define("fp8_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, Tensor? c, bool c_is_d, "
        "int[]? recipe=None) -> ()", _fp8_gemm_nt, _writes_only)


def fp8_gemm_nt(a, b, d, c, recipe=None):
    a, sfa, b, sfb = _split_pairs(a, b)
    c_is_d = c is d
    _OPS.fp8_gemm_nt.default(a, sfa, b, sfb, d, None if c_is_d else c, c_is_d,
                             None if recipe is None else list(recipe))
    return d


def _m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, d, m_indices, offsets) -> None:
    grouped_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, m_indices, offsets=offsets)


_define("m_grouped_fp8_gemm_nt_contiguous(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, "
        "Tensor? m_indices, Tensor? offsets) -> ()", _m_grouped_fp8_gemm_nt_contiguous, _writes_only)


def m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, offsets):
    _OPS.m_grouped_fp8_gemm_nt_contiguous.default(*_split_pairs(a, b), d, m_indices, offsets)
    return d


def _m_grouped_fp8_gemm_nt_masked(a, sfa, b, sfb, d, masked_m, expected_m) -> None:
    grouped_gemm.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, expected_m)


_define("m_grouped_fp8_gemm_nt_masked(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, Tensor masked_m, "
        "SymInt expected_m) -> ()", _m_grouped_fp8_gemm_nt_masked, _writes_only)


def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m):
    _OPS.m_grouped_fp8_gemm_nt_masked.default(*_split_pairs(a, b), d, masked_m, expected_m)
    return d


def _bf16_gemm_nt(a, b, d, c, c_is_d) -> None:
    bf16_gemm.bf16_gemm_nt(a, b, d, d if c_is_d else c)


_define("bf16_gemm_nt(Tensor a, Tensor b, Tensor(a!) d, Tensor? c, bool c_is_d) -> ()", _bf16_gemm_nt, _writes_only)


def bf16_gemm_nt(a, b, d, c):
    c_is_d = c is d
    _OPS.bf16_gemm_nt.default(a, b, d, None if c_is_d else c, c_is_d)
    return d


_define("m_grouped_bf16_gemm_nt_contiguous(Tensor a, Tensor b, Tensor(a!) d, Tensor m_indices) -> ()",
        bf16_gemm.m_grouped_bf16_gemm_nt_contiguous, _writes_only)


def m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices):
    _OPS.m_grouped_bf16_gemm_nt_contiguous.default(a, b, d, m_indices)
    return d


_define("m_grouped_bf16_gemm_nt_masked(Tensor a, Tensor b, Tensor(a!) d, Tensor masked_m, SymInt expected_m) -> ()",
        bf16_gemm.m_grouped_bf16_gemm_nt_masked, _writes_only)


def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m):
    _OPS.m_grouped_bf16_gemm_nt_masked.default(a, b, d, masked_m, expected_m)
    return d


def _fp8_fp4_gemm_nt(a, sfa, b, sfb, d, c, c_is_d, global_scale=None) -> None:
    weights = (b, sfb) if global_scale is None else (b, sfb, global_scale)
    fp4_gemm.fp8_fp4_gemm_nt((a, sfa), weights, d, d if c_is_d else c)


# global_scale: the NVFP4 form's (b = (codes, sfb, global_scale)); None for MXFP4.
_define("fp8_fp4_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, Tensor? c, bool c_is_d, "
        "Tensor? global_scale=None) -> ()", _fp8_fp4_gemm_nt, _writes_only)


def _fp8_fp4_gemm_nt_prepared(a, sfa, b, n, folds_into_blocks, d, c, c_is_d, tile_scaled=False) -> None:
    prepared = fp4_weights.PreparedFp4Weights(b, n, a.shape[1], folds_into_blocks, tile_scaled)
    fp4_gemm.fp8_fp4_gemm_nt((a, sfa), prepared, d, d if c_is_d else c)


_define("fp8_fp4_gemm_nt_prepared(Tensor a, Tensor sfa, Tensor b, int n, bool folds_into_blocks, Tensor(a!) d, "
        "Tensor? c, bool c_is_d, bool tile_scaled=False) -> ()", _fp8_fp4_gemm_nt_prepared, _writes_only)


def fp8_fp4_gemm_nt(a, b, d, c):
    c_is_d = c is d
    if isinstance(b, fp4_weights.PreparedFp4Weights):
        if not (isinstance(a, (tuple, list)) and len(a) == 2):
            raise TypeError("a must be an (a, sfa) pair")
        _OPS.fp8_fp4_gemm_nt_prepared.default(*a, b.data, b.n, b.folds_into_blocks, d, None if c_is_d else c, c_is_d,
                                              b.tile_scaled)
        return d
    if isinstance(b, (tuple, list)) and len(b) == 3:  # NVFP4: (codes, sfb, global_scale)
        (a, sfa), (b, sfb, global_scale) = a, b
    else:
        a, sfa, b, sfb = _split_pairs(a, b)
        global_scale = None
    _OPS.fp8_fp4_gemm_nt.default(a, sfa, b, sfb, d, None if c_is_d else c, c_is_d, global_scale)
    return d


def _m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, d, m_indices) -> None:
    fp4_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sfa), (b, sfb), d, m_indices)


_define("m_grouped_fp8_fp4_gemm_nt_contiguous(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, "
        "Tensor m_indices) -> ()", _m_grouped_fp8_fp4_gemm_nt_contiguous, _writes_only)


def m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, m_indices):
    _OPS.m_grouped_fp8_fp4_gemm_nt_contiguous.default(*_split_pairs(a, b), d, m_indices)
    return d


def _m_grouped_fp8_fp4_gemm_nt_masked(a, sfa, b, sfb, d, masked_m, expected_m) -> None:
    fp4_gemm.m_grouped_fp8_fp4_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, expected_m)


_define("m_grouped_fp8_fp4_gemm_nt_masked(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, "
        "Tensor masked_m, SymInt expected_m) -> ()", _m_grouped_fp8_fp4_gemm_nt_masked, _writes_only)


def _m_grouped_fp8_fp4_gemm_nt_masked_prepared(a, sfa, b, n, folds_into_blocks, d, masked_m, expected_m,
                                               tile_scaled=False) -> None:
    prepared = fp4_weights.PreparedFp4Weights(b, n, a.shape[-1], folds_into_blocks, tile_scaled)
    fp4_gemm.m_grouped_fp8_fp4_gemm_nt_masked((a, sfa), prepared, d, masked_m, expected_m)


_define("m_grouped_fp8_fp4_gemm_nt_masked_prepared(Tensor a, Tensor sfa, Tensor b, int n, bool folds_into_blocks, "
        "Tensor(a!) d, Tensor masked_m, SymInt expected_m, bool tile_scaled=False) -> ()",
        _m_grouped_fp8_fp4_gemm_nt_masked_prepared,
        _writes_only)


def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m):
    if isinstance(b, fp4_weights.PreparedFp4Weights):
        if not (isinstance(a, (tuple, list)) and len(a) == 2):
            raise TypeError("a must be an (a, sfa) pair")
        _OPS.m_grouped_fp8_fp4_gemm_nt_masked_prepared.default(*a, b.data, b.n, b.folds_into_blocks, d, masked_m,
                                                               expected_m, b.tile_scaled)
        return d
    _OPS.m_grouped_fp8_fp4_gemm_nt_masked.default(*_split_pairs(a, b), d, masked_m, expected_m)
    return d


def _k_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, d, ks, ks_tensor, c, c_is_d, recipe) -> None:
    k_grouped_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, None if ks is None else list(ks),
                                                    ks_tensor, d if c_is_d else c, recipe)


_define("k_grouped_fp8_gemm_nt_contiguous(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, SymInt[]? ks, "
        "Tensor ks_tensor, Tensor? c, bool c_is_d, int[] recipe) -> ()", _k_grouped_fp8_gemm_nt_contiguous,
        _writes_only)


def k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c, recipe):
    c_is_d = c is d
    _OPS.k_grouped_fp8_gemm_nt_contiguous.default(*_split_pairs(a, b), d, None if ks is None else list(ks),
                                                  ks_tensor, None if c_is_d else c, c_is_d, list(recipe))
    return d


def _k_grouped_fp8_gemm_tn_contiguous(a, sfa, b, sfb, d, ks, ks_tensor, c, c_is_d, recipe) -> None:
    k_grouped_gemm.k_grouped_fp8_gemm_tn_contiguous((a, sfa), (b, sfb), d, None if ks is None else list(ks),
                                                    ks_tensor, d if c_is_d else c, recipe)


_define("k_grouped_fp8_gemm_tn_contiguous(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, SymInt[]? ks, "
        "Tensor ks_tensor, Tensor? c, bool c_is_d, int[] recipe) -> ()", _k_grouped_fp8_gemm_tn_contiguous,
        _writes_only)


def k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks, ks_tensor, c, recipe):
    c_is_d = c is d
    _OPS.k_grouped_fp8_gemm_tn_contiguous.default(*_split_pairs(a, b), d, None if ks is None else list(ks),
                                                  ks_tensor, None if c_is_d else c, c_is_d, list(recipe))
    return d


def _k_grouped_bf16_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c, c_is_d) -> None:
    k_grouped_bf16_gemm.k_grouped_bf16_gemm_nt_contiguous(a, b, d, list(ks), ks_tensor, d if c_is_d else c)


_define("k_grouped_bf16_gemm_nt_contiguous(Tensor a, Tensor b, Tensor(a!) d, SymInt[] ks, Tensor ks_tensor, Tensor? c, "
        "bool c_is_d) -> ()", _k_grouped_bf16_gemm_nt_contiguous, _writes_only)


def k_grouped_bf16_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c):
    c_is_d = c is d
    _OPS.k_grouped_bf16_gemm_nt_contiguous.default(a, b, d, list(ks), ks_tensor, None if c_is_d else c, c_is_d)
    return d


# ---- FP8, E5M6 and FP4 casts ----

def _per_token_cast_to_fp8_fake(x, group_size, ue8m0, scale_layout, amax_clamp, scale_mode):
    m, k = x.shape
    num_groups = _groups(k, k if group_size is None else group_size)
    return cast_outputs(None, x, m, k, num_groups, parse_layout(scale_layout, ue8m0))


per_token_cast_to_fp8 = _define(
    "per_token_cast_to_fp8(Tensor x, int? group_size, bool ue8m0, str scale_layout, float amax_clamp, "
    "str scale_mode) -> (Tensor, Tensor)",
    fp8.per_token_cast_to_fp8, _per_token_cast_to_fp8_fake, "Tensor(a!) q, Tensor(b!) scales")


def _per_block_cast_to_fp8_fake(x, block_size, ue8m0, amax_clamp, scale_mode):
    m, k = x.shape
    q = x.new_empty((m, k), dtype=torch.float8_e4m3fn)
    return q, x.new_empty((_groups(m, block_size), _groups(k, block_size)), dtype=torch.float32)


per_block_cast_to_fp8 = _define(
    "per_block_cast_to_fp8(Tensor x, int block_size, bool ue8m0, float amax_clamp, str scale_mode) "
    "-> (Tensor, Tensor)",
    fp8.per_block_cast_to_fp8, _per_block_cast_to_fp8_fake, "Tensor(a!) q, Tensor(b!) scales")


def _per_token_cast_back_fake(q, scales, group_size, out_dtype):
    return q.new_empty(q.shape, dtype=out_dtype)


per_token_cast_back = _define(
    "per_token_cast_back(Tensor q, Tensor scales, int group_size, ScalarType out_dtype) -> Tensor",
    fp8.per_token_cast_back, _per_token_cast_back_fake, "Tensor(a!) y")


def _requant_per_block_to_per_token_fake(q, scales, ue8m0, scale_layout, amax_clamp, scale_mode):
    m, k = q.shape
    return cast_outputs(None, q, m, k, _groups(k, requant.BLOCK_SIZE), parse_layout(scale_layout, ue8m0))


requant_per_block_to_per_token = _define(
    "requant_per_block_to_per_token(Tensor q, Tensor scales, bool ue8m0, str scale_layout, float amax_clamp, "
    "str scale_mode) -> (Tensor, Tensor)",
    requant.requant_per_block_to_per_token, _requant_per_block_to_per_token_fake,
    "Tensor(a!) q_out, Tensor(b!) scales_out")


def _fp4_cast_fake(x, fmt: Fp4Format, scale_layout):
    m, k = x.shape
    codes = x.new_empty((m, k // 2), dtype=torch.float4_e2m1fn_x2)
    return codes, empty_fp4_scales(m, k // fmt.group_size, fmt, _parse_fp4_layout(scale_layout, fmt), x)


per_token_cast_to_mxfp4 = _define(
    "per_token_cast_to_mxfp4(Tensor x, str scale_layout, float amax_clamp, str scale_mode) -> (Tensor, Tensor)",
    fp4.per_token_cast_to_mxfp4,
    lambda x, scale_layout, amax_clamp, scale_mode: _fp4_cast_fake(x, Fp4Format.mx, scale_layout),
    "Tensor(a!) codes, Tensor(b!) scales")

per_token_cast_to_nvfp4 = _define(
    "per_token_cast_to_nvfp4(Tensor x, Tensor global_scale, str scale_layout, float amax_clamp, str scale_mode) "
    "-> (Tensor, Tensor)",
    fp4.per_token_cast_to_nvfp4,
    lambda x, global_scale, scale_layout, amax_clamp, scale_mode: _fp4_cast_fake(x, Fp4Format.nv, scale_layout),
    "Tensor(a!) codes, Tensor(b!) scales")


def _fp4_cast_back_fake(codes, out_dtype):
    return codes.new_empty((codes.shape[0], codes.shape[1] * 2), dtype=out_dtype)


mxfp4_cast_back = _define(
    "mxfp4_cast_back(Tensor codes, Tensor scales, ScalarType out_dtype) -> Tensor",
    fp4.mxfp4_cast_back, lambda codes, scales, out_dtype: _fp4_cast_back_fake(codes, out_dtype), "Tensor(a!) y")

nvfp4_cast_back = _define(
    "nvfp4_cast_back(Tensor codes, Tensor scales, Tensor global_scale, str scale_layout, ScalarType out_dtype) "
    "-> Tensor",
    fp4.nvfp4_cast_back,
    lambda codes, scales, global_scale, scale_layout, out_dtype: _fp4_cast_back_fake(codes, out_dtype),
    "Tensor(a!) y")


def _mxfp4_requant_to_fp8_fake(codes, scales, scale_layout, amax_clamp):
    m, k = codes.shape[0], codes.shape[1] * 2
    return cast_outputs(None, codes, m, k, k // fp4._REQUANT_GROUP_SIZE, parse_layout(scale_layout, True))


mxfp4_requant_to_fp8 = _define(
    "mxfp4_requant_to_fp8(Tensor codes, Tensor scales, str scale_layout, float amax_clamp) -> (Tensor, Tensor)",
    fp4.mxfp4_requant_to_fp8, _mxfp4_requant_to_fp8_fake, "Tensor(a!) q, Tensor(b!) scales_out")


def _per_token_cast_to_e5m6_fake(x, ue8m0, amax_clamp, scale_mode):
    m, k = x.shape
    return (x.new_empty((m, e5m6.packed_words(k)), dtype=torch.int32),
            x.new_empty((m,), dtype=torch.float32))


per_token_cast_to_e5m6 = _define(
    "per_token_cast_to_e5m6(Tensor x, bool ue8m0, float amax_clamp, str scale_mode) -> (Tensor, Tensor)",
    e5m6.per_token_cast_to_e5m6, _per_token_cast_to_e5m6_fake, "Tensor(a!) packed, Tensor(b!) scales")


def _per_token_cast_back_e5m6_fake(packed, scales, out_dtype):
    m, words = packed.shape
    return packed.new_empty((m, words // e5m6.WORDS_PER_GROUP * e5m6.CODES_PER_GROUP), dtype=out_dtype)


per_token_cast_back_e5m6 = _define(
    "per_token_cast_back_e5m6(Tensor packed, Tensor scales, ScalarType out_dtype) -> Tensor",
    e5m6.per_token_cast_back_e5m6, _per_token_cast_back_e5m6_fake, "Tensor(a!) y")


# ---- SwiGLU, transposes ----

def _swiglu_cast_to_fp8_fake(x, clamp, weights, pos, ue8m0, scale_layout, amax_clamp, scale_mode, check_pos):
    num_rows, hidden = x.shape[0], x.shape[1] // 2
    q = x.new_empty((num_rows, hidden), dtype=torch.float8_e4m3fn)
    return q, empty_scales(num_rows, hidden // GROUP_SIZE, parse_layout(scale_layout, ue8m0), x)


# NOTE: check_pos=True synchronizes with the host inside the op as in eager calls (and is skipped while a CUDA graph
# is being captured, as the docstrings say); the trace itself never reads pos.
swiglu_cast_to_fp8 = _define(
    "swiglu_cast_to_fp8(Tensor x, float? clamp, Tensor? weights, Tensor? pos, bool ue8m0, str scale_layout, "
    "float amax_clamp, str scale_mode, bool check_pos) -> (Tensor, Tensor)",
    swiglu.swiglu_cast_to_fp8, _swiglu_cast_to_fp8_fake, "Tensor(a!) q, Tensor(b!) scales")


def _swiglu_cast_to_fp8_masked_fake(x, masked_m, clamp, weights, pos, ue8m0, scale_layout, amax_clamp, scale_mode,
                                    check_pos):
    num_experts, max_tokens, hidden = x.shape[0], x.shape[1], x.shape[2] // 2
    q = x.new_empty((num_experts, max_tokens, hidden), dtype=torch.float8_e4m3fn)
    layout_kind = parse_layout(scale_layout, ue8m0)
    return q, empty_masked_scales(num_experts, max_tokens, hidden // GROUP_SIZE, layout_kind, x)


swiglu_cast_to_fp8_masked = _define(
    "swiglu_cast_to_fp8_masked(Tensor x, Tensor masked_m, float? clamp, Tensor? weights, Tensor? pos, bool ue8m0, "
    "str scale_layout, float amax_clamp, str scale_mode, bool check_pos) -> (Tensor, Tensor)",
    swiglu.swiglu_cast_to_fp8_masked, _swiglu_cast_to_fp8_masked_fake, "Tensor(a!) q, Tensor(b!) scales")


def _swiglu_forward_fake(x, clamp, weights, pos, check_pos):
    return x.new_empty((x.shape[0], x.shape[1] // 2))


swiglu_forward = _define(
    "swiglu_forward(Tensor x, float? clamp, Tensor? weights, Tensor? pos, bool check_pos) -> Tensor",
    swiglu.swiglu_forward, _swiglu_forward_fake, "Tensor(a!) y")


def _swiglu_backward_fake(x, dy, clamp, weights, pos, check_pos):
    return x.new_empty(x.shape), x.new_empty((x.shape[0],), dtype=torch.float32)


swiglu_backward = _define(
    "swiglu_backward(Tensor x, Tensor dy, float? clamp, Tensor? weights, Tensor? pos, bool check_pos) "
    "-> (Tensor, Tensor)",
    swiglu.swiglu_backward, _swiglu_backward_fake, "Tensor(a!) dx, Tensor(b!) dweights")


def _per_channel_cast_transpose_to_fp8_fake(x, ue8m0, scale_layout, amax_clamp, scale_mode):
    m, k = x.shape
    return cast_outputs(None, x, k, m, ceil_div(m, transpose.CHANNEL_BLOCK), parse_layout(scale_layout, ue8m0))


per_channel_cast_transpose_to_fp8 = _define(
    "per_channel_cast_transpose_to_fp8(Tensor x, bool ue8m0, str scale_layout, float amax_clamp, str scale_mode) "
    "-> (Tensor, Tensor)",
    transpose.per_channel_cast_transpose_to_fp8, _per_channel_cast_transpose_to_fp8_fake,
    "Tensor(a!) q, Tensor(b!) scales")


def _batched_transpose_fake(x):
    batches, m, n = x.shape
    return x.new_empty((batches, n, m))


batched_transpose = _define("batched_transpose(Tensor x) -> Tensor", transpose.batched_transpose,
                            _batched_transpose_fake, "Tensor(a!) y")


# ---- MoE routing: a MoeLayout travels as its fields ----

def _layout_tensors(moe_layout: MoeLayout) -> list:
    """The layout's fields in order, the masked ones only where present (an op returns no None)."""
    tensors = [getattr(moe_layout, name) for name in _LAYOUT_FIELDS]
    return [t for t in tensors if t is not None]


def _own_storage(tensors: list) -> list:
    """The tensors, each one that shares its storage with an earlier one cloned: a custom op's outputs may not alias
    each other (torch refuses it from 2.12), and the eager layout functions carve theirs from one allocation."""
    seen = set()
    owned = []
    for t in tensors:
        storage = t.untyped_storage().data_ptr()
        owned.append(t.clone() if storage in seen else t)
        seen.add(storage)
    return owned


def _topk_gate_fake(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor):
    num_tokens = logits.shape[0]
    return (logits.new_empty((num_tokens, k), dtype=torch.float32),
            logits.new_empty((num_tokens, k), dtype=torch.int32))


_GATE_SCHEMA = ("Tensor logits, int k, str scoring, Tensor? bias, int num_groups, int topk_groups, bool renormalize, "
                "float routed_scaling_factor")

topk_gate = _define(f"topk_gate({_GATE_SCHEMA}) -> (Tensor, Tensor)", gate.topk_gate, _topk_gate_fake)


def _topk_gate_backward_fake(grad_weights, logits, indices, scoring, renormalize, routed_scaling_factor):
    return logits.new_empty(logits.shape, dtype=torch.float32)


topk_gate_backward = _define(
    "topk_gate_backward(Tensor grad_weights, Tensor logits, Tensor indices, str scoring, bool renormalize, "
    "float routed_scaling_factor) -> Tensor",
    gate.topk_gate_backward, _topk_gate_backward_fake, "Tensor(a!) grad_logits")


def _map_global_to_local_experts_fake(topk_idx, num_local_experts, rank):
    return torch.empty_like(topk_idx, dtype=torch.int32)


map_global_to_local_experts = _define(
    "map_global_to_local_experts(Tensor topk_idx, int num_local_experts, int rank) -> Tensor",
    expert_parallel.map_global_to_local_experts, _map_global_to_local_experts_fake, "Tensor(a!) local_idx")


def _moe_layout(topk_idx, num_experts, max_tokens) -> list:
    return _own_storage(_layout_tensors(layout.moe_layout(topk_idx, num_experts, max_tokens)))


def _moe_layout_fake(topk_idx, num_experts, max_tokens) -> list:
    return _layout_tensors(new_layout(topk_idx, *topk_idx.shape, num_experts, max_tokens))


_define("moe_layout(Tensor topk_idx, int num_experts, SymInt? max_tokens) -> Tensor[]", _moe_layout, _moe_layout_fake)


def moe_layout(topk_idx, num_experts, max_tokens):
    return MoeLayout(*_OPS.moe_layout.default(topk_idx, num_experts, max_tokens))


def _topk_gate_with_layout(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor,
                           max_tokens) -> list:
    weights, indices, routed = routing.topk_gate_with_layout(
        logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor, max_tokens)
    return _own_storage([weights, indices, *_layout_tensors(routed)])


def _topk_gate_with_layout_fake(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor,
                                max_tokens) -> list:
    gated = _topk_gate_fake(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor)
    num_tokens, num_experts = logits.shape
    return [*gated, *_layout_tensors(new_layout(logits, num_tokens, k, num_experts, max_tokens))]


_define(f"topk_gate_with_layout({_GATE_SCHEMA}, SymInt? max_tokens) -> Tensor[]", _topk_gate_with_layout,
        _topk_gate_with_layout_fake)


# NOTE: defined apart from _define's .out overloads: the masked layout's tensors are written only with max_tokens.
_LIBRARY.define(f"topk_gate_with_layout.out({_GATE_SCHEMA}, SymInt? max_tokens, Tensor(a!) weights, Tensor(b!) indices, "
                "Tensor(c!) counts, Tensor(d!) num_rows, Tensor(e!) m_indices, Tensor(f!) row_to_slot, "
                "Tensor(g!) slot_to_row, Tensor(h!)? masked_slots, Tensor(i!)? masked_m) -> ()")
_register("topk_gate_with_layout.out",
          lambda *arguments: routing.topk_gate_with_layout(
              *arguments[:-9], out=(arguments[-9], arguments[-8], MoeLayout(*arguments[-7:]))),
          _writes_only)


def topk_gate_with_layout(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor,
                          max_tokens, out=None):
    arguments = (logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor, max_tokens)
    if out is None:
        weights, indices, *layout_tensors = _OPS.topk_gate_with_layout.default(*arguments)
        return weights, indices, MoeLayout(*layout_tensors)
    routing.check_out_form(out)
    _OPS.topk_gate_with_layout.out(*arguments, out[0], out[1], *(getattr(out[2], name) for name in _LAYOUT_FIELDS))
    return tuple(out)


def _layout_arguments(moe_layout, masked: bool) -> tuple:
    """The layout's fields as op arguments, after the checks of the eager functions (their errors, while tracing)."""
    _layout_sizes(moe_layout, masked)
    return tuple(getattr(moe_layout, name) for name in _LAYOUT_FIELDS)


def _expanded_rows(m_indices, masked_slots, masked: bool) -> tuple:
    """(shape of the expanded rows, scale batches, rows per scale batch) of a layout, as moe_expand lays them out:
    [E, max_tokens] masked, else [max_rows]."""
    if masked:
        num_experts, max_tokens = masked_slots.shape
        return (num_experts, max_tokens), num_experts, max_tokens
    return (m_indices.shape[0],), None, m_indices.shape[0]


def _moe_expand(x, counts, num_rows, m_indices, row_to_slot, slot_to_row, masked_slots, masked_m, scales, masked,
                zero_padding, out=None) -> list:
    moe_layout = MoeLayout(counts, num_rows, m_indices, row_to_slot, slot_to_row, masked_slots, masked_m)
    if out is not None:
        out = out if out[1] is not None else out[0]
    expanded = expand.moe_expand(x, moe_layout, scales, masked, zero_padding, out)
    return list(expanded) if scales is not None else [expanded]


def _moe_expand_fake(x, counts, num_rows, m_indices, row_to_slot, slot_to_row, masked_slots, masked_m, scales,
                     masked, zero_padding) -> list:
    rows_shape, batches, batch_rows = _expanded_rows(m_indices, masked_slots, masked)
    rows = x.new_empty((*rows_shape, x.shape[1]))
    if scales is None:
        return [rows]
    out_layout = ScaleLayout.packed_ue8m0 if scales.dtype == torch.int32 else ScaleLayout.mn_major
    dtype, shape, strides = expanded_scale_geometry(batches, batch_rows, x.shape[1] // expand.GROUP_SIZE, out_layout)
    return [rows, x.new_empty_strided(shape, strides, dtype=dtype)]


_MOE_EXPAND_ARGUMENTS = f"Tensor x, {_LAYOUT_SCHEMA}, Tensor? scales, bool masked, bool zero_padding"
_define(f"moe_expand({_MOE_EXPAND_ARGUMENTS}) -> Tensor[]", _moe_expand, _moe_expand_fake)
# NOTE: defined apart from _define's .out overloads: its scales are written only for FP8 x (then given).
_LIBRARY.define(f"moe_expand.out({_MOE_EXPAND_ARGUMENTS}, Tensor(a!) rows, Tensor(b!)? scales_out) -> ()")
_register("moe_expand.out", lambda *arguments: _moe_expand(*arguments[:-2], out=arguments[-2:]), _writes_only)


def moe_expand(x, moe_layout, scales, masked, zero_padding, out):
    arguments = (x, *_layout_arguments(moe_layout, masked), scales, masked, zero_padding)
    if out is None:
        expanded = _OPS.moe_expand.default(*arguments)
        return tuple(expanded) if scales is not None else expanded[0]
    written = tuple(out) if scales is not None else (out, None)
    _OPS.moe_expand.out(*arguments, *written)
    return written if scales is not None else out


def _moe_expand_cast_to_fp8(x, counts, num_rows, m_indices, row_to_slot, slot_to_row, masked_slots, masked_m, masked,
                            ue8m0, scale_layout, amax_clamp, scale_mode, zero_padding, out=None):
    moe_layout = MoeLayout(counts, num_rows, m_indices, row_to_slot, slot_to_row, masked_slots, masked_m)
    return expand.moe_expand_cast_to_fp8(x, moe_layout, masked, ue8m0, scale_layout, amax_clamp, scale_mode,
                                         zero_padding, out)


def _moe_expand_cast_to_fp8_fake(x, counts, num_rows, m_indices, row_to_slot, slot_to_row, masked_slots, masked_m,
                                 masked, ue8m0, scale_layout, amax_clamp, scale_mode, zero_padding):
    rows_shape, batches, batch_rows = _expanded_rows(m_indices, masked_slots, masked)
    q = x.new_empty((*rows_shape, x.shape[1]), dtype=torch.float8_e4m3fn)
    dtype, shape, strides = expanded_scale_geometry(batches, batch_rows, x.shape[1] // expand.GROUP_SIZE,
                                                    parse_layout(scale_layout, ue8m0))
    return q, x.new_empty_strided(shape, strides, dtype=dtype)


_moe_expand_cast_to_fp8_op = _define(
    f"moe_expand_cast_to_fp8(Tensor x, {_LAYOUT_SCHEMA}, bool masked, bool ue8m0, str scale_layout, "
    "float amax_clamp, str scale_mode, bool zero_padding) -> (Tensor, Tensor)",
    _moe_expand_cast_to_fp8, _moe_expand_cast_to_fp8_fake, "Tensor(a!) q, Tensor(b!) scales")


def moe_expand_cast_to_fp8(x, moe_layout, masked, ue8m0, scale_layout, amax_clamp, scale_mode, zero_padding, out):
    return _moe_expand_cast_to_fp8_op(x, *_layout_arguments(moe_layout, masked), masked, ue8m0, scale_layout,
                                      amax_clamp, scale_mode, zero_padding, out)


def _moe_reduce(y, counts, num_rows, m_indices, row_to_slot, slot_to_row, masked_slots, masked_m, weights, scales,
                masked, out_dtype, out=None):
    moe_layout = MoeLayout(counts, num_rows, m_indices, row_to_slot, slot_to_row, masked_slots, masked_m)
    return expand.moe_reduce(y, moe_layout, weights, scales, masked, out_dtype, out)


def _moe_reduce_fake(y, counts, num_rows, m_indices, row_to_slot, slot_to_row, masked_slots, masked_m, weights,
                     scales, masked, out_dtype):
    return y.new_empty((slot_to_row.shape[0], y.shape[-1]), dtype=out_dtype)


_moe_reduce_op = _define(
    f"moe_reduce(Tensor y, {_LAYOUT_SCHEMA}, Tensor weights, Tensor? scales, bool masked, ScalarType out_dtype) "
    "-> Tensor",
    _moe_reduce, _moe_reduce_fake, "Tensor(a!) reduced")


def moe_reduce(y, moe_layout, weights, scales, masked, out_dtype, out):
    return _moe_reduce_op(y, *_layout_arguments(moe_layout, masked), weights, scales, masked, out_dtype, out)
