"""Gradient computations a train step composes: SAM / ASAM and gradient accumulation over micro-batches.

Both wrap a ``loss_and_grad_fn(params, *args) -> ((loss, aux), grads)`` (e.g. ``jax.value_and_grad(loss_fn,
has_aux=True)``), are pure and jittable, and use only tree maps, reductions and ``lax.scan``, so they run under any
sharding of ``params`` and the batch. Each returns ``((loss, aux), grads)`` like the function it wraps.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from layerscale_jax.errors import ConfigError
from layerscale_jax.layers.params import is_variable, role
from layerscale_jax.models import groups
from layerscale_jax.optim.transforms import along_layers, lookup

LossAndGradFn = Callable[..., tuple[tuple[jax.Array, Any], Any]]


def _tree_norm(tree) -> jax.Array:
    """The global L2 norm, accumulated in float32."""
    return optax.tree.norm(jax.tree.map(lambda x: x.astype(jnp.float32), tree))


# ASAM's normalisation operator T_w applies to the tensors PyTorch calls ``weight`` (the official code tests
# ``'weight' in name``): here the parameters whose role (``layers.params``) is a Dense / Conv kernel or a LayerNorm
# scale. Biases, LoRA adapters, LayerScale λ, scalar gates, the class token and position embeddings get T_w = 1.
ASAM_NORMALISED_ROLES = ("weight", "norm")
ASAM_DEFAULT_ETA = 0.01


def asam_operator(param: nnx.Variable, eta: float) -> jax.Array:
    """ASAM's ``T_w`` for one parameter (an ``nnx.Variable`` carrying its role): ``|w| + η`` elementwise for
    kernels and LayerNorm scales, 1 for every other parameter (SamsungLabs/ASAM ``asam.py``)."""
    if not is_variable(param) or role(param) is None:
        raise ValueError("ASAM needs each parameter's role: pass the parameters as an nnx.State of Variables that "
                         "carry it (layers.params)")
    if role(param) in ASAM_NORMALISED_ROLES:
        return jnp.abs(param[...].astype(jnp.float32)) + eta
    return jnp.ones((), jnp.float32)


def sam_gradients(loss_and_grad_fn: LossAndGradFn, params, *args, rho: float, adaptive: bool = False,
                  eta: float = ASAM_DEFAULT_ETA, trainable=None):
    """Sharpness-aware minimisation (Foret et al., "Sharpness-Aware Minimization", 2021) within one step.

        g = ∇L(w) ;  ε = ρ · g / ‖g‖                          (SAM)
                     ε = ρ · T_w² g / ‖T_w g‖                 (ASAM, Kwon et al. 2021: ``adaptive=True``)
        returns (L(w), aux(w)) and ∇L(w + ε)

    ASAM's operator is ``T_w = |w| + η`` elementwise (η = 0.01 in the paper's official code, SamsungLabs/ASAM) for
    the kernels and LayerNorm scales, and 1 for the other parameters (``asam_operator``): with η > 0 a weight that
    is exactly zero is still perturbed. ``eta`` is ``optim.sam_eta``.

    The loss and aux are those at the original ``params``; the gradient is taken at the perturbed point (apply it
    to the original ``params``). ``args`` (batch, PRNG key, ...) are the same for both passes. ``trainable``
    (``bundle.trainable_mask``) keeps frozen parameters out of the perturbation. ``rho=0`` gives the plain gradient.
    """
    if isinstance(rho, (int, float)) and rho < 0:
        raise ConfigError(f"sam_rho={rho!r} must be ≥ 0")
    if isinstance(eta, (int, float)) and eta < 0:
        raise ConfigError(f"sam_eta={eta!r} must be ≥ 0")
    (loss, aux), grads = loss_and_grad_fn(params, *args)
    if trainable is not None:
        keep: dict = {}
        groups.map_params(lambda path, leaf: keep.__setitem__(path, leaf), trainable)
        grads_for_eps = jax.tree_util.tree_map_with_path(
            lambda p, g: g * along_layers(np.asarray(lookup(keep, groups.param_path(p), "sam_gradients"),
                                                     np.float32), g), grads)
    else:
        grads_for_eps = grads
    if adaptive:
        def operator_of(w):
            t = asam_operator(w, eta)
            return w.replace(t)

        operator = jax.tree.map(operator_of, params, is_leaf=is_variable)
        norm = _tree_norm(jax.tree.map(lambda g, t: g.astype(jnp.float32) * t, grads_for_eps, operator))
        direction = jax.tree.map(lambda g, t: g.astype(jnp.float32) * jnp.square(t), grads_for_eps, operator)
    else:
        norm = _tree_norm(grads_for_eps)
        direction = jax.tree.map(lambda g: g.astype(jnp.float32), grads_for_eps)
    scale = rho / (norm + 1e-12)
    perturbed = jax.tree.map(lambda w, d: (w.astype(jnp.float32) + scale * d).astype(w.dtype), params, direction)
    _, sam_grads = loss_and_grad_fn(perturbed, *args)
    return (loss, aux), sam_grads


def accumulate_gradients(loss_and_grad_fn: LossAndGradFn, params, batch, num_micro_batches: int, *args,
                         key: jax.Array | None = None):
    """The gradient of a ``k×`` larger batch from ``k`` micro-batches, scanned one after the other.

    Every array of ``batch`` (a dict or any pytree) is split on its leading axis into ``k`` micro-batches; micro-batch
    ``i`` holds examples ``i, i + k, i + 2k, ...`` (a strided split keeps each micro-batch spread over all the
    data-parallel devices). Calls ``loss_and_grad_fn(params, micro_batch, *args)`` — with ``key`` given, plus
    ``jax.random.fold_in(key, i)`` as the last argument so each micro-batch draws fresh randomness — and averages
    the losses, the aux trees and the gradients (accumulated in float32). For a mean loss the result equals the
    full-batch gradient. ``num_micro_batches=1`` calls the function once on the whole batch.
    """
    k = num_micro_batches
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"accum_steps={k!r} must be a positive integer")
    sizes = {x.shape[0] for x in jax.tree.leaves(batch)}
    if len(sizes) != 1:
        raise ValueError(f"batch arrays disagree on the batch size: {sorted(sizes)}")
    (size,) = sizes
    if size % k:
        raise ConfigError(f"accum_steps={k} does not divide the batch size {size}")
    if k == 1:
        return loss_and_grad_fn(params, batch, *args, *(() if key is None else (jax.random.fold_in(key, 0),)))

    micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape((size // k, k) + x.shape[1:]), 0, 1), batch)

    def call(i, micro_batch):
        extra = () if key is None else (jax.random.fold_in(key, i),)
        return loss_and_grad_fn(params, micro_batch, *args, *extra)

    first = jax.tree.map(lambda x: x[0], micro)
    grad_shapes = jax.eval_shape(call, 0, first)[1]
    acc_dtype = lambda d: jnp.promote_types(d, jnp.float32)  # noqa: E731
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, acc_dtype(s.dtype)), grad_shapes)

    def body(acc, inputs):
        i, micro_batch = inputs
        (loss, aux), grads = call(i, micro_batch)
        acc = jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)
        return acc, (loss, aux)

    total, (losses, auxes) = jax.lax.scan(body, zeros, (jnp.arange(k), micro))
    grads = jax.tree.map(lambda t, s: (t / k).astype(s.dtype), total, grad_shapes)
    return (jnp.mean(losses, axis=0), jax.tree.map(lambda a: jnp.mean(a, axis=0), auxes)), grads
