"""Logical axis names for activations, and the sharding constraints that pin them to the device mesh.

Layers call ``constrain(x, ("batch", "heads"))`` at the boundaries where the layout matters; outside an
``activation_sharding(mesh, rules)`` context (one device, a notebook, a test of the maths) it returns ``x`` unchanged,
inside one it is ``jax.lax.with_sharding_constraint`` with the spec the rules give. The train loop opens the context
while its steps are traced, with

    batch → (data, fsdp)      the examples of a batch (the rows of the (batch·tokens, dim) token matrix)
    heads → tensor            attention heads: q, k, v and the attention output, Megatron's column split
    mlp   → tensor            the MLP's hidden units: fc1's output, fc2's input
    everything else           replicated (in particular ``embed``: FSDP shards weights, not activations)

Pinned this way, an FSDP step moves weights (all-gathers) and gradients (reduce-scatters) only, and a tensor-parallel
step computes each head where its q, k, v live, with one all-reduce after each branch's output projection.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Mapping

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

_CONTEXT: contextvars.ContextVar = contextvars.ContextVar("activation_sharding", default=None)


def logical_to_spec(axes: tuple, shape: tuple, mesh: Mesh, rules: Mapping[str, Any]) -> P:
    """A PartitionSpec from logical axis names: each name's mesh axis (or axes) by ``rules``; a dimension stays
    replicated when its rule is None, the mesh axes are already used, size 1, or do not divide it."""
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape):
        target = rules.get(name) if name is not None else None
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        size = math.prod(mesh.shape[t] for t in targets) if targets else 1
        if not targets or any(t in used for t in targets) or dim % size or size == 1:
            spec.append(None)
            continue
        used.update(targets)
        spec.append(targets[0] if len(targets) == 1 else targets)
    return P(*spec)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Mapping[str, Any]):
    """Within this context (while a step is traced), ``constrain`` pins activations to ``mesh`` by ``rules``."""
    token = _CONTEXT.set((mesh, dict(rules)))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def target_platform() -> str:
    """The platform a step is traced for: that of the ``activation_sharding`` mesh's devices (``cuda`` for a GPU
    target compiled on a CPU machine), else JAX's default backend (``cpu``, ``gpu``, ``tpu``)."""
    context = _CONTEXT.get()
    if context is None:
        return jax.default_backend()
    return context[0].devices.flat[0].platform


def constrain(x: jax.Array, axes: tuple) -> jax.Array:
    """``x`` with its dimensions laid out by their logical names (identity outside ``activation_sharding``)."""
    context = _CONTEXT.get()
    if context is None:
        return x
    mesh, rules = context
    if len(axes) != x.ndim:
        raise ValueError(f"constrain: {len(axes)} axis names {axes} for an array of shape {x.shape}")
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh, rules)))
