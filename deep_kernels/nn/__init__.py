"""Layers built from the package's kernels, as torch.nn modules."""

from deep_kernels.nn.moe import MoE

__all__ = ["MoE"]
