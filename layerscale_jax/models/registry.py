"""Model registry: ``create_model(name, **overrides)`` with timm's names and parameter counts."""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable

from flax import nnx

from layerscale_jax.errors import ConfigError
from layerscale_jax.models.cait import CaiT, CaiTConfig
from layerscale_jax.models.mae import MAEConfig, MaskedAutoencoder
from layerscale_jax.models.vit import VisionTransformer, ViTConfig


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str
    model_cls: Callable
    config_cls: type
    defaults: dict[str, Any]

    def make_config(self, overrides: dict[str, Any]):
        valid = {f.name for f in dataclasses.fields(self.config_cls)}
        unknown = sorted(set(overrides) - valid)
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown} for model {self.name!r}; valid options: {sorted(valid)}")
        return self.config_cls(**{**self.defaults, **overrides})


_REGISTRY: dict[str, ModelEntry] = {}


def register(name: str, model_cls, config_cls, **defaults) -> None:
    _REGISTRY[name] = ModelEntry(name, model_cls, config_cls, defaults)


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def get_entry(name: str) -> ModelEntry:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=5, cutoff=0.4)
        hint = f"; closest registered names: {close}" if close else f"; registered: {list_models()}"
        raise ConfigError(f"unknown model name {name!r}{hint}")
    return _REGISTRY[name]


def model_config(name: str, **overrides):
    """The architecture config ``create_model(name, **overrides)`` would build (validated, nothing allocated)."""
    return get_entry(name).make_config(overrides)


def create_model(name: str, *, rngs: nnx.Rngs | None = None, **overrides) -> nnx.Module:
    """Build a registered model, e.g. ``create_model("deit3_small_patch16_224", depth=96, embed_dim=192)``.

    Overrides use timm's vocabulary (see ``ArchConfig``): depth, embed_dim, num_heads, mlp_ratio, patch_size,
    img_size, in_chans, num_classes, branch_scaling, init_values, drop_path_rate, drop_path_rule, dtype,
    param_dtype, scan_layers, remat, ...
    """
    entry = get_entry(name)
    cfg = entry.make_config(overrides)
    return entry.model_cls(cfg, rngs=rngs if rngs is not None else nnx.Rngs(0))


def create_from_config(cfg, *, rngs: nnx.Rngs | None = None) -> nnx.Module:
    """Build a model from an architecture config (``model.cfg`` of another model, possibly ``replace``d)."""
    model_cls = {ViTConfig: VisionTransformer, CaiTConfig: CaiT, MAEConfig: MaskedAutoencoder}[type(cfg)]
    return model_cls(cfg, rngs=rngs if rngs is not None else nnx.Rngs(0))


# DeiT III (timm's deit3_*): LayerScale init 1e-6 as in timm, qkv bias, LayerNorm eps 1e-6, linear drop-path rule.
_DEIT3 = {
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "medium": dict(embed_dim=512, depth=12, num_heads=8),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
    "huge": dict(embed_dim=1280, depth=32, num_heads=16),
}
for _size, _patch, _img in [("small", 16, 224), ("small", 16, 384), ("medium", 16, 224), ("base", 16, 224),
                            ("base", 16, 384), ("large", 16, 224), ("large", 16, 384), ("huge", 14, 224)]:
    register(f"deit3_{_size}_patch{_patch}_{_img}", VisionTransformer, ViTConfig, patch_size=_patch, img_size=_img,
             init_values=1e-6, **_DEIT3[_size])

# CaiT (timm's cait_*): the official per-model LayerScale init (xxs36 does not follow the depth rule).
_CAIT = {
    "xxs24": dict(embed_dim=192, depth=24, num_heads=4, init_values=1e-5),
    "xxs36": dict(embed_dim=192, depth=36, num_heads=4, init_values=1e-5),
    "xs24": dict(embed_dim=288, depth=24, num_heads=6, init_values=1e-5),
    "s24": dict(embed_dim=384, depth=24, num_heads=8, init_values=1e-5),
    "s36": dict(embed_dim=384, depth=36, num_heads=8, init_values=1e-6),
    "m36": dict(embed_dim=768, depth=36, num_heads=16, init_values=1e-6),
    "m48": dict(embed_dim=768, depth=48, num_heads=16, init_values=1e-6),
}
for _size, _img in [("xxs24", 224), ("xxs24", 384), ("xxs36", 224), ("xxs36", 384), ("xs24", 384), ("s24", 224),
                    ("s24", 384), ("s36", 384), ("m36", 384), ("m48", 448)]:
    register(f"cait_{_size}_{_img}", CaiT, CaiTConfig, patch_size=16, img_size=_img, **_CAIT[_size])

# MAE pre-training (He et al. 2021) of a DeiT III encoder: MAE's decoder (512 wide, 8 blocks, 16 heads) for B/L/H.
for _size, _patch in [("small", 16), ("base", 16), ("large", 16), ("huge", 14)]:
    register(f"mae_deit3_{_size}_patch{_patch}_224", MaskedAutoencoder, MAEConfig, patch_size=_patch, img_size=224,
             init_values=1e-6, decoder_embed_dim=512, decoder_depth=8, decoder_num_heads=16, mask_ratio=0.75,
             norm_pix_loss=True, **_DEIT3[_size])
