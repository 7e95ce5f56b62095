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


RECONSTRUCTION_ROWS = ("original", "masked input", "reconstruction", "visible pasted")


def reconstruction_png(images: np.ndarray, mean, std, scale: int | None = None,
                       labels: tuple[str, ...] = RECONSTRUCTION_ROWS) -> bytes:
    """A PNG grid of ``(rows, n, H, W, C)`` normalised images (un-normalised with ``mean``/``std``), each image
    enlarged ``scale``× (nearest; default to about 64 pixels) with a 2-pixel gap, each row named on its left by
    ``labels`` (the rows of ``reconstruction_images``)."""
    import io

    from PIL import Image, ImageDraw

    rows, n, h, w, c = images.shape
    if len(labels) != rows:
        raise ValueError(f"{rows} rows of images but {len(labels)} labels: {labels}")
    scale = scale or max(1, 64 // max(h, w))
    pixels = np.clip(images * np.asarray(std, np.float32) + np.asarray(mean, np.float32), 0.0, 1.0)
    pixels = np.repeat(np.repeat(pixels, scale, axis=2), scale, axis=3)
    gap = 2
    H, W = h * scale, w * scale
    canvas = np.ones((rows * (H + gap) - gap, n * (W + gap) - gap, c), np.float32)
    for r in range(rows):
        for i in range(n):
            canvas[r * (H + gap):r * (H + gap) + H, i * (W + gap):i * (W + gap) + W] = pixels[r, i]
    array = (canvas * 255).round().astype(np.uint8)
    grid = Image.fromarray(array[..., 0] if c == 1 else array)
    draw = ImageDraw.Draw(grid)
    margin = 8 + max(int(draw.textlength(label)) for label in labels)
    image = Image.new(grid.mode, (grid.width + margin, grid.height), 255 if c == 1 else (255,) * 3)
    image.paste(grid, (margin, 0))
    draw = ImageDraw.Draw(image)
    for r, label in enumerate(labels):
        draw.text((margin - 4, r * (H + gap) + H // 2), label, fill=0 if c == 1 else (0,) * 3, anchor="rm")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
