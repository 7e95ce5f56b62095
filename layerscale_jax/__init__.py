"""layerscale-jax: LayerScale (CaiT) and very deep Vision Transformers in JAX / Flax NNX.

The data flows one way: ``layers`` → ``models`` → ``optim`` → ``data`` → ``train`` → ``experiments``.
Importing the package imports nothing else: the names below load on first use — ``create_model`` and
``list_models`` from ``layerscale_jax.models`` (jax, flax), and the Python API for notebooks from
``layerscale_jax.api`` (``load_config``, ``override_config``, ``fit``, ``load_run``, ``evaluate``, ``diagnose``,
``example_batch``, ``Run``, ``TrainingInterrupted``, and ``compile_for``: a config's steps compiled for a TPU or GPU
target on this machine, with memory per chip, FLOPs, collectives and the step-time range).
So ``python -m layerscale_jax.train`` installs its stop-signal handlers before jax is imported, and nothing imports
TensorFlow, ml_collections, TFDS or grain before it is used.
"""
__version__ = "0.1.0"
_MODELS = ("create_model", "list_models")
_API = ("Run", "TrainingInterrupted", "compile_for", "diagnose", "evaluate", "example_batch", "fit", "load_config",
        "load_run", "override_config")
__all__ = ["__version__", *_MODELS, *_API]

from layerscale_jax.lazy import lazy_names  # noqa: E402 - the package's one lazy mechanism, importing nothing

_SOURCES = {**dict.fromkeys(_MODELS, ".models"), **dict.fromkeys(_API, ".api")}
__getattr__, __dir__ = lazy_names(__name__, globals(), _SOURCES)
