"""Models: DeiT III-style ViT and CaiT, MAE pre-training of a DeiT III encoder, a registry with timm's names,
and layout conversion.

The names below load on first use: the architecture configs and ``model_config`` / ``list_models`` come from
``layerscale_jax.arch`` (no jax), the modules and ``create_model`` from their modules here (jax, flax). So importing
``layerscale_jax.models.X`` loads only what X needs.
"""
_SOURCES = {
    "ArchConfig": "layerscale_jax.arch", "CaiTConfig": "layerscale_jax.arch", "MAEConfig": "layerscale_jax.arch",
    "ViTConfig": "layerscale_jax.arch", "list_models": "layerscale_jax.arch", "model_config": "layerscale_jax.arch",
    "CaiT": "layerscale_jax.models.cait", "MaskedAutoencoder": "layerscale_jax.models.mae",
    "VisionTransformer": "layerscale_jax.models.vit", "REMAT_POLICIES": "layerscale_jax.models.stack",
    "create_from_config": "layerscale_jax.models.registry", "create_model": "layerscale_jax.models.registry",
}
__all__ = sorted(_SOURCES)


def __getattr__(name: str):
    import importlib
    if name in _SOURCES:
        value = globals()[name] = getattr(importlib.import_module(_SOURCES[name]), name)
        return value
    try:                                               # a submodule, e.g. models.vit
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))
