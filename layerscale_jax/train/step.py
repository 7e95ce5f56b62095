"""Pure training and evaluation steps over explicit state pytrees (jitted by the loop with explicit shardings).

The train state is a dict ``{"step", "params", "opt_state", "rng", "nonfinite_steps"[, "ema"]}``; the model is
rebuilt inside the step from its graph definition with ``nnx.merge`` so everything stays functional.

Per step, with targets ``t`` from Mixup/CutMix and label smoothing (classification; MAE pre-training replaces
``L`` by its masked-patch reconstruction loss, see ``train.tasks``):

    L(θ) = mean_n  −Σ_k t_nk log softmax(f_θ(x_n))_k
    g    = ∇L(θ)            (optionally averaged over micro-batches, optionally at SAM's perturbed point; with
                             both, each micro-batch b_i is perturbed by its own ε_i = ρ ∇L_{b_i}/‖∇L_{b_i}‖:
                             SAM's m-sharpness with m = batch / accum_steps)
    θ'   = θ + optax_update(g)

A non-finite loss, gradient norm or update (e.g. from a non-finite learning rate) leaves the state as it was and is
counted in ``nonfinite_steps``; the loop decides whether that stops the run (``train.nonfinite = "raise"``) or only
skips the update (``"skip"``). Skipped steps do not advance optax's step count, so the learning rate applied (and
logged) at step ``t`` is ``schedule(t − nonfinite_steps)``.

Randomness: parameters are initialised from ``seed``; the training stream (Mixup/CutMix, stochastic depth) is
``fold_in(key(seed), TRAIN_RNG_STREAM)``, independent of it, and step ``t`` uses ``fold_in(stream, t)``.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from layerscale_jax import optim
from layerscale_jax.data import mixup_cutmix
from layerscale_jax.train.tasks import ClassificationTask

TRAIN_RNG_STREAM = 1


def init_train_state(params: nnx.State, tx: optax.GradientTransformation, seed: int, use_ema: bool) -> dict:
    state = {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "opt_state": tx.init(params),
        "rng": jax.random.key_data(jax.random.fold_in(jax.random.key(seed), TRAIN_RNG_STREAM)),
        "nonfinite_steps": jnp.zeros((), jnp.int32),
    }
    if use_ema:
        state["ema"] = jax.tree.map(jnp.copy, params)
    return state


def make_train_step(graphdef, tx: optax.GradientTransformation, schedule: Callable, *, optim_config,
                    data_config, num_classes: int, trainable_mask=None, task=None) -> Callable:
    """``train_step(state, batch) -> (state, metrics)`` with ``batch = {"image", "label"}`` (global arrays).

    ``task`` (``train.tasks``; default classification) gives the loss; a task without labels (MAE) skips
    Mixup/CutMix and ignores ``label``. Metrics: ``train_loss``, ``train_<name>`` for each of the task's
    statistics, ``grad_norm``, ``learning_rate``, ``finite``."""
    task = task if task is not None else ClassificationTask()

    def loss_and_grad(params, images, targets, key):
        def loss_fn(p):
            return task.loss(nnx.merge(graphdef, p), images, targets, key)
        return jax.value_and_grad(loss_fn, has_aux=True)(params)

    if optim_config.sam_rho > 0:
        base = loss_and_grad

        def loss_and_grad(params, images, targets, key):  # noqa: F811 - SAM wraps the plain gradient
            return optim.sam_gradients(base, params, images, targets, key, rho=optim_config.sam_rho,
                                       adaptive=optim_config.sam_adaptive, eta=optim_config.sam_eta,
                                       trainable=trainable_mask)

    def train_step(state: dict, batch: dict):
        step_key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
        mix_key, drop_key = jax.random.split(step_key)
        if task.uses_labels:
            images, targets = mixup_cutmix(mix_key, batch["image"], batch["label"], num_classes=num_classes,
                                           mixup_alpha=data_config.mixup_alpha,
                                           cutmix_alpha=data_config.cutmix_alpha,
                                           label_smoothing=data_config.label_smoothing)
        else:
            images, targets = batch["image"], batch["label"]
        params = state["params"]
        if optim_config.accum_steps > 1:
            def micro(p, micro_batch, key):
                return loss_and_grad(p, micro_batch["image"], micro_batch["target"], key)
            (loss, aux), grads = optim.accumulate_gradients(
                micro, params, {"image": images, "target": targets}, optim_config.accum_steps, key=drop_key)
        else:
            (loss, aux), grads = loss_and_grad(params, images, targets, drop_key)

        grad_norm = optax.global_norm(grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(updates))

        def keep_if_finite(new, old):
            return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)

        new_state = dict(state)
        new_state["params"] = keep_if_finite(new_params, params)
        new_state["opt_state"] = keep_if_finite(opt_state, state["opt_state"])
        if "ema" in state:
            new_state["ema"] = keep_if_finite(optim.ema_update(state["ema"], new_params, optim_config.ema_decay),
                                              state["ema"])
        new_state["step"] = state["step"] + 1
        new_state["nonfinite_steps"] = state["nonfinite_steps"] + (~finite).astype(jnp.int32)
        metrics = {"train_loss": loss, **{f"train_{k}": v for k, v in aux.items()}, "grad_norm": grad_norm,
                   "learning_rate": schedule(state["step"] - state["nonfinite_steps"]), "finite": finite}
        return new_state, metrics

    return train_step


def make_eval_step(graphdef, task=None) -> Callable:
    """``eval_step(params, batch) -> sums`` over a padded batch with ``mask`` (padding is not counted): the sum of
    each of the task's evaluation metrics and ``count`` (``train.tasks``; default classification)."""
    task = task if task is not None else ClassificationTask()

    def eval_step(params, batch: dict) -> dict[str, Any]:
        return task.eval_sums(nnx.merge(graphdef, params), batch)

    return eval_step
