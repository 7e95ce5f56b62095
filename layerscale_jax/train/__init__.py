"""Training: device mesh and shardings, pure train/eval steps, orbax checkpoints, metrics, the main loop."""
from layerscale_jax.train.loop import train_and_evaluate

__all__ = ["train_and_evaluate"]
