"""Converting parameters between the unrolled and the scanned (stacked) block layouts.

Unrolled: ``{"blocks": {0: {...}, 1: {...}, ...}}``; scanned: ``{"blocks": {...}}`` with every leaf stacked on a
leading layer axis of length ``depth``. Only the ``blocks`` subtree differs; everything else is shared.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

STACKED_KEY = "blocks"


def stack_blocks(tree: dict) -> dict:
    """Unrolled pure-dict state → scanned pure-dict state (leaves of ``blocks[i]`` stacked on axis 0)."""
    blocks = tree[STACKED_KEY]
    layers = [blocks[i] for i in sorted(blocks, key=int)]
    return {**tree, STACKED_KEY: jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


def unstack_blocks(tree: dict) -> dict:
    """Scanned pure-dict state → unrolled pure-dict state (``blocks`` split into ``{0: ..., 1: ...}``)."""
    stacked = tree[STACKED_KEY]
    depth = jax.tree.leaves(stacked)[0].shape[0]
    return {**tree, STACKED_KEY: {i: jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(depth)}}


def convert_layout(model: nnx.Module, scan_layers: bool) -> nnx.Module:
    """A new model of the other layout holding the same weights (a no-op copy when the layout already matches)."""
    from layerscale_jax.models.registry import create_from_config

    target_cfg = dataclasses.replace(model.cfg, scan_layers=scan_layers)
    target = nnx.eval_shape(lambda: create_from_config(target_cfg, rngs=nnx.Rngs(0)))
    tree = nnx.to_pure_dict(nnx.state(model))
    if model.cfg.scan_layers != scan_layers:
        tree = stack_blocks(tree) if scan_layers else unstack_blocks(tree)
    graphdef, abstract_state = nnx.split(target)
    nnx.replace_by_pure_dict(abstract_state, tree)
    result = nnx.merge(graphdef, abstract_state)
    if getattr(model, "deterministic", False):
        result.eval()
    return result
