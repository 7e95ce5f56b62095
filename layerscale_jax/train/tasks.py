"""What a run optimises and how it is evaluated: image classification, or MAE pre-training (``models.mae``).

The train loop and the pure steps are the same for both; a task supplies

    loss(model, images, targets, key) → (scalar loss, {name: scalar})
        the training objective of one batch and its statistics, logged as ``train_loss`` and ``train_<name>``
    eval_metrics = (name, ...)
        what an evaluation measures, logged as ``<prefix>_<name>``: the mean over the evaluated split of
    eval_values(model, batch) → {name: one value per example}
    best_metric, best_mode
        which evaluation metric picks the best checkpoint, and whether higher is better
    after_evaluation(...)
        anything written at each evaluation (MAE: a PNG of reconstructions)

so a train or evaluation metric is added in its task only: the step's metrics, the evaluation's masked sums and
means (``eval_sums``, ``summarize``), metrics.jsonl, TensorBoard, the console line (the train loss and every
evaluation metric) and a study's record follow from it. ``prefix`` is ``test`` when the evaluated split is the test
split, ``val`` otherwise (``metric_prefix``).

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


class _Task:
    """What every task shares: an evaluation's per-example values summed over the real examples of a padded batch
    (``mask``), and those sums turned into means over the evaluated split."""
    eval_metrics: tuple[str, ...]

    def __init__(self, eval_split: str = "test"):
        self.prefix = metric_prefix(eval_split)

    @property
    def eval_keys(self) -> tuple[str, ...]:
        """The evaluation's metrics as logged: ``<prefix>_<name>``."""
        return tuple(f"{self.prefix}_{name}" for name in self.eval_metrics)

    def eval_sums(self, model, batch: dict) -> dict[str, Any]:
        """``{name: Σ over the batch's real examples}`` of each evaluation metric, and ``count``, their number."""
        values = self.eval_values(model, batch)
        if set(values) != set(self.eval_metrics):
            raise ValueError(f"{type(self).__name__}.eval_values gives {sorted(values)}, but its eval_metrics are "
                             f"{sorted(self.eval_metrics)}")
        mask = batch["mask"].astype(jnp.float32)
        return {**{name: jnp.sum(values[name] * mask) for name in self.eval_metrics}, "count": jnp.sum(mask)}

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        """The means over the evaluated split (``eval_keys``) and ``<prefix>_examples``, from the summed
        ``eval_sums`` of its batches."""
        count = max(sums["count"], 1.0)
        return {**{key: sums[name] / count for key, name in zip(self.eval_keys, self.eval_metrics)},
                f"{self.prefix}_examples": sums["count"]}


class ClassificationTask(_Task):
    name = "classification"
    uses_labels = True               # Mixup/CutMix and label smoothing make the targets
    best_mode = "max"
    eval_metrics = ("accuracy", "loss")

    def __init__(self, eval_split: str = "test"):
        super().__init__(eval_split)
        self.best_metric = f"{self.prefix}_accuracy"

    def loss(self, model, images, targets, key):
        logits = model(images, key=key)
        loss = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets).mean()
        return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == jnp.argmax(targets, -1))}

    def eval_values(self, model, batch: dict) -> dict[str, Any]:
        """Per example: whether the top class is the label, and the cross-entropy with the label."""
        logits = model(batch["image"])
        labels = batch["label"]
        loss = optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, logits.shape[-1]))
        return {"accuracy": (jnp.argmax(logits, -1) == labels).astype(jnp.float32), "loss": loss}

    def after_evaluation(self, trainer, params, step: int, workdir, data) -> None:
        return None


class MAETask(_Task):
    name = "mae"
    uses_labels = False
    best_mode = "min"
    eval_metrics = ("loss",)

    def __init__(self, eval_split: str = "test"):
        super().__init__(eval_split)
        self.best_metric = f"{self.prefix}_loss"

    def loss(self, model, images, targets, key):
        return model.loss(images, key).mean(), {}

    def eval_values(self, model, batch: dict) -> dict[str, Any]:
        """Per example: the masked-patch reconstruction loss, masks drawn from ``EVAL_MASK_SEED``."""
        return {"loss": model.loss(batch["image"], jax.random.key(EVAL_MASK_SEED))}

    def after_evaluation(self, trainer, params, step: int, workdir, data) -> None:
        """``WORKDIR/reconstructions.png`` (and ``reconstructions/step_<step>.png``): rows original, masked input,
        reconstruction, reconstruction with the visible patches pasted, for the first test images of ``data``."""
        images = reconstruction_images(trainer, params, data)
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


def reconstruction_images(trainer, params, data) -> np.ndarray:
    """``(4, n, H, W, C)`` host array: originals, masked inputs, reconstructions, pasted, for the first ``n`` test
    images of ``data`` (the data section). The global batch is reduced inside ``jit`` to a replicated result, so
    every process may read it."""
    from layerscale_jax import data as data_lib
    from layerscale_jax.data.sharding import process_batch_rows
    from layerscale_jax.train import sharding as shard_lib

    train, mesh = trainer.train, trainer.mesh
    size = train.eval_batch_size
    iterator = data_lib.make_eval_iterator(data, global_batch_size=size, rows=process_batch_rows(mesh, size))
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

    fn = jax.jit(shard_lib.with_activation_sharding(show, mesh, train.sharding_rules),
                 out_shardings=shard_lib.replicated(mesh))
    return np.asarray(jax.device_get(fn(params, batch["image"])))
