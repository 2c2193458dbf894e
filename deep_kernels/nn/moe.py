"""A DeepSeek-V3 mixture-of-experts layer on the package's kernels, forward pass: the routed experts (the shared
expert is a dense MLP, outside this module).

forward(x [T, H] bf16) -> [T, H] bf16, with gate_up = (gate_up_weight, gate_up_scales), down = (down_weight,
down_scales) as the grouped GEMMs take b and sfb:
    logits = torch.mm(x, router_weight.t(), out_dtype=torch.float32)                       FP32 [T, E]
    weights, _, layout = topk_gate_with_layout(logits, k, scoring, correction_bias, num_groups, topk_groups,
                                               renormalize, routed_scaling_factor, max_tokens=C or None)
    contiguous (prefill, training): R = contiguous_max_rows(T * k, E) rows, expert segments padded to 128
        a = moe_expand_cast_to_fp8(x, layout)                  (e4m3 [R, H], FP32 [R, H / 128] MN-major)
        m_grouped_fp8_gemm_nt_contiguous(a, gate_up, h, layout.m_indices)                  h bf16 [R, 2I]
        y = swiglu_cast_to_fp8(h, weights=weights, pos=layout.row_to_slot)      (e4m3 [R, I], MN-major)
        m_grouped_fp8_gemm_nt_contiguous(y, down, o, layout.m_indices)                     o bf16 [R, H]
    masked (decode): capacity C = max_tokens per expert (default T rounded up to a multiple of 4: no slot dropped);
    shapes fixed by T and C
        a = moe_expand_cast_to_fp8(x, layout, masked=True)     (e4m3 [E, C, H], FP32 [E, C, H / 128])
        m_grouped_fp8_gemm_nt_masked(a, gate_up, h, layout.masked_m, expected_m)           h bf16 [E, C, 2I]
        y = swiglu_cast_to_fp8_masked(h, layout.masked_m, weights=weights, pos=layout.masked_slots)
        m_grouped_fp8_gemm_nt_masked(y, down, o, layout.masked_m, expected_m)              o bf16 [E, C, H]
    out = moe_reduce(o, layout, ones [T, k], masked=...)       each token's rows summed in FP32, then bf16
h = [gate | up]: gate_up_weight's rows [0, I) are the gate projection, [I, 2I) the up projection.

The routing weight is applied once, in the SwiGLU cast (y = silu(gate) * up * w before its FP8 cast: the per-token
scale absorbs it, and the training backward's swiglu_backward returns that weight's gradient); the reduce then
adds the rows with weight one.

Rows no slot takes (padding of the contiguous segments, masked rows from masked_m on, contiguous rows from
layout.num_rows on) are never initialized: the grouped GEMMs never write such rows of their output and a GEMM row
depends on its own input row only, the SwiGLU cast skips them (position -1, or past masked_m), and the reduce
reads the slots' rows only. So the expand runs with zero_padding=False (in masked mode the padding is most of
the E x C rows).

No host synchronization in either mode (the layouts are sized for the worst case, positions are not checked
on the host: moe_layout wrote them); masked mode also has shapes that depend on T and max_tokens only, so the
whole forward can be captured in a CUDA graph and replayed with new tokens. Deterministic.
"""

import torch

from deep_kernels.moe.gate import MAX_EXPERTS, MAX_GROUPS, MAX_TOP_K, SCORINGS
from deep_kernels.nn.expert_parallel import exchanging_group, expert_parallel_forward
from deep_kernels.nn.moe_autograd import moe_layer
from deep_kernels.nn.routed_experts import KERNELS, moe_forward
from deep_kernels.quant.fp8 import per_block_cast_to_fp8
from deep_kernels.validation import (
    INT32_LIMIT, check_bool, check_cuda_device, check_dtype, check_fp32_number, check_int_range, check_rank,
    check_row_major_rows, is_traced,
)

MODES = ("contiguous", "masked")
# The weights' scale blocks, and the group of the activations' scales (the FP8 GEMMs' recipe).
BLOCK = 128
FLOAT_DTYPES = (torch.bfloat16, torch.float32)


def _check_config(hidden_size, intermediate_size, num_experts, top_k, num_groups, topk_groups, scoring, renormalize,
                  routed_scaling_factor, mode, max_tokens) -> None:
    for value, name in ((hidden_size, "hidden_size"), (intermediate_size, "intermediate_size")):
        check_int_range(value, name, BLOCK, INT32_LIMIT)
        if value % BLOCK != 0:
            raise ValueError(f"{name} must be a multiple of {BLOCK} (the FP8 casts' groups and the weights' scale "
                             f"blocks), got {value}")
    check_int_range(num_experts, "num_experts", 1, MAX_EXPERTS)
    check_int_range(top_k, "top_k", 1, min(MAX_TOP_K, num_experts))
    check_int_range(num_groups, "num_groups", 0, MAX_GROUPS)
    if num_groups == 0:
        if topk_groups != 0:
            raise ValueError(f"topk_groups must be 0 without groups (num_groups=0), got {topk_groups!r}")
    else:
        if num_experts % num_groups != 0 or num_experts // num_groups < 2:
            raise ValueError(f"num_groups ({num_groups}) must divide the {num_experts} experts into groups of at "
                             f"least 2")
        check_int_range(topk_groups, "topk_groups", 1, num_groups)
        if top_k > topk_groups * (num_experts // num_groups):
            raise ValueError(f"top_k ({top_k}) must not exceed the {topk_groups * (num_experts // num_groups)} "
                             f"experts of the topk_groups={topk_groups} groups")
    if not isinstance(scoring, str) or scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {list(SCORINGS)}, got {scoring!r}")
    check_bool(renormalize, "renormalize")
    check_fp32_number(routed_scaling_factor, "routed_scaling_factor")
    _check_mode(mode)
    if max_tokens is not None:
        check_int_range(max_tokens, "max_tokens", 1, INT32_LIMIT // num_experts)


def _check_mode(mode) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")


def _check_shape(t, name: str, shape: tuple) -> None:
    check_rank(t, name, len(shape))
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


def _quantize_experts(weight: torch.Tensor) -> tuple:
    """[E, N, K] float weights (N, K multiples of 128) to (e4m3 [E, N, K], FP32 scales [E, N / 128, K / 128]),
    the grouped GEMMs' b and sfb: one per_block_cast_to_fp8 launch over the E * N rows, whose 128-row blocks
    each lie within one expert."""
    num_experts, n, k = weight.shape
    q, scales = per_block_cast_to_fp8(weight.contiguous().view(num_experts * n, k))
    return q.view(num_experts, n, k), scales.view(num_experts, n // BLOCK, k // BLOCK)


class MoE(torch.nn.Module):
    """The routed experts of a DeepSeek-V3 MoE layer with FP8 expert weights (the module docstring).

    Args:
        hidden_size: H, a multiple of 128 (DeepSeek-V3: 7168).
        intermediate_size: I, each expert's intermediate size, a multiple of 128 (2048).
        num_experts: E, at most 512 (256).
        top_k: experts per token (8).
        num_groups, topk_groups: the group limit (8 groups, the best 4 eligible); 0 and 0 for none.
        scoring: "sigmoid" (DeepSeek-V3), "softmax" or "sqrtsoftplus", as topk_gate.
        renormalize: divide each token's k weights by their sum (True).
        routed_scaling_factor: multiplies the weights (2.5).
        mode: "contiguous" (prefill, training) or "masked" (decode); forward's `mode` overrides it per call.
        max_tokens: the masked mode's capacity per expert: an expert keeps its first max_tokens slots (in slot
            order t * k + j) and the others are dropped, adding nothing. None: T rounded up to a multiple of 4, so
            none is dropped. Memory of the masked buffers grows as E x capacity.
        device: where the buffers are made (zeros); from_float quantizes given weights instead.
        process_group: a torch.distributed group of W ranks for expert parallelism (nn/expert_parallel.py): this
            rank holds experts [r * E / W, (r + 1) * E / W) (E a multiple of W) and routes the tokens it is given.
            None: one GPU, every expert; a group of one rank runs as None does (the same bits, no exchange).

    Buffers (as the kernels read them; state_dict holds them):
        router_weight bf16 [E, H]; correction_bias FP32 [E] (added to the scores for selection only);
        gate_up_weight e4m3 [n, 2I, H] and gate_up_scales FP32 [n, 2I / 128, H / 128]; down_weight e4m3 [n, H, I]
        and down_scales FP32 [n, H / 128, I / 128]: one scale per 128 x 128 block (per_block_cast_to_fp8's); n = E,
        or E / W with a process group (this rank's experts).

    Notes:
        An x that requires a gradient (with grad enabled) runs deep_kernels.nn.moe_autograd.moe_layer: differentiable
        in x, contiguous layout only (the masked one refuses it), with a process group too (through its exchanges:
        nn/expert_parallel_autograd.py); the FP8 experts and the router are buffers and get no gradient (train
        master weights with moe_layer itself). With a process group of two or more ranks the contiguous forward takes
        that path whenever grad is enabled, so that every rank makes the same exchanges: run inference under
        torch.no_grad() (or inference_mode), on every rank alike. Moving the module to another dtype
        (module.to(torch.bfloat16)) would cast the FP8 weights and FP32 scales: forward then raises, naming the
        buffer.
    """

    def __init__(self, hidden_size: int = 7168, intermediate_size: int = 2048, num_experts: int = 256, top_k: int = 8,
                 num_groups: int = 8, topk_groups: int = 4, scoring: str = "sigmoid", renormalize: bool = True,
                 routed_scaling_factor: float = 2.5, mode: str = "contiguous", max_tokens: int = None, device=None,
                 process_group=None):
        super().__init__()
        _check_config(hidden_size, intermediate_size, num_experts, top_k, num_groups, topk_groups, scoring,
                      renormalize, routed_scaling_factor, mode, max_tokens)
        self.process_group = process_group
        self.num_local_experts, self.first_expert = num_experts, 0
        if process_group is not None:
            world, rank = torch.distributed.get_world_size(process_group), torch.distributed.get_rank(process_group)
            if num_experts % world != 0:
                raise ValueError(f"num_experts ({num_experts}) must be a multiple of the process group's {world} ranks")
            self.num_local_experts = num_experts // world
            self.first_expert = rank * self.num_local_experts
        self.hidden_size, self.intermediate_size, self.num_experts = hidden_size, intermediate_size, num_experts
        self.top_k, self.num_groups, self.topk_groups = top_k, num_groups, topk_groups
        self.scoring, self.renormalize, self.routed_scaling_factor = scoring, renormalize, routed_scaling_factor
        self.mode, self.max_tokens = mode, max_tokens
        for name, (shape, dtype) in self._buffer_specs().items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtype, device=device))

    def _buffer_specs(self) -> dict:
        """Each buffer's (shape, dtype)."""
        e, n, h, i = self.num_experts, self.num_local_experts, self.hidden_size, self.intermediate_size
        return {
            "router_weight": ((e, h), torch.bfloat16),
            "correction_bias": ((e,), torch.float32),
            "gate_up_weight": ((n, 2 * i, h), torch.float8_e4m3fn),
            "gate_up_scales": ((n, 2 * i // BLOCK, h // BLOCK), torch.float32),
            "down_weight": ((n, h, i), torch.float8_e4m3fn),
            "down_scales": ((n, h // BLOCK, i // BLOCK), torch.float32),
        }

    @classmethod
    def from_float(cls, router_weight: torch.Tensor, correction_bias: torch.Tensor, gate_up_weight: torch.Tensor,
                   down_weight: torch.Tensor, **config) -> "MoE":
        """The layer of these float weights, its expert weights quantized once (per_block_cast_to_fp8).

        Args:
            router_weight: [E, H] bfloat16 or float32 CUDA tensor (kept as bf16, the router GEMM's operand).
            correction_bias: [E] bfloat16 or float32 (kept as FP32).
            gate_up_weight: [E, 2I, H] bfloat16 or float32: rows [0, I) each expert's gate projection, [I, 2I)
                its up projection (a checkpoint's gate_proj and up_proj concatenated along dimension 1).
            down_weight: [E, H, I] bfloat16 or float32.
            config: the constructor's other arguments (top_k, num_groups, ..., mode, max_tokens); E, H and I
                come from the weights.

        Returns:
            MoE on the weights' device.
        """
        named = ((router_weight, "router_weight", 2), (correction_bias, "correction_bias", 1),
                 (gate_up_weight, "gate_up_weight", 3), (down_weight, "down_weight", 3))
        for t, name, rank in named:
            check_dtype(t, name, FLOAT_DTYPES)
            check_rank(t, name, rank)
        num_experts, two_intermediate, hidden = gate_up_weight.shape
        if two_intermediate % 2 != 0:
            raise ValueError(f"gate_up_weight must be [E, 2I, H] (gate and up rows), got shape "
                             f"{tuple(gate_up_weight.shape)}")
        module = cls(hidden, two_intermediate // 2, num_experts, **config, device="meta")
        # A process group's rank keeps its own experts of the E given.
        experts = slice(module.first_expert, module.first_expert + module.num_local_experts)
        gate_up_weight, down_weight = gate_up_weight[experts], down_weight[experts]
        named = named[:2] + ((gate_up_weight, "gate_up_weight", 3), (down_weight, "down_weight", 3))
        specs = module._buffer_specs()
        for t, name, _ in named:
            _check_shape(t, name, specs[name][0])
        check_cuda_device(gate_up_weight, "gate_up_weight")
        for t, name, _ in named:
            check_cuda_device(t, name, like=gate_up_weight)
        module.router_weight = router_weight.to(torch.bfloat16).contiguous()
        module.correction_bias = correction_bias.to(torch.float32).contiguous()
        module.gate_up_weight, module.gate_up_scales = _quantize_experts(gate_up_weight)
        module.down_weight, module.down_scales = _quantize_experts(down_weight)
        return module

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, num_groups={self.num_groups}, "
                f"topk_groups={self.topk_groups}, scoring={self.scoring!r}, renormalize={self.renormalize}, "
                f"routed_scaling_factor={self.routed_scaling_factor}, mode={self.mode!r}, max_tokens={self.max_tokens}")

    def _check_buffers(self) -> None:
        for name, (shape, dtype) in self._buffer_specs().items():
            t = getattr(self, name)
            check_dtype(t, name, (dtype,))
            _check_shape(t, name, shape)
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")

    def _check_input(self, x, mode) -> None:
        # NOTE: while dynamo or torch.export traces the forward, x's address and the devices are left to the kernels'
        # ops, which check them when the graph runs (a data pointer cannot be traced).
        traced = is_traced()
        _check_mode(mode)
        check_dtype(x, "x", (torch.bfloat16,))
        check_rank(x, "x", 2)
        if x.shape[1] != self.hidden_size:
            raise ValueError(f"x must be [T, hidden_size] = [T, {self.hidden_size}], got shape {tuple(x.shape)}")
        if not traced:
            check_row_major_rows(x, "x")
        if x.requires_grad and torch.is_grad_enabled() and mode != "contiguous":
            raise ValueError("x requires a gradient: the backward pass takes the contiguous layout "
                             "(mode='contiguous'), or run the masked one under torch.no_grad()")
        self._check_buffers()
        if traced:
            return
        check_cuda_device(x, "x")
        for name in self._buffer_specs():
            check_cuda_device(getattr(self, name), name, like=x)

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """FP32 [T, E] = x @ router_weight^T: torch's bf16 GEMM with an FP32 output (no rounding to bf16)."""
        return torch.mm(x, self.router_weight.t(), out_dtype=torch.float32)

    def forward(self, x: torch.Tensor, mode: str = None) -> torch.Tensor:
        """The layer's output (the module docstring).

        Args:
            x: [T, H] bfloat16 CUDA tensor, rows contiguous and 16-byte aligned.
            mode: "contiguous" or "masked"; None: self.mode.

        Returns:
            [T, H] bfloat16, contiguous.
        """
        mode = self.mode if mode is None else mode
        self._check_input(x, mode)
        # Every rank of a process group makes the same exchanges, with or without tokens: with one, the path follows
        # the grad mode alone, which the ranks share (x.requires_grad may differ, on an empty batch say).
        grad = torch.is_grad_enabled() and mode == "contiguous"
        group = exchanging_group(self.process_group)
        if grad and (group is not None or (x.requires_grad and x.shape[0] > 0)):
            # Differentiable in x (the FP8 experts and the router are buffers: no gradient of their own); training
            # master weights: deep_kernels.nn.moe_autograd.moe_layer.
            return moe_layer(x, self.router_weight, self.correction_bias, None, None, self.top_k, self.num_groups,
                             self.topk_groups, self.scoring, self.renormalize, self.routed_scaling_factor,
                             gate_up=(self.gate_up_weight, self.gate_up_scales),
                             down=(self.down_weight, self.down_scales), process_group=group)
        if group is not None:
            return expert_parallel_forward(x, self.router_logits(x), self.gate_config(), self.experts(), mode,
                                           self.max_tokens, group)
        if x.shape[0] == 0:
            return x.new_empty((0, self.hidden_size))
        return moe_forward(KERNELS, x, self.router_logits(x), self.gate_config(), self.experts(), mode,
                           self.max_tokens)

    def gate_config(self) -> tuple:
        """topk_gate's arguments after the logits: (k, scoring, bias, num_groups, topk_groups, renormalize,
        routed_scaling_factor)."""
        return (self.top_k, self.scoring, self.correction_bias, self.num_groups, self.topk_groups, self.renormalize,
                self.routed_scaling_factor)

    def experts(self) -> tuple:
        """((gate_up_weight, gate_up_scales), (down_weight, down_scales)): this rank's experts, as the grouped
        GEMMs take b and sfb."""
        return (self.gate_up_weight, self.gate_up_scales), (self.down_weight, self.down_scales)
