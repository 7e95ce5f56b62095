"""What a run optimises and how it is evaluated: image classification, or MAE pre-training (``models.mae``).

The train loop and the pure steps are the same for both; a task supplies

    loss(model, images, targets, key) → (scalar loss, {name: scalar})      the training objective of one batch
    eval_sums(model, batch)           → {name: sum over the real examples} one padded eval batch (``mask``)
    summarize(sums)                   → the evaluation's metrics (``test_loss``, and ``test_accuracy`` for
                                        classification; ``val_*`` when the evaluated split is not 'test')
    best_metric, best_mode            which evaluation metric picks the best checkpoint, and whether higher is better
    after_evaluation(...)             anything written at each evaluation (MAE: a PNG of reconstructions)

Classification: ``L = mean_n −Σ_k t_nk log softmax(f(x_n))_k`` with Mixup/CutMix / label-smoothed targets ``t``.
MAE: ``L`` = the mean over the batch of each image's masked-patch reconstruction loss, masks drawn from the step's
key; evaluation draws them from a fixed key (``EVAL_MASK_SEED``), so the test loss of two evaluations compares
the same masks.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from layerscale_jax.models.mae import MaskedAutoencoder
from layerscale_jax.train.figures import reconstruction_png

EVAL_MASK_SEED = 20211111
RECONSTRUCTION_IMAGES = 8       # examples shown in reconstructions.png


def metric_prefix(eval_split: str) -> str:
    """``test`` for the test split, ``val`` for any other evaluated split ('validation', 'train[99%:]', ...): a
    number selected on is never named like a number reported."""
    return "test" if eval_split == "test" else "val"


class ClassificationTask:
    name = "classification"
    uses_labels = True               # Mixup/CutMix and label smoothing make the targets
    best_mode = "max"

    def __init__(self, eval_split: str = "test"):
        self.prefix = metric_prefix(eval_split)
        self.best_metric = f"{self.prefix}_accuracy"

    def loss(self, model, images, targets, key):
        logits = model(images, key=key)
        loss = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets).mean()
        return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == jnp.argmax(targets, -1))}

    def eval_sums(self, model, batch: dict) -> dict[str, Any]:
        logits = model(batch["image"])
        labels = batch["label"]
        mask = batch["mask"].astype(jnp.float32)
        loss = optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, logits.shape[-1]))
        correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
        return {"loss_sum": jnp.sum(loss * mask), "correct": jnp.sum(correct * mask), "count": jnp.sum(mask)}

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        count = max(sums["count"], 1.0)
        p = self.prefix
        return {f"{p}_accuracy": sums["correct"] / count, f"{p}_loss": sums["loss_sum"] / count,
                f"{p}_examples": sums["count"]}

    def after_evaluation(self, trainer, params, step: int, workdir) -> None:
        return None


class MAETask:
    name = "mae"
    uses_labels = False
    best_mode = "min"

    def __init__(self, eval_split: str = "test"):
        self.prefix = metric_prefix(eval_split)
        self.best_metric = f"{self.prefix}_loss"

    def loss(self, model, images, targets, key):
        return model.loss(images, key).mean(), {}

    def eval_sums(self, model, batch: dict) -> dict[str, Any]:
        mask = batch["mask"].astype(jnp.float32)
        loss = model.loss(batch["image"], jax.random.key(EVAL_MASK_SEED))
        return {"loss_sum": jnp.sum(loss * mask), "count": jnp.sum(mask)}

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        count = max(sums["count"], 1.0)
        return {f"{self.prefix}_loss": sums["loss_sum"] / count, f"{self.prefix}_examples": sums["count"]}

    def after_evaluation(self, trainer, params, step: int, workdir) -> None:
        """``WORKDIR/reconstructions.png`` (and ``reconstructions/step_<step>.png``): rows original, masked input,
        reconstruction, reconstruction with the visible patches pasted, for the first test images."""
        images = reconstruction_images(trainer, params)
        if jax.process_index() == 0:
            png = reconstruction_png(images, trainer.info.mean, trainer.info.std)
            (workdir / "reconstructions").mkdir(parents=True, exist_ok=True)
            for path in (workdir / "reconstructions" / f"step_{step}.png", workdir / "reconstructions.png"):
                with path.open("wb") as f:
                    f.write(png)


def for_model(model: nnx.Module, eval_split: str = "test"):
    """The task a model is trained for: MAE pre-training for ``MaskedAutoencoder``, classification otherwise;
    its metrics are named after the evaluated split (``metric_prefix``)."""
    return (MAETask if isinstance(model, MaskedAutoencoder) else ClassificationTask)(eval_split)


def reconstruction_images(trainer, params) -> np.ndarray:
    """``(4, n, H, W, C)`` host array: originals, masked inputs, reconstructions, pasted, for the first ``n`` test
    images. The global batch is reduced inside ``jit`` to a replicated result, so every process may read it."""
    from layerscale_jax import data as data_lib
    from layerscale_jax.data.sharding import process_batch_rows
    from layerscale_jax.train import sharding as shard_lib

    config, mesh = trainer.config, trainer.mesh
    size = config.train.eval_batch_size
    iterator = data_lib.make_eval_iterator(config.data, global_batch_size=size, rows=process_batch_rows(mesh, size))
    try:
        batch = data_lib.to_global_batch(next(iter(iterator)), mesh, size)
    finally:
        iterator.close()
    n = min(RECONSTRUCTION_IMAGES, size)
    graphdef = trainer.graphdef_eval

    def show(p, images):
        model = nnx.merge(graphdef, p)
        masked, recon, pasted = model.reconstruct(images, jax.random.key(EVAL_MASK_SEED))
        return jnp.stack([images[:n].astype(jnp.float32), masked[:n], recon[:n], pasted[:n]])

    fn = jax.jit(shard_lib.with_activation_sharding(show, mesh, config.train.sharding_rules),
                 out_shardings=shard_lib.replicated(mesh))
    return np.asarray(jax.device_get(fn(params, batch["image"])))
