"""What every model family shares: the dtypes of its architecture config (``layerscale_jax.arch.ArchConfig``,
re-exported here), the input check, the patch and class-token embeddings, and the one-line repr."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from layerscale_jax.arch import DTYPE_NAMES, ArchConfig
from layerscale_jax.errors import ConfigError
from layerscale_jax.layers.partitioning import constrain

# The models' dtype names (``ArchConfig.dtype``, ``param_dtype``) as jnp dtypes.
DTYPES = {name: getattr(jnp, name) for name in DTYPE_NAMES}


def compute_dtypes(cfg: ArchConfig) -> tuple:
    """``(dtype, param_dtype)`` of ``cfg`` as jnp dtypes."""
    return DTYPES[cfg.dtype], DTYPES[cfg.param_dtype]


def input_shape(cfg: ArchConfig) -> tuple[int, ...]:
    """One example's shape: ``(H, W, C)`` images, or ``(length, C)`` signals (``patch_dims=1``)."""
    return (cfg.img_size,) * getattr(cfg, "patch_dims", 2) + (cfg.in_chans,)


def check_images(images: jnp.ndarray, cfg: ArchConfig, model_name: str) -> None:
    expected = input_shape(cfg)
    if tuple(images.shape[1:]) != expected:
        kind = "NHWC images" if len(expected) == 3 else "signals"
        raise ConfigError(f"{model_name} expects {kind} of shape (batch, {', '.join(map(str, expected))}), "
                          f"got {tuple(images.shape)}")
    if not jnp.issubdtype(images.dtype, jnp.floating):
        raise ConfigError(f"{model_name} expects float images, got dtype {images.dtype}")


def embed_patches(model: nnx.Module, images: jnp.ndarray) -> jnp.ndarray:
    """Checked NHWC images (or signals) → patch tokens plus the position embedding, float32
    ``(batch, num_patches, dim)``."""
    cfg = model.cfg
    check_images(images, cfg, type(model).__name__)
    images = constrain(images.astype(DTYPES[cfg.dtype]), ("batch",) + (None,) * (images.ndim - 1))
    x = constrain(model.patch_embed(images).astype(jnp.float32), ("batch", None, None))
    return x + model.pos_embed[...].astype(jnp.float32)


def class_tokens(model: nnx.Module, batch: int) -> jnp.ndarray:
    """The learned class token for every sample, float32 ``(batch, 1, dim)``."""
    tokens = jnp.broadcast_to(model.cls_token[...].astype(jnp.float32), (batch, 1, model.cfg.embed_dim))
    return constrain(tokens, ("batch", None, None))


SUMMARY_FIELDS = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "num_classes", "branch_scaling")


def one_line_repr(model: nnx.Module) -> str:
    """A model's repr: its class, main architecture fields and parameter count on one line (nnx's repr lists every
    layer and array: a notebook cell echoing a ViT printed ~1,100 lines). ``nnx.display(model)`` shows the tree."""
    cfg = model.cfg
    fields = ", ".join(f"{name}={getattr(cfg, name)!r}" for name in SUMMARY_FIELDS if hasattr(cfg, name))
    count = sum(math.prod(getattr(leaf, "shape", ())) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return f"{type(model).__name__}({fields}; {count:,} parameters; nnx.display(model) shows every layer)"
