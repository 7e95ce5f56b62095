"""LoRA fine-tuning (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021) of pre-trained
LayerScale ViTs: adding adapters to a model's dense layers, merging them into the base, choosing what trains,
adapter files, the ``config.lora`` section and parameter counts. The layer itself, ``y = x W + b + (α/r) dropout(x)
A B``, is ``layers.lora.LoRALinear``.

Adapters are initialised as in the paper and HF peft: ``A`` with PyTorch's Linear default ``kaiming_uniform_(a=√5)``,
i.e. U(−1/√d_in, 1/√d_in), and ``B = 0``, so the adapted model starts as the pre-trained one. Only ``A`` and ``B``
(and, by choice, the head, the norms and LayerScale's λ) are trained; the base weights are frozen through
``optim.freeze`` (zero updates and no optimizer state; ``frozen_patterns``).

Adapters are chosen by regexes ``re.fullmatch``ed against the unrolled '/'-joined path of each layer's kernel, the
names ``optim.freeze`` uses (``'blocks/3/attn/qkv/kernel'``), so the same targets work in both block layouts. In the
scanned layout (``scan_layers=True``) an adapter is stacked on the layer axis like the kernel it adapts (no copy of
the base); a target matching only some layers of a stacked kernel keeps ``B = 0`` frozen in the others (the
same function as no adapter there). ``A`` of each layer is drawn from a key folded with its unrolled path, so both
layouts start from the same adapters.

``merge(model)`` folds ``(α/r) A B`` into ``W`` (outputs unchanged up to float rounding; the adapter is then
skipped), ``unmerge(model)`` subtracts it again. ``save_adapters`` / ``load_adapters`` write and read only the
adapters (orbax, plus ``lora.json``); ``summary`` counts trainable and total parameters.
"""
from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layerscale_jax.errors import ConfigError
from layerscale_jax.layers.common import torch_conv_uniform
from layerscale_jax.layers.lora import ADAPTER_NAMES, LoRALinear, adapted_layers, is_adapter_path, linear_layers
from layerscale_jax.layers.params import logical_axes, param
# The config.lora section (its fields, defaults and checks) needs no jax: layerscale_jax.lora_config.
from layerscale_jax.lora_config import LORA_DEFAULT_TARGETS as DEFAULT_TARGETS
from layerscale_jax.lora_config import default_lora_config as default_config
from layerscale_jax.lora_config import validate_lora_config as validate_config
from layerscale_jax.optim.param_rules import trainable_mask
from layerscale_jax.settings import integer, number, patterns

__all__ = ["ADAPTER_NAMES", "DEFAULT_TARGETS", "LoRALinear", "add_adapters", "adapted_layers", "adapter_state",
           "apply_config", "default_config", "frozen_patterns", "is_adapter_path", "linear_probe_patterns",
           "load_adapters", "merge", "parameter_counts", "save_adapters", "summary", "unmerge", "validate_config"]

STACKED_KEY = "blocks"            # the subtree stacked on a layer axis when scan_layers=True
# Layers whose forward pass reads the kernel directly (CaiT's talking-heads mixings): an adapter there would be
# ignored, so they cannot be targeted.
_UNADAPTABLE = ("proj_l", "proj_w")


def _name(path) -> str:
    return "/".join(str(k) for k in path)


def _site_id(unrolled_module_path: tuple) -> int:
    """A layout-independent id of an adapted layer within its block (the path without the layer index)."""
    parts = [str(k) for k in unrolled_module_path]
    if len(parts) > 1 and parts[0] == STACKED_KEY and parts[1].isdigit():
        parts = parts[:1] + parts[2:]
    return zlib.crc32("/".join(parts).encode()) & 0x7FFFFFFF


def _is_stacked(model: nnx.Module, path: tuple) -> bool:
    return bool(getattr(getattr(model, "cfg", None), "scan_layers", False)) and path[0] == STACKED_KEY


def _layer_module_paths(model: nnx.Module, path: tuple) -> list[tuple]:
    if _is_stacked(model, path):
        return [(path[0], i) + tuple(path[1:]) for i in range(model.cfg.depth)]
    return [path]


def add_adapters(model: nnx.Module, *, rank: int, alpha: float, dropout: float = 0.0,
                 targets: Sequence[str] | str = DEFAULT_TARGETS, rngs: nnx.Rngs | int = 0) -> list[str]:
    """Give every dense layer whose kernel path matches a ``targets`` regex a rank-``rank`` adapter, in place.

    Returns the adapted kernel paths (unrolled names, sorted). Raises ``ValueError`` for a regex that matches no dense
    layer (naming it and example paths), a rank ≤ 0 or above a matched layer's ``min(d_in, d_out)`` (naming the
    layer and its shape), a layer that already has an adapter, or a layer whose kernel is read directly.
    """
    targets = patterns("lora.targets", targets)
    integer("lora rank", rank, 1)
    number("lora alpha", alpha, 0.0, low_open=True)
    number("lora dropout", dropout, 0.0, 1.0, high_open=True)
    compiled = []
    for pattern in targets:
        try:
            compiled.append(re.compile(pattern))
        except re.error as err:
            raise ConfigError(f"lora target regex {pattern!r} does not compile: {err}") from None
    key = rngs.params() if isinstance(rngs, nnx.Rngs) else jax.random.key(int(rngs))

    used = [False] * len(compiled)
    examples: list[str] = []
    plan = []
    for path, layer in linear_layers(model):
        active = []
        for layer_path in _layer_module_paths(model, path):
            name = _name(layer_path + ("kernel",))
            if len(examples) < 6:
                examples.append(name)
            hits = [bool(c.fullmatch(name)) for c in compiled]
            used[:] = [u or h for u, h in zip(used, hits)]
            active.append(any(hits))
        if any(active):
            plan.append((path, layer, active))
    unused = [p for p, u in zip(targets, used) if not u]
    if unused:
        raise ConfigError(f"lora target regex(es) {unused} match no dense layer (each is re.fullmatch'ed against "
                          f"kernel paths such as {examples})")

    adapted = []
    for path, layer, active in plan:
        name = _name(path + ("kernel",))
        if path[-1] in _UNADAPTABLE:
            raise ConfigError(f"lora target {name!r}: the talking-heads mixings (proj_l, proj_w) read their kernel "
                              "directly and cannot carry an adapter")
        if isinstance(layer, LoRALinear):
            raise ConfigError(f"lora target {name!r} already has an adapter")
        d_in, d_out = layer.in_features, layer.out_features
        if rank > min(d_in, d_out):
            raise ConfigError(f"lora rank={rank} exceeds min(d_in, d_out) = {min(d_in, d_out)} of {name!r} "
                              f"(kernel {d_in} × {d_out})")
        layer_paths = _layer_module_paths(model, path)
        init = torch_conv_uniform(d_in)
        a = [init(jax.random.fold_in(key, _site_id(p) ^ zlib.crc32(_name(p).encode())), (d_in, rank),
                  layer.param_dtype) for p in layer_paths]
        stacked = _is_stacked(model, path)
        layer.__class__ = LoRALinear
        kernel_axes = logical_axes(layer.kernel)          # (…, input, output): A takes the input's, B the output's
        layer.lora_a = param(jnp.stack(a) if stacked else a[0], "adapter", kernel_axes[:-1] + (None,))
        layer.lora_b = param(jnp.zeros(((len(layer_paths),) if stacked else ()) + (rank, d_out), layer.param_dtype),
                             "adapter", kernel_axes[:-2] + (None, kernel_axes[-1]))
        layer.lora_rank = rank
        layer.lora_alpha = float(alpha)
        layer.lora_scale = float(alpha) / rank
        layer.lora_dropout = float(dropout)
        layer.lora_site = _site_id(path)
        layer.lora_active = tuple(bool(x) for x in active)
        layer.lora_merged = False
        adapted += [_name(p + ("kernel",)) for p, on in zip(layer_paths, active) if on]
    return sorted(adapted, key=lambda n: [(0, int(k), "") if k.isdigit() else (1, 0, k) for k in n.split("/")])


def apply_config(model: nnx.Module, config, rngs: nnx.Rngs | int = 0) -> list[str]:
    """``add_adapters`` with the fields of a ``config.lora`` section (``LoraSettings``, or a config made one)."""
    config = validate_config(config)
    return add_adapters(model, rank=config.rank, alpha=config.alpha, dropout=config.dropout,
                        targets=config.targets, rngs=rngs)


# -- training: what is frozen --------------------------------------------------------------------------------------

_NORM = r"(.*/)?(norm\d*|fc_norm|decoder_norm)/(scale|bias)"
_SCALE = r".*/ls\d/(gamma|alpha)"


def frozen_patterns(model: nnx.Module, *, train_head: bool = True, train_norms: bool = False,
                    train_layerscale: bool = False) -> tuple[str, ...]:
    """``optim.freeze`` regexes for LoRA fine-tuning: everything but the adapters (and, by choice, the head, the
    norms and LayerScale's λ) is frozen; so are the adapters of layers a target did not match in a stacked kernel
    (their ``B`` stays 0)."""
    if not adapted_layers(model):
        raise ConfigError("the model has no LoRA adapters: call add_adapters (or apply_config) first")
    keep = [r".*/lora_[ab]"]
    if train_head:
        keep.append(r"head/.*")
    if train_norms:
        keep.append(_NORM)
    if train_layerscale:
        keep.append(_SCALE)
    patterns = ["(?!(?:" + "|".join(keep) + r")$).*"]
    for path, layer in adapted_layers(model):
        for layer_path, on in zip(_layer_module_paths(model, path), layer.lora_active):
            if not on:
                patterns.append(re.escape(_name(layer_path)) + r"/lora_[ab]")
    return tuple(patterns)


def linear_probe_patterns() -> tuple[str, ...]:
    """``optim.freeze`` regexes for a linear probe: everything but the classifier head is frozen."""
    return (r"(?!head/).*",)


# -- merge / unmerge -----------------------------------------------------------------------------------------------

def _delta(layer: LoRALinear) -> jnp.ndarray:
    a = layer.lora_a[...].astype(jnp.float32)
    b = layer.lora_b[...].astype(jnp.float32)
    return layer.lora_scale * jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def merge(model: nnx.Module) -> nnx.Module:
    """Fold every adapter into its base kernel in place, ``W ← W + (α/r) A B``; the adapters are then skipped, so
    outputs are unchanged (up to float rounding). Returns ``model``."""
    for _, layer in adapted_layers(model):
        if not layer.lora_merged:
            layer.kernel[...] = (layer.kernel[...].astype(jnp.float32) + _delta(layer)).astype(layer.kernel.dtype)
            layer.lora_merged = True
    return model


def unmerge(model: nnx.Module) -> nnx.Module:
    """Undo ``merge``: ``W ← W − (α/r) A B`` and use the adapters again. Returns ``model``."""
    for _, layer in adapted_layers(model):
        if layer.lora_merged:
            layer.kernel[...] = (layer.kernel[...].astype(jnp.float32) - _delta(layer)).astype(layer.kernel.dtype)
            layer.lora_merged = False
    return model


# -- adapters alone: state, save, load -----------------------------------------------------------------------------

def adapter_state(model: nnx.Module) -> dict:
    """The adapters as a pure dict ``{'blocks/3/attn/qkv': {'lora_a': A, 'lora_b': B}}`` (module paths in the
    model's own layout)."""
    return {_name(path): {"lora_a": layer.lora_a[...], "lora_b": layer.lora_b[...]}
            for path, layer in adapted_layers(model)}


def _record(model: nnx.Module) -> dict:
    layers = adapted_layers(model)
    first = layers[0][1]
    return {"format": "layerscale_jax.lora/v1", "rank": first.lora_rank, "alpha": first.lora_alpha,
            "dropout": first.lora_dropout, "scan_layers": bool(getattr(model.cfg, "scan_layers", False)),
            "layers": {_name(p): list(layer.lora_active) for p, layer in layers}}


def save_adapters(model: nnx.Module, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Write only the adapters: ``out_dir/adapters`` (orbax) and ``out_dir/lora.json`` (rank, α, layers)."""
    import orbax.checkpoint as ocp

    if any(layer.lora_merged for _, layer in adapted_layers(model)):
        raise ConfigError("the adapters are merged into the base weights; unmerge(model) before saving them")
    out = Path(out_dir).absolute()
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(out / "adapters", adapter_state(model), force=overwrite)
    checkpointer.wait_until_finished()
    if jax.process_index() == 0:
        (out / "lora.json").write_text(json.dumps(_record(model), indent=2) + "\n")
    return out


def load_adapters(model: nnx.Module, path: str | Path) -> nnx.Module:
    """Load adapters written by ``save_adapters`` into a model with the same adapters (``add_adapters`` with the
    same rank and targets), in place. Mismatched layers, rank or layout raise one ``ValueError``."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    record = json.loads((path / "lora.json").read_text())
    layers = dict(adapted_layers(model))
    mine = _record(model) if layers else {"layers": {}}
    problems = []
    if record["layers"] != mine["layers"]:
        missing = sorted(set(mine["layers"]) - set(record["layers"]))
        extra = sorted(set(record["layers"]) - set(mine["layers"]))
        problems.append(f"adapted layers differ (in the model only: {missing}; in the file only: {extra})")
    for field in ("rank", "scan_layers"):
        if layers and record[field] != mine[field]:
            problems.append(f"{field}: file {record[field]!r}, model {mine[field]!r}")
    if problems:
        raise ConfigError(f"cannot load adapters {str(path)!r}: " + "; ".join(problems))
    target = {name: {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=getattr(v, "sharding", None))
                     for k, v in entry.items()} for name, entry in adapter_state(model).items()}
    restored = ocp.StandardCheckpointer().restore(path / "adapters", target)
    by_name = {_name(p): layer for p, layer in layers.items()}
    for name, entry in restored.items():
        by_name[name].lora_a[...] = entry["lora_a"]
        by_name[name].lora_b[...] = entry["lora_b"]
    return model


# -- counting ------------------------------------------------------------------------------------------------------

def parameter_counts(model: nnx.Module, freeze: Iterable[str]) -> dict[str, int]:
    """``{"total", "trainable", "adapters"}`` parameter counts under the ``freeze`` regexes (``optim.freeze``)."""
    mask = trainable_mask(model, tuple(freeze))
    params = nnx.state(model, nnx.Param)
    total = trainable = adapters = 0
    for (path, value), keep in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(mask)):
        size = int(np.prod(value.shape))
        keep = np.asarray(keep)
        per_layer = size // keep.size if keep.ndim else size
        total += size
        trainable += per_layer * int(keep.sum())
        if is_adapter_path(tuple(getattr(k, "key", getattr(k, "name", "")) for k in path if
                                 getattr(k, "name", None) != "value")):
            adapters += size
    return {"total": total, "trainable": trainable, "adapters": adapters}


def summary(model: nnx.Module, freeze: Iterable[str]) -> str:
    """One line: trainable vs total parameters (and the adapters' share) under the ``freeze`` regexes."""
    c = parameter_counts(model, freeze)
    share = 100.0 * c["trainable"] / max(c["total"], 1)
    return (f"{c['trainable']:,} trainable of {c['total']:,} parameters ({share:.2f}%), "
            f"{c['adapters']:,} in LoRA adapters")
