"""Per-parameter rules: layer-wise LR multipliers, the weight-decay mask and the trainable (freeze) mask.

Each function returns a tree shaped like ``nnx.state(model, nnx.Param)`` (so ``jax.tree.map(f, params, tree)``
works); parameters stacked on a layer axis (``scan_layers=True``) get an ``np.ndarray`` of shape ``(depth,)``,
one value per layer. ``model`` may be abstract (``nnx.eval_shape``): only paths and shapes are read.

Layer-wise learning-rate decay (BEiT, Bao et al. 2021; MAE, He et al. 2021): a parameter in layer group ``i`` of
``L_max + 1`` groups trains at ``lr · max(decay ** (L_max − i), min_scale)``; the groups are declared per model
family in ``layerscale_jax.models.groups``.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np
from flax import nnx

from layerscale_jax.errors import ConfigError
from layerscale_jax.layers.params import DECAYED_ROLES, map_variables, role
from layerscale_jax.models import groups
from layerscale_jax.settings import number


def layer_decay_scales(model: nnx.Module, decay: float, convention: str = "mae",
                       min_scale: float = 0.0) -> nnx.State:
    """Each parameter's LR multiplier ``max(decay ** (L_max − group), min_scale)`` (``float``; ``np.ndarray`` of
    shape ``(depth,)`` for stacked parameters). ``decay=1`` gives 1.0 everywhere."""
    number("layer_decay", decay, 0.0, 1.0, low_open=True)
    number("layer_decay_min_scale", min_scale, 0.0, 1.0)
    ids = groups.layer_group_ids(model, convention)
    last = groups.num_layer_groups(model, convention) - 1

    def scale(group):
        value = np.maximum(float(decay) ** (last - np.asarray(group, np.float64)), float(min_scale))
        return value if isinstance(group, np.ndarray) else float(value)

    smallest = max(float(decay) ** last, float(min_scale))
    if np.float32(smallest) < np.finfo(np.float32).tiny:  # would silently freeze the stem
        raise ConfigError(f"layer_decay={decay!r} over {last + 1} layer groups gives the stem an LR multiplier of "
                          f"{smallest:.3g}, which float32 cannot hold; raise layer_decay or set "
                          f"layer_decay_min_scale")
    return _map_ids(scale, ids)


def _map_ids(fn, ids):
    return groups.map_params(lambda _, leaf: fn(leaf), ids)


def weight_decay_mask(model: nnx.Module) -> nnx.State:
    """``True`` where weight decay applies: the parameters whose role (``layers.params``) is ``weight`` or
    ``adapter`` — Dense and Conv kernels, LoRA's A and B; ``False`` for biases, norms, LayerScale λ, scalar gates,
    tokens and position embeddings. A parameter made without a role is an error."""
    missing = []

    def decays(path, variable):
        if role(variable) is None:
            missing.append(groups.path_name(groups.param_path(path)))
        return role(variable) in DECAYED_ROLES

    mask = map_variables(decays, nnx.state(model, nnx.Param))
    if missing:
        raise ValueError(f"parameter(s) {missing} carry no role; create them with layerscale_jax.layers.params.param "
                          f"(or the metadata of layers.params.metadata) so that weight decay, sharding and "
                          f"diagnostics know what they are")
    return mask


def trainable_mask(model: nnx.Module, freeze: Sequence[str] = ()) -> nnx.State:
    """``False`` for parameters matched by a ``freeze`` regex, ``True`` otherwise (``np.ndarray`` of bools per layer
    for stacked parameters). Each regex is ``re.fullmatch``ed against the unrolled '/'-joined path of every layer,
    e.g. ``'blocks/3/attn/qkv/kernel'``, so the same patterns work in both layouts. A regex that matches nothing is
    an error."""
    compiled = []
    for pattern in freeze:
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise ConfigError(f"optim.freeze regex {pattern!r} does not compile: {e}") from None
    used = [False] * len(compiled)
    examples: list[str] = []

    def trainable(path, _):
        flags = []
        for layer_path in groups.layer_paths(model, path):
            name = groups.path_name(layer_path)
            if len(examples) < 6:
                examples.append(name)
            hits = [bool(c.fullmatch(name)) for c in compiled]
            used[:] = [u or h for u, h in zip(used, hits)]
            flags.append(not any(hits))
        return np.asarray(flags) if groups.is_stacked(model, path) else flags[0]

    mask = groups.map_params(trainable, nnx.state(model, nnx.Param))
    unused = [p for p, u in zip(freeze, used) if not u]
    if unused:
        raise ConfigError(f"optim.freeze regex(es) {unused} match no parameter (each is re.fullmatch'ed against "
                          f"paths such as {examples})")
    return mask
