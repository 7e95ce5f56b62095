"""Models: DeiT III-style ViT and CaiT, MAE pre-training of a DeiT III encoder, a registry with timm's names,
and layout conversion."""
from layerscale_jax.models.base import ArchConfig
from layerscale_jax.models.cait import CaiT, CaiTConfig
from layerscale_jax.models.mae import MAEConfig, MaskedAutoencoder
from layerscale_jax.models.registry import create_from_config, create_model, list_models, model_config
from layerscale_jax.models.stack import REMAT_POLICIES
from layerscale_jax.models.vit import VisionTransformer, ViTConfig

__all__ = ["ArchConfig", "CaiT", "CaiTConfig", "MAEConfig", "MaskedAutoencoder", "VisionTransformer", "ViTConfig",
           "REMAT_POLICIES", "create_from_config", "create_model", "list_models", "model_config"]
