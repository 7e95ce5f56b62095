"""layerscale-jax: LayerScale (CaiT) and very deep Vision Transformers in JAX / Flax NNX.

The data flows one way: ``layers`` → ``models`` → ``optim`` → ``data`` → ``train`` → ``experiments``.
Importing the package never imports TensorFlow.
"""
from layerscale_jax.models import create_model, list_models

__version__ = "0.1.0"
__all__ = ["create_model", "list_models", "__version__"]
