"""Small optax transformations that look parameters up by path, and so work for stacked (scanned) parameters.

Each takes a ``{path: value}`` table (built from the model, see ``build``); ``value`` is a Python scalar / bool for
an ordinary parameter or an ``np.ndarray`` of shape ``(depth,)`` for a parameter stacked on a leading layer axis,
in which case it is broadcast along that axis. They accept updates as ``nnx.State`` or as pure dicts, and leave
``optax.MaskedNode`` holes (from ``optax.partition``) alone.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from layerscale_jax.models import groups

Table = Mapping[tuple, Any]


def lookup(table: Table, path: tuple, what: str):
    try:
        return table[path]
    except KeyError:
        raise ValueError(f"{what}: parameter {groups.path_name(path)!r} is not one of the parameters this "
                         f"optimizer was built for") from None


def along_layers(value, x: jax.Array) -> jax.Array:
    """``value`` (scalar, or ``(depth,)`` for a stacked parameter) as an array broadcastable against ``x``."""
    value = np.asarray(value)
    if value.ndim == 0:
        return jnp.asarray(value, x.dtype)
    return jnp.asarray(value, x.dtype).reshape(value.shape + (1,) * (x.ndim - 1))


def _map(fn, updates, *rest):
    return jax.tree_util.tree_map_with_path(lambda p, *xs: fn(groups.param_path(p), *xs), updates, *rest)


def _stateless(update_fn) -> optax.GradientTransformation:
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def zero_frozen(trainable: Table) -> optax.GradientTransformation:
    """Zero the gradients of frozen parameters (whole tensors, or the frozen layers of a stacked one), so they take
    no part in gradient clipping and leave no trace in optimizer moments."""

    def update_fn(updates, state, params=None):
        def apply(path, u):
            keep = np.asarray(lookup(trainable, path, "zero_frozen"))
            if keep.all():
                return u
            if not keep.any():
                return jnp.zeros_like(u)
            return u * along_layers(keep, u)

        return _map(apply, updates), state

    return _stateless(update_fn)


def scale_by_multiplier(multipliers: Table) -> optax.GradientTransformation:
    """Multiply each update by its parameter's multiplier: a layer-decay scale ``s_i``, or one scale per layer along
    the leading axis of a stacked parameter. A multiplier of exactly 1 adds no operation. Placed after the base
    optimizer, this is the same update as one base optimizer per layer group followed by ``optax.scale(s_i)``
    (see ``layerscale_jax.optim.bundle``)."""

    def apply(path, u):
        multiplier = np.asarray(lookup(multipliers, path, "scale_by_multiplier"))
        return u if np.all(multiplier == 1.0) else u * along_layers(multiplier, u)

    def update_fn(updates, state, params=None):
        return _map(apply, updates), state

    return _stateless(update_fn)


def add_weight_decay(rate: float, decays: Table) -> optax.GradientTransformation:
    """``u + rate · w`` for the parameters whose ``decays`` entry is true (``optax.add_decayed_weights`` with that
    mask; before the learning rate is applied, so the decay is scaled by ``lr · layer scale`` as torch's AdamW
    does)."""

    def mask(params):
        if params is None:
            raise ValueError("weight decay needs the parameters: call tx.update(grads, state, params)")
        return _map(lambda path, w: bool(lookup(decays, path, "add_weight_decay")), params)

    return optax.add_decayed_weights(rate, mask=mask)


def scale_by_trust_ratio(adapt: Table, stacked: Table) -> optax.GradientTransformation:
    """LAMB's trust ratio ``‖w‖ / ‖u‖`` (1 where either norm is 0; ``optax.scale_by_trust_ratio``) for the parameters
    whose ``adapt`` entry is true. optax takes one norm per tensor: a stacked parameter's are per layer, optax's
    ratio mapped over the leading axis."""
    trust = optax.scale_by_trust_ratio()

    def one(u, w):
        return trust.update(u, optax.EmptyState(), w)[0]

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("the LAMB trust ratio needs the parameters: call tx.update(grads, state, params)")

        def apply(path, u, w):
            if not lookup(adapt, path, "scale_by_trust_ratio"):
                return u
            return (jax.vmap(one) if stacked[path] else one)(u, w)

        return _map(apply, updates, params), state

    return _stateless(update_fn)
