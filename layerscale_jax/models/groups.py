"""The layer groups each model family declares, for layer-wise learning-rate decay (as timm's ``group_matcher``).

Every parameter belongs to one integer layer group; the optimizer turns group ``i`` into the multiplier
``decay ** (L_max - i)`` (``L_max`` = the last group) and stays generic. Two conventions:

=========================  =================================  =======================================
parameters                 ``mae`` (MAE / BEiT ``param_groups_lrd``)  ``timm`` (``param_groups_layer_decay``)
=========================  =================================  =======================================
cls_token, pos_embed,      0                                  0
patch_embed
blocks.i                   i + 1                              i + 1
blocks_token_only.j (CaiT) depth + 1 + j                      j + depth − depth_token_only + 1
                                                              (overlaps the last SA blocks)
norm                       last group (scale 1.0)             depth (joins the last SA block)
fc_norm, head              last group (scale 1.0)             last group (scale 1.0)
=========================  =================================  =======================================

Last group: ViT ``depth + 1`` in both conventions; CaiT ``depth + 1`` (timm) or ``depth + depth_token_only + 1``
(mae — MAE only defines plain ViTs; putting the class-attention blocks after the SA blocks is our extension).
timm numbers the distinct group keys in order, so its ids are renumbered to 0..n−1 (a no-op for the registered
models; it matters only when ``depth_token_only > depth``).

Parameters are addressed by their unrolled path, e.g. ``('blocks', 3, 'attn', 'qkv', 'kernel')``. With
``scan_layers=True`` a parameter under ``blocks`` is stacked on a leading layer axis and its group id is an
``np.ndarray`` of shape ``(depth,)`` (one id per layer).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from layerscale_jax.arch import CaiTConfig, MAEConfig, ViTConfig
from layerscale_jax.errors import ConfigError
from layerscale_jax.models.layout import STACKED_KEY

CONVENTIONS = ("mae", "timm")
STEM = ("cls_token", "pos_embed", "patch_embed")

Path = tuple  # of str (attribute / dict keys) and int (list indices)


def _vit_layer_id(path: Path, cfg: ViTConfig, convention: str) -> int | None:
    last = cfg.depth + 1
    top = path[0]
    if top in STEM:
        return 0
    if top == "blocks":
        return path[1] + 1
    if top == "norm":
        return cfg.depth if convention == "timm" else last
    if top in ("fc_norm", "head"):
        return last
    return None


def _cait_layer_id(path: Path, cfg: CaiTConfig, convention: str) -> int | None:
    depth, extra = cfg.depth, cfg.depth_token_only
    last = depth + 1 if convention == "timm" else depth + extra + 1
    top = path[0]
    if top in STEM:
        return 0
    if top == "blocks":
        return path[1] + 1
    if top == "blocks_token_only":
        return path[1] + depth - extra + 1 if convention == "timm" else depth + 1 + path[1]
    if top == "norm":
        return depth if convention == "timm" else last
    if top == "head":
        return last
    return None


def _mae_layer_id(path: Path, cfg: MAEConfig, convention: str) -> int | None:
    """MAE pre-training: the encoder as a ViT; the decoder (and its mask token) in the last group, with the head's
    place (layer decay is not used in MAE pre-training; the groups exist so the optimizer is the same code)."""
    if path[0] == "mask_token" or str(path[0]).startswith("decoder_"):
        return cfg.depth + 1
    return _vit_layer_id(path, cfg, convention)


# The family rules, keyed by the architecture config type (``model.cfg``).
LAYER_ID_RULES: dict[type, Callable[[Path, Any, str], int | None]] = {
    ViTConfig: _vit_layer_id,
    CaiTConfig: _cait_layer_id,
    MAEConfig: _mae_layer_id,
}


def param_path(jax_path) -> Path:
    """A jax key path (from ``nnx.State`` or a pure dict) → ``('blocks', 3, 'attn', 'qkv', 'kernel')``.

    The ``.value`` attribute of an ``nnx.Variable`` is dropped, so both tree kinds give the same path.
    """
    keys = []
    for k in jax_path:
        if isinstance(k, jax.tree_util.DictKey):
            keys.append(k.key)
        elif isinstance(k, jax.tree_util.SequenceKey):
            keys.append(k.idx)
        elif isinstance(k, jax.tree_util.GetAttrKey):
            if k.name != "value":
                keys.append(k.name)
        else:
            keys.append(getattr(k, "key", str(k)))
    return tuple(keys)


def path_name(path: Path) -> str:
    """``('blocks', 3, 'attn', 'qkv', 'kernel')`` → ``'blocks/3/attn/qkv/kernel'``."""
    return "/".join(str(k) for k in path)


def map_params(fn: Callable[[Path, Any], Any], tree):
    """``fn(path, leaf)`` over every leaf of a param-shaped tree (``nnx.State`` or its pure dict)."""
    return jax.tree_util.tree_map_with_path(lambda p, x: fn(param_path(p), x), tree)


def is_stacked(model: nnx.Module, path: Path) -> bool:
    """Whether the parameter at ``path`` carries a leading layer axis (scanned ``blocks``)."""
    return bool(model.cfg.scan_layers) and path[0] == STACKED_KEY


def layer_paths(model: nnx.Module, path: Path) -> list[Path]:
    """The unrolled path of each layer a parameter holds: ``[path]``, or one per layer for a stacked parameter."""
    if is_stacked(model, path):
        return [(path[0], i) + tuple(path[1:]) for i in range(model.cfg.depth)]
    return [path]


def _rule(model: nnx.Module):
    cfg = getattr(model, "cfg", None)
    rule = LAYER_ID_RULES.get(type(cfg))
    if rule is None:
        raise ValueError(f"no layer groups declared for {type(model).__name__} with cfg {type(cfg).__name__}; "
                         f"known: {[t.__name__ for t in LAYER_ID_RULES]}")
    return rule


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ConfigError(f"layer_decay_convention={convention!r} is not one of {CONVENTIONS}")


def _raw_ids(model: nnx.Module, convention: str) -> tuple[nnx.State, list[int]]:
    _check_convention(convention)
    rule = _rule(model)
    unclaimed: list[str] = []
    seen: set[int] = set()

    def ids(path, _):
        layer_ids = [rule(p, model.cfg, convention) for p in layer_paths(model, path)]
        if any(i is None for i in layer_ids):
            unclaimed.append(path_name(path))
            return -1
        seen.update(layer_ids)
        return np.asarray(layer_ids, np.int32) if is_stacked(model, path) else int(layer_ids[0])

    tree = map_params(ids, nnx.state(model, nnx.Param))
    if unclaimed:
        raise ValueError(f"no layer group claims parameter(s) {unclaimed} of {type(model).__name__}; "
                         f"declare them in layerscale_jax/models/groups.py")
    return tree, sorted(seen)


def layer_group_ids(model: nnx.Module, convention: str = "mae") -> nnx.State:
    """Each parameter's layer group: a tree shaped like ``nnx.state(model, nnx.Param)`` whose leaves are ``int``
    (``np.ndarray`` of shape ``(depth,)`` for parameters stacked on a layer axis). ``model`` may be abstract."""
    tree, keys = _raw_ids(model, convention)
    if convention == "timm" and keys != list(range(len(keys))):
        ordinal = {k: n for n, k in enumerate(keys)}
        remap = np.vectorize(ordinal.__getitem__, otypes=[np.int32])
        tree = jax.tree.map(lambda i: remap(i) if isinstance(i, np.ndarray) else ordinal[i], tree)
    return tree


def num_layer_groups(model: nnx.Module, convention: str = "mae") -> int:
    """The number of layer groups ``L_max + 1``: group ids run 0..L_max and the head is in the last group."""
    return 1 + max(int(np.max(i)) for i in jax.tree.leaves(layer_group_ids(model, convention)))
