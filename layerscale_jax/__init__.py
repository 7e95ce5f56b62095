"""layerscale-jax: LayerScale (CaiT) and very deep Vision Transformers in JAX / Flax NNX.

The data flows one way: ``layers`` → ``models`` → ``optim`` → ``data`` → ``train`` → ``experiments``.
Importing the package never imports TensorFlow, nor ml_collections, TFDS or grain: the Python API for notebooks
(``layerscale_jax.api``: ``load_config``, ``override_config``, ``fit``, ``load_run``, ``evaluate``, ``diagnose``,
``example_batch``, ``Run``, ``TrainingInterrupted``) is importable from here and loads on first use.
"""
from layerscale_jax.models import create_model, list_models

__version__ = "0.1.0"
_API = ("Run", "TrainingInterrupted", "diagnose", "evaluate", "example_batch", "fit", "load_config", "load_run",
        "override_config")
__all__ = ["create_model", "list_models", "__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from layerscale_jax import api
        return getattr(api, name)
    raise AttributeError(f"module 'layerscale_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
