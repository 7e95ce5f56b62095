"""Matching a source against a model and adapting it: every missing, unexpected or shape-mismatched key in one
``ValueError`` with hints, ``pos_embed`` resampled to the target grid, a fresh head kept when only ``num_classes``
differs; then the values written into the model in its layout, dtypes and shardings."""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layerscale_jax.convert.flat import (
    STACKED,
    expected_params,
    flatten,
    natural_key,
    param_roles,
    stack_blocks,
    unflatten,
)
from layerscale_jax.convert.naming import family, is_fused_qkv, ours_to_timm_name, qkv_heads_major, timm_shape
from layerscale_jax.convert.sources import Source
from layerscale_jax.errors import InputFileError

log = logging.getLogger(__name__)


def resize_pos_embed(pos_embed: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Resample a ``(1, H·W, D)`` position embedding (patch tokens only) to ``grid`` = (h, w).

    Bicubic with antialiasing in float32, the interpolation timm's ``resample_abs_pos_embed`` uses by default
    (``jax.image.resize(..., 'cubic', antialias=True)`` reproduces it to ~1e-6, upsampling and downsampling).
    """
    _, n, d = pos_embed.shape
    side = math.isqrt(n)
    if side * side != n:
        raise InputFileError(f"pos_embed with {n} tokens is not a square grid; cannot resample it to {grid}")
    x = jnp.asarray(pos_embed.reshape(side, side, d), jnp.float32)
    y = jax.image.resize(x, (grid[0], grid[1], d), method="cubic", antialias=True)
    return np.asarray(y).reshape(1, grid[0] * grid[1], d).astype(pos_embed.dtype)


def _resizable(found: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    return (len(found) == 3 and found[0] == 1 and found[2] == expected[2]
            and math.isqrt(found[1]) ** 2 == found[1])


def _show(key: str, src: Source, fam: str, ndim: int, role: str | None) -> str:
    if key in src.names:
        name = src.names[key]
    elif src.convention == "timm":
        name = ours_to_timm_name(key, ndim, fam, role) or key
    else:
        name = key
    return repr(name) if name == key else f"{name!r} (ours {key!r})"


def _shape_in_source(key: str, shape: tuple[int, ...], src: Source) -> tuple[int, ...]:
    return timm_shape(key, shape) if src.convention == "timm" else tuple(shape)


def _source_arch(src: Source) -> dict[str, Any]:
    """Architecture fields read off the source's shapes (for hints when they differ from the model's)."""
    t, arch = src.tensors, {}
    if "cls_token" in t:
        arch["embed_dim"] = int(t["cls_token"].shape[-1])
    for stage, field in ((STACKED, "depth"), ("blocks_token_only", "depth_token_only")):
        ids = {int(k.split(".")[1]) for k in t if k.startswith(stage + ".") and k.split(".")[1].isdigit()}
        if ids:
            arch[field] = max(ids) + 1
    if "patch_embed.proj.kernel" in t and t["patch_embed.proj.kernel"].ndim == 4:
        arch["patch_size"] = int(t["patch_embed.proj.kernel"].shape[0])
    if "blocks.0.attn.proj_l.kernel" in t:
        arch["num_heads"] = int(t["blocks.0.attn.proj_l.kernel"].shape[0])
    if "blocks.0.mlp.fc1.kernel" in t and "embed_dim" in arch:
        arch["mlp_ratio"] = t["blocks.0.mlp.fc1.kernel"].shape[-1] / arch["embed_dim"]
    return arch


def _hints(cfg, src: Source, missing: list[str], unexpected: list[str]) -> list[str]:
    hints = [f"hint: the source has {field}={value!r}, the model {field}={getattr(cfg, field)!r}"
             for field, value in _source_arch(src).items() if hasattr(cfg, field) and getattr(cfg, field) != value]
    if "fc_norm.scale" in missing and "norm.scale" in unexpected:
        hints.append("hint: the source has a final 'norm' (global_pool='token'); build the model with "
                     "global_pool='token'")
    if "norm.scale" in missing and "fc_norm.scale" in unexpected:
        hints.append("hint: the source has 'fc_norm' (global_pool='avg'); build the model with global_pool='avg'")
    return hints


def plan_load(model: nnx.Module, src: Source) -> tuple[dict[str, np.ndarray], bool]:
    """Validate ``src`` against ``model`` and adapt it; returns (the values to load, whether the head keeps the
    model's initialisation because only ``num_classes`` differs).

    Raises one InputFileError listing every problem; nothing is modified here.
    """
    cfg = model.cfg
    fam = family(cfg)
    expected, roles = expected_params(model), param_roles(model)
    fresh: list[str] = []
    if src.encoder_only:   # MAE encoder → classifier: a new head; with global_pool='avg' a new fc_norm, no norm
        fresh = sorted(k for k in expected if k.split(".")[0] in ("head", "fc_norm") and k not in src.tensors)
        if "norm.scale" not in expected:
            src = dataclasses.replace(src, tensors={k: v for k, v in src.tensors.items()
                                                    if k.split(".")[0] != "norm"})
    missing = sorted(set(expected) - set(src.tensors) - set(fresh), key=natural_key)
    unexpected = sorted(set(src.tensors) - set(expected), key=natural_key)

    head_k = src.tensors.get("head.kernel")
    head_b = src.tensors.get("head.bias")
    want_k = expected["head.kernel"][0]
    reinit_head = (head_k is not None and head_k.ndim == 2 and head_k.shape != want_k
                   and head_k.shape[0] == want_k[0]
                   and (head_b is None or tuple(head_b.shape) == (head_k.shape[1],)))

    values, mismatched = {}, []
    for key in sorted(set(expected) & set(src.tensors), key=natural_key):
        shape = expected[key][0]
        array = src.tensors[key]
        if tuple(array.shape) == shape:
            values[key] = (qkv_heads_major(array, cfg.num_heads) if src.convention == "timm" and is_fused_qkv(key)
                           else array)
        elif key == "pos_embed" and _resizable(array.shape, shape):
            values[key] = resize_pos_embed(array, (cfg.grid_size, cfg.grid_size))
            side = math.isqrt(array.shape[1])
            log.info("resampled pos_embed from a %dx%d to a %dx%d grid (bicubic, antialiased)",
                     side, side, cfg.grid_size, cfg.grid_size)
        elif reinit_head and key in ("head.kernel", "head.bias"):
            continue
        else:
            mismatched.append(key)

    if missing or unexpected or mismatched:
        counts = ", ".join(f"{n} {what}" for n, what in ((len(missing), "missing"), (len(unexpected), "unexpected"),
                                                        (len(mismatched), "shape-mismatched")) if n)
        lines = [f"cannot load {src.description} into {type(model).__name__} "
                 f"(embed_dim={cfg.embed_dim}, depth={cfg.depth}, num_heads={cfg.num_heads}, "
                 f"img_size={cfg.img_size}, num_classes={cfg.num_classes}): {counts} key(s); nothing was loaded."]
        lines += _hints(cfg, src, missing, unexpected)
        if missing:
            lines.append(f"{len(missing)} missing key(s) (in the model, not in the source):")
            lines += [f"  {_show(k, src, fam, len(expected[k][0]), roles[k])}: expected shape "
                      f"{_shape_in_source(k, expected[k][0], src)}" for k in missing]
        if unexpected:
            lines.append(f"{len(unexpected)} unexpected key(s) (in the source, not in the model):")
            lines += [f"  {_show(k, src, fam, src.tensors[k].ndim, None)}: found shape {src.shapes[k]}"
                      for k in unexpected]
        if mismatched:
            lines.append(f"{len(mismatched)} shape mismatch(es):")
            lines += [f"  {_show(k, src, fam, len(expected[k][0]), roles[k])}: expected shape "
                      f"{_shape_in_source(k, expected[k][0], src)}, found {src.shapes[k]}" for k in mismatched]
        raise InputFileError("\n".join(lines))

    if reinit_head:
        log.warning("num_classes differs (source head %s, model %d classes): the head keeps its fresh "
                    "initialisation, everything else is loaded", tuple(head_k.shape[::-1]), cfg.num_classes)
    if fresh:
        log.warning("%s has no %s: kept at their fresh initialisation, everything else is loaded",
                    src.description, ", ".join(fresh))
    return values, reinit_head or bool(fresh)


def assign_params(model: nnx.Module, values: Mapping[str, np.ndarray]) -> None:
    """Write ``values`` (unrolled flat keys) into ``model``, in its layout, dtypes and shardings."""
    if model.cfg.scan_layers:
        values = stack_blocks(values, model.cfg.depth)
    state = nnx.state(model, nnx.Param)
    current = flatten(nnx.to_pure_dict(state))
    new = {}
    for key, old in current.items():
        if key not in values:
            new[key] = old                                 # a re-initialised head
            continue
        array = np.asarray(values[key]).astype(old.dtype, copy=False)
        sharding = getattr(old, "sharding", None)
        new[key] = jax.device_put(array, sharding) if sharding is not None else jnp.asarray(array)
    nnx.replace_by_pure_dict(state, unflatten(new))
    nnx.update(model, state)
