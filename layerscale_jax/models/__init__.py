"""Models: DeiT III-style ViT and CaiT, MAE pre-training of a DeiT III encoder, a registry with timm's names,
and layout conversion.

The names below load on first use: the architecture configs and ``model_config`` / ``list_models`` come from
``layerscale_jax.arch`` (no jax), the modules and ``create_model`` from their modules here (jax, flax). So importing
``layerscale_jax.models.X`` loads only what X needs.
"""
from layerscale_jax.lazy import lazy_names

_SOURCES = {
    "ArchConfig": "layerscale_jax.arch", "CaiTConfig": "layerscale_jax.arch", "MAEConfig": "layerscale_jax.arch",
    "ViTConfig": "layerscale_jax.arch", "list_models": "layerscale_jax.arch", "model_config": "layerscale_jax.arch",
    "CaiT": ".cait", "MaskedAutoencoder": ".mae", "VisionTransformer": ".vit", "REMAT_POLICIES": ".stack",
    "create_from_config": ".registry", "create_model": ".registry",
}
__all__ = sorted(_SOURCES)

__getattr__, __dir__ = lazy_names(__name__, globals(), _SOURCES)
