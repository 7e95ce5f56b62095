"""Pure training and evaluation steps over explicit state pytrees (jitted by the loop with explicit shardings).

The train state is a dict ``{"step", "params", "opt_state", "rng", "nonfinite_steps"[, "ema"]}``; the model is
rebuilt inside the step from its graph definition with ``nnx.merge`` so everything stays functional.

Per step, with targets ``t`` from Mixup/CutMix and label smoothing:

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


def cross_entropy(logits: jnp.ndarray, targets: jnp.ndarray) -> jnp.ndarray:
    """Per-example cross-entropy against soft targets ``(batch, classes)``; float32."""
    return -jnp.sum(targets * jax.nn.log_softmax(logits.astype(jnp.float32)), axis=-1)


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
                    data_config, num_classes: int, trainable_mask=None) -> Callable:
    """``train_step(state, batch) -> (state, metrics)`` with ``batch = {"image", "label"}`` (global arrays)."""

    def loss_and_grad(params, images, targets, key):
        def loss_fn(p):
            model = nnx.merge(graphdef, p)
            logits = model(images, key=key)
            loss = cross_entropy(logits, targets).mean()
            return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == jnp.argmax(targets, -1))}
        return jax.value_and_grad(loss_fn, has_aux=True)(params)

    if optim_config.sam_rho > 0:
        base = loss_and_grad

        def loss_and_grad(params, images, targets, key):  # noqa: F811 - SAM wraps the plain gradient
            return optim.sam_gradients(base, params, images, targets, key, rho=optim_config.sam_rho,
                                       adaptive=optim_config.sam_adaptive, trainable=trainable_mask)

    def train_step(state: dict, batch: dict):
        step_key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
        mix_key, drop_key = jax.random.split(step_key)
        images, targets = mixup_cutmix(mix_key, batch["image"], batch["label"], num_classes=num_classes,
                                       mixup_alpha=data_config.mixup_alpha, cutmix_alpha=data_config.cutmix_alpha,
                                       label_smoothing=data_config.label_smoothing)
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
        metrics = {"train_loss": loss, "train_accuracy": aux["accuracy"], "grad_norm": grad_norm,
                   "learning_rate": schedule(state["step"] - state["nonfinite_steps"]), "finite": finite}
        return new_state, metrics

    return train_step


def make_eval_step(graphdef) -> Callable:
    """``eval_step(params, batch) -> sums`` over a padded batch with ``mask`` (padding is not counted)."""

    def eval_step(params, batch: dict) -> dict[str, Any]:
        model = nnx.merge(graphdef, params)
        logits = model(batch["image"])
        labels = batch["label"]
        mask = batch["mask"].astype(jnp.float32)
        loss = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)[:, 0]
        correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
        return {"loss_sum": jnp.sum(loss * mask), "correct": jnp.sum(correct * mask), "count": jnp.sum(mask)}

    return eval_step
