"""Flat parameter dicts: ``"blocks.3.attn.qkv.kernel" → array``, always in the unrolled layout (one entry per
block), and the conversion from and to the scanned layout (a leading depth axis under ``blocks``)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from flax import nnx

from layerscale_jax.layers.lora import is_adapter_path
from layerscale_jax.layers.params import map_variables, role
from layerscale_jax.models.layout import STACKED_KEY

STACKED = STACKED_KEY       # "blocks": the only subtree whose layout depends on scan_layers


def flatten(tree: Mapping, prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        path = prefix + (str(key),)
        if isinstance(value, Mapping):
            out.update(flatten(value, path))
        else:
            out[".".join(path)] = value
    return out


def unflatten(flat: Mapping[str, Any]) -> dict:
    """Inverse of ``flatten``; numeric segments become int keys (``nnx.List`` indices)."""
    tree: dict = {}
    for key, value in flat.items():
        parts = [int(p) if p.isdigit() else p for p in key.split(".")]
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree


def natural_key(key: str):
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split("."))


def unstack_blocks(flat: Mapping[str, Any], depth: int, take=lambda value, i: value[i]) -> dict[str, Any]:
    """Scanned flat dict (``blocks.<rest>`` with a leading depth axis) → unrolled (``blocks.<i>.<rest>``)."""
    out = {}
    for key, value in flat.items():
        if key.startswith(STACKED + "."):
            rest = key[len(STACKED) + 1:]
            for i in range(depth):
                out[f"{STACKED}.{i}.{rest}"] = take(value, i)
        else:
            out[key] = value
    return out


def stack_blocks(flat: Mapping[str, np.ndarray], depth: int) -> dict[str, np.ndarray]:
    """Unrolled flat dict → scanned (``blocks.<i>.<rest>`` stacked into ``blocks.<rest>``)."""
    out, layers = {}, {}
    for key, value in flat.items():
        parts = key.split(".", 2)
        if parts[0] == STACKED and len(parts) == 3 and parts[1].isdigit():
            layers.setdefault(parts[2], {})[int(parts[1])] = value
        else:
            out[key] = value
    for rest, by_layer in layers.items():
        out[f"{STACKED}.{rest}"] = np.stack([by_layer[i] for i in range(depth)])
    return out


def param_tree(model: nnx.Module) -> dict:
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def expected_params(model: nnx.Module) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Our flat key → (shape, dtype) of every parameter of ``model``, in the unrolled layout. LoRA adapters are
    not part of a pre-trained checkpoint: they keep their initialisation (``layers.lora``)."""
    specs = {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in flatten(param_tree(model)).items()
             if not is_adapter_path(k)}
    if model.cfg.scan_layers:
        specs = unstack_blocks(specs, model.cfg.depth, take=lambda spec, i: (spec[0][1:], spec[1]))
    return specs


def param_roles(model: nnx.Module) -> dict[str, str]:
    """Our flat key → the parameter's role (``layers.params``), in the unrolled layout, LoRA adapters left out."""
    roles = flatten(nnx.to_pure_dict(map_variables(lambda _, v: role(v), nnx.state(model, nnx.Param))))
    roles = {k: r for k, r in roles.items() if not is_adapter_path(k)}
    return unstack_blocks(roles, model.cfg.depth, take=lambda r, i: r) if model.cfg.scan_layers else roles


def unrolled_params(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's parameters as numpy arrays keyed by our flat names, in the unrolled layout."""
    flat = {k: np.asarray(v) for k, v in flatten(param_tree(model)).items() if not is_adapter_path(k)}
    return unstack_blocks(flat, model.cfg.depth) if model.cfg.scan_layers else flat
