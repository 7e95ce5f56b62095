"""Per-block diagnostics of residual-branch scaling, cheap enough to log at every evaluation.

Why a scheme trains or fails at depth shows in three per-block quantities (Touvron et al. 2021, CaiT, §3 and
Fig. 3/4 discuss the first and the third):

    ratio_{l,b}   = ‖S_{l,b} · f_{l,b}(N(x_{l,b}))‖ / ‖x_{l,b}‖      the scaled branch against the residual stream it
                                                                     joins (b ∈ {attn, mlp}; Frobenius norms over the
                                                                     whole batch, every token and channel)
    grad_norm_l   = ‖∂L/∂θ_l‖                                       the gradient norm of all of block l's parameters
    scale_{l,b}   = mean_j |λ_{l,b,j}|   (or |α_{l,b}|)             the learned branch multiplier (absent for `none`)

``S`` is the block's branch scaling (LayerScale's diag(λ), a scalar α, ReZero's per-block α used by both branches,
or 1), ``N`` its pre-norm (or the identity for ReZero / SkipInit). L is the plain cross-entropy of the batch's hard
labels (no label smoothing or Mixup), the model in eval mode (no stochastic depth), so values are comparable
across steps and runs.

``branch_diagnostics(graphdef, params, batch)`` is a pure function returning a flat ``{name: scalar array}`` dict;
``make_diagnostics_fn`` jits it with replicated outputs, so every process of a multi-host job gets the same values
without a host fetch of sharded arrays; ``to_floats`` then reads them. Names:

    diag/loss
    diag/<group>.<l>.<branch>.ratio        group: blocks (and CaiT's blocks_token_only), branch: attn | mlp
    diag/<group>.<l>.<branch>.scale
    diag/<group>.<l>.grad_norm
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from layerscale_jax.models import groups

BRANCHES = ("attn", "mlp")
BLOCK_GROUPS = ("blocks", "blocks_token_only")


def _hard_label_loss(logits: jnp.ndarray, labels: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)), labels[:, None], axis=-1)[:, 0]
    if mask is None:
        return jnp.mean(nll)
    mask = mask.astype(jnp.float32)
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _per_layer(group: str, path: tuple, leaf: jnp.ndarray, stacked: bool):
    """``[(layer index, per-layer array), ...]`` for a block parameter (stacked: one entry per leading index)."""
    if stacked:
        return [(i, leaf[i]) for i in range(leaf.shape[0])]
    return [(path[1], leaf)]


def branch_diagnostics(graphdef, params, batch: dict) -> dict[str, jax.Array]:
    """The per-block diagnostics (module docstring) of the model ``nnx.merge(graphdef, params)`` on ``batch``
    (``{"image", "label"}``, optionally ``"mask"`` for padded examples). Pure and jittable."""
    images, labels, mask = batch["image"], batch["label"], batch.get("mask")

    def loss_fn(p):
        model = nnx.merge(graphdef, p)
        model.eval()
        tokens, stats = model.forward_features_with_stats(images)
        return _hard_label_loss(model.forward_head(tokens), labels, mask), stats

    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    model = nnx.merge(graphdef, params)
    stacked_blocks = bool(model.cfg.scan_layers)
    out: dict[str, jax.Array] = {"diag/loss": loss}

    for group, ratios in stats.items():
        for layer in range(ratios.shape[0]):
            for b, branch in enumerate(BRANCHES):
                out[f"diag/{group}.{layer}.{branch}.ratio"] = ratios[layer, b]

    squares: dict[tuple, jax.Array] = {}
    scales: dict[tuple, jax.Array] = {}

    def visit_grad(path, g):
        if path[0] in BLOCK_GROUPS:
            stacked = stacked_blocks and path[0] == "blocks"
            for layer, value in _per_layer(path[0], path, g, stacked):
                key = (path[0], int(layer))
                squares[key] = squares.get(key, 0.0) + jnp.sum(jnp.square(value.astype(jnp.float32)))

    def visit_param(path, w):
        if path[0] in BLOCK_GROUPS and path[-1] in ("gamma", "alpha") and path[-2] in ("ls1", "ls2"):
            stacked = stacked_blocks and path[0] == "blocks"
            for layer, value in _per_layer(path[0], path, w, stacked):
                scales[(path[0], int(layer), path[-2])] = jnp.mean(jnp.abs(value.astype(jnp.float32)))

    groups.map_params(visit_grad, grads)
    groups.map_params(visit_param, params)
    for (group, layer), square in sorted(squares.items()):
        out[f"diag/{group}.{layer}.grad_norm"] = jnp.sqrt(square)
    for (group, layer, which), scale in sorted(scales.items()):
        out[f"diag/{group}.{layer}.{BRANCHES[0] if which == 'ls1' else BRANCHES[1]}.scale"] = scale
        if which == "ls1" and (group, layer, "ls2") not in scales:      # ReZero: one α for both branches
            out[f"diag/{group}.{layer}.{BRANCHES[1]}.scale"] = scale
    return out


def make_diagnostics_fn(graphdef, mesh=None, param_sharding=None, batch_sharding=None) -> Callable:
    """``branch_diagnostics`` jitted as ``fn(params, batch)``; with a ``mesh`` its outputs are replicated over it
    (every process holds every value) and the inputs take ``param_sharding`` / ``batch_sharding`` if given."""
    fn = lambda params, batch: branch_diagnostics(graphdef, params, batch)  # noqa: E731
    if mesh is None:
        return jax.jit(fn)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    in_shardings = None if param_sharding is None else (param_sharding, batch_sharding)
    return jax.jit(fn, in_shardings=in_shardings, out_shardings=replicated)


def to_floats(diagnostics: dict[str, Any]) -> dict[str, float]:
    """The jitted function's replicated scalars as Python floats (one device → host copy)."""
    return {k: float(v) for k, v in jax.device_get(diagnostics).items()}
