"""Layers built from the package's kernels, as torch.nn modules, and their differentiable functions (functional:
the gate and SwiGLU; moe_autograd.moe_layer: the MoE layer with float master weights, for training)."""

from deep_kernels.nn import functional
from deep_kernels.nn.moe import MoE
from deep_kernels.nn.moe_autograd import moe_layer

__all__ = ["MoE", "functional", "moe_layer"]
