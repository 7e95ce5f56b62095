"""What every model family shares: its architecture options, their validation, and the input check."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from layerscale_jax.errors import ConfigError
from layerscale_jax.layers.drop_path import DROP_PATH_RULES
from layerscale_jax.layers.partitioning import constrain
from layerscale_jax.layers.scaling import validate_branch_scaling
from layerscale_jax.models.stack import validate_remat

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def canonical_dtype(field: str, value: Any):
    """Accept ``"bfloat16"`` or ``jnp.bfloat16``; return the jnp dtype."""
    if isinstance(value, str):
        if value not in DTYPES:
            raise ConfigError(f"{field}={value!r} is not one of {tuple(DTYPES)}")
        return DTYPES[value]
    name = jnp.dtype(value).name
    if name not in DTYPES:
        raise ConfigError(f"{field}={value!r} is not one of {tuple(DTYPES)}")
    return DTYPES[name]


@dataclasses.dataclass(frozen=True)
class ArchConfig:
    """Architecture options shared by every family (timm's constructor vocabulary).

    img_size, patch_size, in_chans: input geometry (NHWC images of ``img_size × img_size × in_chans``).
    num_classes: classifier outputs. embed_dim, depth, num_heads, mlp_ratio, qkv_bias: the transformer.
    branch_scaling: ``none | layerscale | scalar | rezero | skipinit`` (see ``layers.scaling``).
    init_values: ε for ``layerscale``/``scalar`` (a float, or ``"auto"`` for the CaiT depth rule).
    drop_path_rate, drop_path_rule: stochastic depth, ``linear`` (0 → rate over depth) or ``constant``.
    norm_eps: LayerNorm epsilon. dtype: compute dtype. param_dtype: parameter dtype (LayerScale is always float32).
    scan_layers: stack the blocks and scan over them. remat: rematerialisation policy name.
    """
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    branch_scaling: str = "layerscale"
    init_values: float | str = 1e-6
    drop_path_rate: float = 0.0
    drop_path_rule: str = "linear"
    norm_eps: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    scan_layers: bool = False
    remat: str = "none"

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype("dtype", self.dtype))
        object.__setattr__(self, "param_dtype", canonical_dtype("param_dtype", self.param_dtype))
        if isinstance(self.init_values, (int, float)):
            object.__setattr__(self, "init_values", float(self.init_values))
        self.validate()

    def validate(self) -> None:
        def positive_int(field):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{field}={value!r} must be a positive integer")

        for field in ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads"):
            positive_int(field)
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}")
        if self.img_size % self.patch_size:
            raise ConfigError(f"img_size={self.img_size} is not divisible by patch_size={self.patch_size}")
        if not self.mlp_ratio > 0:
            raise ConfigError(f"mlp_ratio={self.mlp_ratio!r} must be positive")
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ConfigError(f"drop_path_rate={self.drop_path_rate!r} must lie in [0, 1)")
        if self.drop_path_rule not in DROP_PATH_RULES:
            raise ConfigError(f"drop_path_rule={self.drop_path_rule!r} is not one of {DROP_PATH_RULES}")
        if not self.norm_eps > 0:
            raise ConfigError(f"norm_eps={self.norm_eps!r} must be positive")
        validate_branch_scaling(self.branch_scaling, self.init_values)
        validate_remat(self.remat)

    @property
    def grid_size(self) -> int:
        return self.img_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size ** 2


def check_images(images: jnp.ndarray, cfg: ArchConfig, model_name: str) -> None:
    expected = (cfg.img_size, cfg.img_size, cfg.in_chans)
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
        raise ConfigError(
            f"{model_name} expects NHWC images of shape (batch, {expected[0]}, {expected[1]}, {expected[2]}), "
            f"got {tuple(images.shape)}")
    if not jnp.issubdtype(images.dtype, jnp.floating):
        raise ConfigError(f"{model_name} expects float images, got dtype {images.dtype}")


def embed_patches(model: nnx.Module, images: jnp.ndarray) -> jnp.ndarray:
    """Checked NHWC images → patch tokens plus the position embedding, float32 ``(batch, num_patches, dim)``."""
    cfg = model.cfg
    check_images(images, cfg, type(model).__name__)
    images = constrain(images.astype(cfg.dtype), ("batch", None, None, None))
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
