"""The LoRA layer (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021): a dense layer
``y = x W + b`` (``W`` of shape ``(d_in, d_out)``) with a rank-``r`` update

    y = x (W + (α/r) · A B) + b  =  x W + b + (α/r) · dropout(x) A B           A: (d_in, r),  B: (r, d_out)

Where the branch scale of a block is folded into its output layer (``layers.common.linear``:
``s ⊙ (x W + b) = x (W diag s) + s ⊙ b``), the adapter folds the same way: ``s ⊙ (α/r) x A B = (α/r) x A (B diag s)``.
``B``'s columns follow the kernel's column layout, so on the fused ``qkv`` kernel (heads-major, see
``layers.attention``) they are heads-major too, and a ``tensor``-axis split gives each device whole heads of both.

Only the layer lives here, with what a block needs to run it (``dropout_rng``) and what reading a model's adapters
needs (``adapted_layers``, ``is_adapter_path``). Adding adapters to a model, merging, freezing, adapter files, the
``config.lora`` section and parameter counts are fine-tuning: ``layerscale_jax.lora``.
"""
from __future__ import annotations

import contextlib
import contextvars
import re
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

ADAPTER_NAMES = ("lora_a", "lora_b")
_DROPOUT_STREAM = 0x10A4
_DROPOUT_KEY: contextvars.ContextVar = contextvars.ContextVar("lora_dropout_key", default=None)


@contextlib.contextmanager
def dropout_rng(key: jax.Array | None):
    """Within this context (a block's forward pass in train mode), adapters draw their dropout masks from ``key``
    (folded with each adapter's site id). ``key=None`` (evaluation): no dropout."""
    token = _DROPOUT_KEY.set(key)              # folded only where an adapter with dropout uses it
    try:
        yield
    finally:
        _DROPOUT_KEY.reset(token)


class LoRALinear(nnx.Linear):
    """An ``nnx.Linear`` with a low-rank adapter: ``x W + b + (α/r) dropout(x) A B`` (see the module docstring).

    Made from an existing layer by ``layerscale_jax.lora.add_adapters`` (the layer's own kernel and bias Variables
    are kept, so the parameter paths of the base are unchanged and its weights are not copied); adds ``lora_a``,
    ``lora_b`` and the attributes ``lora_rank``, ``lora_alpha``, ``lora_scale`` (α/r), ``lora_dropout``,
    ``lora_site`` (the dropout stream's id), ``lora_active`` (per stacked layer) and ``lora_merged``.
    """

    def adapter_delta(self, x: jnp.ndarray, out_scale: jnp.ndarray | None = None) -> jnp.ndarray:
        """``(α/r) dropout(x) A (B diag s)`` for inputs ``x`` ``(..., d_in)`` (``s = 1`` without ``out_scale``)."""
        if self.lora_merged:
            return jnp.zeros(x.shape[:-1] + (self.out_features,), self.dtype or x.dtype)
        dtype = self.dtype if self.dtype is not None else x.dtype
        key = _DROPOUT_KEY.get()
        if key is not None and self.lora_dropout > 0:
            key = jax.random.fold_in(jax.random.fold_in(key, _DROPOUT_STREAM), self.lora_site)
            keep = jax.random.bernoulli(key, 1.0 - self.lora_dropout, x.shape)
            x = jnp.where(keep, x / (1.0 - self.lora_dropout), 0.0).astype(x.dtype)
        b = self.lora_b[...].astype(jnp.float32) * self.lora_scale
        if out_scale is not None:
            b = b * out_scale
        h = jnp.matmul(x.astype(dtype), self.lora_a[...].astype(dtype), precision=self.precision)
        return jnp.matmul(h, b.astype(dtype), precision=self.precision)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        y = super().__call__(x)
        return y if self.lora_merged else y + self.adapter_delta(x).astype(y.dtype)


def is_adapter_path(path: Sequence) -> bool:
    """Whether a parameter path (tuple or '/'- or '.'-joined) names a LoRA adapter (``lora_a`` / ``lora_b``)."""
    last = path[-1] if not isinstance(path, str) else re.split(r"[/.]", path)[-1]
    return last in ADAPTER_NAMES


def linear_layers(model: nnx.Module) -> list[tuple[tuple, nnx.Linear]]:
    """``(module path, layer)`` of every dense layer (``nnx.Linear``, adapted or not) in ``model``."""
    return [(tuple(path), node) for path, node in nnx.iter_graph(model)
            if isinstance(node, nnx.Linear) and path]


def adapted_layers(model: nnx.Module) -> list[tuple[tuple, LoRALinear]]:
    """``(module path, layer)`` of every ``LoRALinear`` in ``model``, in graph order."""
    return [(path, layer) for path, layer in linear_layers(model) if isinstance(layer, LoRALinear)]
