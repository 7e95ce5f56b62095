"""Training: device mesh and shardings, pure train/eval steps, metrics, the main loop (checkpoints and the workdir:
``layerscale_jax.storage``).

``train_and_evaluate`` (``train.loop``) loads on first use, so ``python -m layerscale_jax.train`` starts its
``__main__`` — which installs the stop-signal handlers — before jax is imported.
"""

__all__ = ["train_and_evaluate"]


def __getattr__(name: str):
    if name == "train_and_evaluate":
        from layerscale_jax.train.loop import train_and_evaluate
        return train_and_evaluate
    raise AttributeError(f"module 'layerscale_jax.train' has no attribute {name!r}")
