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

``branch_diagnostics(graphdef, params, batch)`` is a pure function returning a flat dict of float32 arrays, one
vector over the layers per group and quantity (``"blocks/attn.ratio": (depth,)``, …: few outputs, so it compiles
in about the time of one forward and backward pass whatever the depth); ``make_diagnostics_fn`` jits it with
replicated outputs, so every process of a multi-host job holds every value without a host fetch of sharded
arrays; ``to_floats`` turns them into one float per layer, named

    diag/loss
    diag/<group>.<l>.<branch>.ratio        group: blocks (and CaiT's blocks_token_only), branch: attn | mlp
    diag/<group>.<l>.<branch>.scale
    diag/<group>.<l>.grad_norm
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from layerscale_jax.models import groups
from layerscale_jax.train import sharding as shard_lib

BRANCHES = ("attn", "mlp")
BLOCK_GROUPS = ("blocks", "blocks_token_only")


def _hard_label_loss(logits: jnp.ndarray, labels: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    # Hand-written rather than optax's cross-entropies: with integer labels optax's differs in the last bits, and
    # with one-hot labels the diagnostics' compiled loss did (diag/loss of the committed study records).
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)), labels[:, None], axis=-1)[:, 0]
    if mask is None:
        return jnp.mean(nll)
    mask = mask.astype(jnp.float32)
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _per_layer_sum(leaf: jnp.ndarray, stacked: bool) -> jnp.ndarray:
    """Σ over everything but the layer axis (stacked) or over everything (one layer's leaf), float32."""
    axes = tuple(range(1, leaf.ndim)) if stacked else None
    return jnp.sum(jnp.square(leaf.astype(jnp.float32)), axis=axes)


def _per_layer_mean_abs(leaf: jnp.ndarray, stacked: bool) -> jnp.ndarray:
    axes = tuple(range(1, leaf.ndim)) if stacked else None
    return jnp.mean(jnp.abs(leaf.astype(jnp.float32)), axis=axes)


def branch_diagnostics(graphdef, params, batch: dict) -> dict[str, jax.Array]:
    """The per-block diagnostics (module docstring) of the model ``nnx.merge(graphdef, params)`` on ``batch``
    (``{"image", "label"}``, optionally ``"mask"`` for padded examples). Pure and jittable.

    Returns ``{"loss": (), "<group>/<branch>.ratio": (layers,), "<group>/<branch>.scale": (layers,),
    "<group>/grad_norm": (layers,)}`` (``to_floats`` names one value per layer).
    """
    images, labels, mask = batch["image"], batch["label"], batch.get("mask")

    def loss_fn(p):
        model = nnx.merge(graphdef, p)
        model.eval()
        tokens, stats = model.forward_features_with_stats(images)
        return _hard_label_loss(model.forward_head(tokens), labels, mask), stats

    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    model = nnx.merge(graphdef, params)                 # read for its layout and its blocks' scales
    stacked_blocks = bool(model.cfg.scan_layers)
    out: dict[str, jax.Array] = {"loss": loss}
    for group, ratios in stats.items():
        for b, branch in enumerate(BRANCHES):
            out[f"{group}/{branch}.ratio"] = ratios[:, b]

    # group → {layer (or "stacked"): accumulated value}
    squares: dict[str, dict] = {}

    def visit_grad(path, g):
        if path[0] in BLOCK_GROUPS:
            stacked = stacked_blocks and path[0] == "blocks"
            layer = "stacked" if stacked else int(path[1])
            acc = squares.setdefault(path[0], {})
            acc[layer] = acc.get(layer, 0.0) + _per_layer_sum(g, stacked)


    def as_vector(per_layer: dict) -> jax.Array:
        if "stacked" in per_layer:
            return per_layer["stacked"]
        return jnp.stack([per_layer[i] for i in sorted(per_layer)])

    groups.map_params(visit_grad, grads)
    for group, per_layer in squares.items():
        out[f"{group}/grad_norm"] = jnp.sqrt(as_vector(per_layer))
    for group in BLOCK_GROUPS:
        stack = getattr(model, group, None)
        if stack is None:
            continue
        stacked = stacked_blocks and group == "blocks"
        for b, branch in enumerate(BRANCHES):
            factors = [block.branch_scales()[b].factor() for block in ([stack] if stacked else stack)]
            if factors[0] is not None:                                 # `none`: no multiplier to show
                out[f"{group}/{branch}.scale"] = (_per_layer_mean_abs(factors[0], True) if stacked else
                                                  jnp.stack([_per_layer_mean_abs(f, False) for f in factors]))
    return out


def make_diagnostics_fn(graphdef, mesh, param_sharding, batch_sharding, rules) -> Callable:
    """``branch_diagnostics`` jitted as ``fn(params, batch)`` on ``mesh``, as the train step is: the inputs take
    ``param_sharding`` / ``batch_sharding``, the activations follow the sharding ``rules``, and the outputs are
    replicated (every process holds every value)."""
    fn = shard_lib.with_activation_sharding(functools.partial(branch_diagnostics, graphdef), mesh, rules)
    return jax.jit(fn, in_shardings=(param_sharding, batch_sharding), out_shardings=shard_lib.replicated(mesh))


def to_floats(diagnostics: dict[str, Any]) -> dict[str, float]:
    """The (replicated) diagnostics as Python floats, one per layer: ``diag/blocks.3.attn.ratio``, … (one device →
    host copy; every process may call it)."""
    flat: dict[str, float] = {}
    for key, value in jax.device_get(diagnostics).items():
        if key == "loss":
            flat["diag/loss"] = float(value)
            continue
        group, quantity = key.split("/", 1)
        for layer, v in enumerate(value.reshape(-1)):
            if quantity == "grad_norm":
                flat[f"diag/{group}.{layer}.grad_norm"] = float(v)
            else:
                branch, name = quantity.split(".")
                flat[f"diag/{group}.{layer}.{branch}.{name}"] = float(v)
    return flat
