"""Model registry: ``create_model(name, **overrides)`` with timm's names and parameter counts.

The names, their defaults and the architecture configs are ``layerscale_jax.arch`` (no jax); here each config
family is mapped to the ``nnx`` module that builds it.
"""
from __future__ import annotations

from flax import nnx

from layerscale_jax.arch import CaiTConfig, MAEConfig, ViTConfig, model_config
from layerscale_jax.models.cait import CaiT
from layerscale_jax.models.mae import MaskedAutoencoder
from layerscale_jax.models.vit import VisionTransformer

MODEL_CLASSES = {ViTConfig: VisionTransformer, CaiTConfig: CaiT, MAEConfig: MaskedAutoencoder}


def create_model(name: str, *, rngs: nnx.Rngs | None = None, **overrides) -> nnx.Module:
    """Build a registered model, e.g. ``create_model("deit3_small_patch16_224", depth=96, embed_dim=192)``.

    Overrides use timm's vocabulary (see ``ArchConfig``): depth, embed_dim, num_heads, mlp_ratio, patch_size,
    img_size, in_chans, num_classes, branch_scaling, init_values, drop_path_rate, drop_path_rule, dtype,
    param_dtype, scan_layers, remat, ...
    """
    return create_from_config(model_config(name, **overrides), rngs=rngs)


def create_from_config(cfg, *, rngs: nnx.Rngs | None = None) -> nnx.Module:
    """Build a model from an architecture config (``model_config(...)``, ``model.cfg`` of another model, possibly
    ``replace``d, or the model section of a validated experiment config); the config was checked when it was made."""
    return MODEL_CLASSES[type(cfg)](cfg, rngs=rngs if rngs is not None else nnx.Rngs(0))
