"""Plain-torch references of the layers in deep_kernels.nn, one module per module."""

from deep_kernels.reference.nn.moe import kept_slots, moe_forward, router_logits

__all__ = ["kept_slots", "moe_forward", "router_logits"]
