"""Running a stack of identical blocks: unrolled (a Python loop) or scanned (``jax.lax.scan`` over parameters
stacked along a leading layer axis), each optionally rematerialised with a named policy.

With ``scan_layers=True`` the stack is one module whose every parameter has a leading axis of length ``depth``
(created with ``nnx.vmap``; its logical axes start with ``layers``); the scan traces one block, so compile time
stays flat in depth.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layerscale_jax.layers.params import add_layer_axis

# Named rematerialisation policies (what the backward pass may keep instead of recomputing); the names are
# ``layerscale_jax.arch.REMAT_NAMES``, which the model configs check.
REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,                                                      # no rematerialisation
    "full": jax.checkpoint_policies.nothing_saveable,                  # recompute the whole block
    "dots_saveable": jax.checkpoint_policies.dots_saveable,            # keep every matmul output
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def create_stack(make_block: Callable[[nnx.Rngs], nnx.Module], depth: int, scan_layers: bool, rngs: nnx.Rngs):
    """``depth`` blocks: an ``nnx.List`` (unrolled) or one module with stacked parameters (scanned)."""
    if not scan_layers:
        return nnx.List([make_block(rngs) for _ in range(depth)])

    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=0, out_axes=0, axis_size=depth)
    def create(layer_rngs):
        return make_block(layer_rngs)

    stack = create(rngs)
    add_layer_axis(stack)
    return stack


def _rematted(fn, remat: str, in_scan: bool):
    if remat == "none":
        return fn
    return jax.checkpoint(fn, policy=REMAT_POLICIES[remat], prevent_cse=not in_scan)


def run_stack(blocks, x: jnp.ndarray, *, depth: int, scan_layers: bool, remat: str,
              key: jax.Array | None, drop_path_rates, return_stats: bool = False):
    """Apply the blocks in order. ``drop_path_rates`` has one rate per block (all zero: no stochastic depth).

    With ``return_stats=True`` returns ``(x, stats)``, ``stats`` stacking each block's ``forward`` statistics
    (its branch-to-stream ratios) along a leading layer axis: ``(depth, 2)``.
    """
    drop_path_rates = np.asarray(drop_path_rates, np.float32)
    keys = None if key is None else jax.random.split(key, depth)
    use_rates = bool(np.any(drop_path_rates > 0))

    if scan_layers:
        graphdef, state = nnx.split(blocks)

        def body(carry, layer):
            layer_state, layer_key, rate = layer
            block = nnx.merge(graphdef, layer_state)
            out, stats = block.forward(carry, key=layer_key, drop_path_rate=rate if use_rates else 0.0)
            return out, (stats if return_stats else None)

        rates = jnp.asarray(drop_path_rates)
        x, stats = jax.lax.scan(_rematted(body, remat, in_scan=True), x, (state, keys, rates))
        return (x, stats) if return_stats else x

    all_stats = []
    for i, block in enumerate(blocks):
        graphdef, state = nnx.split(block)
        rate = float(drop_path_rates[i])

        def apply(layer_state, carry, layer_key, graphdef=graphdef, rate=rate):
            return nnx.merge(graphdef, layer_state).forward(carry, key=layer_key, drop_path_rate=rate)

        x, stats = _rematted(apply, remat, in_scan=False)(state, x, None if keys is None else keys[i])
        all_stats.append(stats)
    return (x, jnp.stack(all_stats)) if return_stats else x
