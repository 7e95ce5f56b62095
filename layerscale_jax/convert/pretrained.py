"""Loading pretrained weights into a model, and saving a model's weights for later fine-tuning.

Sources (``load_pretrained``):
- a timm or official DeiT III / CaiT checkpoint: ``.safetensors``, ``.npz``, ``.pth``/``.pt``/``.bin`` (the latter
  through ``torch.load(weights_only=True)``), or an in-memory mapping ``name → array``;
- a directory written by ``save_pretrained``: an orbax checkpoint of the ``nnx.Param`` pure dict in ``params/``
  and ``model.json`` (the registry name and the overrides that rebuild the architecture);
- a training workdir (``python -m layerscale_jax.train --workdir DIR``): the parameters (or their EMA) of its newest
  complete checkpoint in ``DIR/checkpoints/<step>/``, whose stored config says which model they belong to
  (``load_workdir``).

Loading adapts what a fine-tuning run legitimately changes and refuses everything else:
- the block layout (unrolled ↔ scanned) is converted;
- ``pos_embed`` is resampled to the target grid (bicubic with antialiasing, as timm's ``resample_abs_pos_embed``);
- the head is kept at the target's fresh initialisation when only ``num_classes`` differs (logged);
- any other missing key, unexpected key or shape mismatch raises one ``ValueError`` naming every offending key with
  the expected and found shapes, and the model is left untouched.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from layerscale_jax.checksums import corruption
from layerscale_jax.cli import UserError
from layerscale_jax.convert.files import flatten_tensors, is_timm_file, read_state_dict
from layerscale_jax.convert.naming import (family, is_fused_qkv, ours_to_timm, ours_to_timm_name, qkv_heads_major,
                                          qkv_timm_order, timm_shape, timm_to_ours)
from layerscale_jax.layers.lora import is_adapter_path
from layerscale_jax.models.layout import STACKED_KEY
from layerscale_jax.models.mae import MAEConfig
from layerscale_jax.models.registry import create_from_config, create_model, list_models, model_config
from layerscale_jax.orbax_failures import log_orbax_errors_on_one_line, release_waiting_save_threads
from layerscale_jax.paths import read_json

log = logging.getLogger(__name__)

MODEL_JSON = "model.json"
PARAMS_DIR = "params"
CHECKPOINTS_DIR = "checkpoints"     # of a training workdir: <step>/state (orbax train state), <step>/config (JSON)
FORMAT = "layerscale_jax.params/v1"
STACKED = STACKED_KEY       # "blocks": the only subtree whose layout depends on scan_layers


# ---------------------------------------------------------------------------------------------------------------
# Flat parameter dicts: "blocks.3.attn.qkv.kernel" → array, always in the unrolled layout.

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


def _natural(key: str):
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split("."))


def _unstack(flat: Mapping[str, Any], depth: int, take=lambda value, i: value[i]) -> dict[str, Any]:
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


def _stack(flat: Mapping[str, np.ndarray], depth: int) -> dict[str, np.ndarray]:
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


def _param_tree(model: nnx.Module) -> dict:
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _expected_params(model: nnx.Module) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Our flat key → (shape, dtype) of every parameter of ``model``, in the unrolled layout. LoRA adapters are
    not part of a pre-trained checkpoint: they keep their initialisation (``layers.lora``)."""
    specs = {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in flatten(_param_tree(model)).items()
             if not is_adapter_path(k)}
    if model.cfg.scan_layers:
        specs = _unstack(specs, model.cfg.depth, take=lambda spec, i: (spec[0][1:], spec[1]))
    return specs


def unrolled_params(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's parameters as numpy arrays keyed by our flat names, in the unrolled layout."""
    flat = {k: np.asarray(v) for k, v in flatten(_param_tree(model)).items() if not is_adapter_path(k)}
    return _unstack(flat, model.cfg.depth) if model.cfg.scan_layers else flat


# ---------------------------------------------------------------------------------------------------------------
# Position embedding resampling.

def resize_pos_embed(pos_embed: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Resample a ``(1, H·W, D)`` position embedding (patch tokens only) to ``grid`` = (h, w).

    Bicubic with antialiasing in float32, the interpolation timm's ``resample_abs_pos_embed`` uses by default
    (``jax.image.resize(..., 'cubic', antialias=True)`` reproduces it to ~1e-6, upsampling and downsampling).
    """
    _, n, d = pos_embed.shape
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"pos_embed with {n} tokens is not a square grid; cannot resample it to {grid}")
    x = jnp.asarray(pos_embed.reshape(side, side, d), jnp.float32)
    y = jax.image.resize(x, (grid[0], grid[1], d), method="cubic", antialias=True)
    return np.asarray(y).reshape(1, grid[0] * grid[1], d).astype(pos_embed.dtype)


def _resizable(found: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    return (len(found) == 3 and found[0] == 1 and found[2] == expected[2]
            and math.isqrt(found[1]) ** 2 == found[1])


# ---------------------------------------------------------------------------------------------------------------
# Sources.

@dataclasses.dataclass
class _Source:
    """Tensors of a checkpoint in our flat naming and layout (unrolled), with their names in the source."""
    tensors: dict[str, np.ndarray]
    names: dict[str, str]                 # our key → the name in the source
    shapes: dict[str, tuple[int, ...]]    # our key → the shape in the source's layout
    convention: str                       # "timm" or "ours": how to print expected names and shapes
    description: str
    encoder_only: bool = False            # an MAE encoder: no head (nor fc_norm) to load


def _encoder_of(src: _Source) -> _Source:
    """The encoder of an MAE pre-training checkpoint (``models.mae``): the decoder and the mask token are dropped;
    the classifier's head (and ``fc_norm``) keep their fresh initialisation when loaded (MAE's fine-tuning)."""
    dropped = [k for k in src.tensors if k == "mask_token" or k.startswith("decoder_")]
    keep = {k: v for k, v in src.tensors.items() if k not in dropped}
    log.info("%s: an MAE checkpoint; its encoder is used (%d decoder tensors dropped)", src.description, len(dropped))
    return _Source(keep, {k: src.names[k] for k in keep}, {k: src.shapes[k] for k in keep}, src.convention,
                   f"the MAE encoder of {src.description}", encoder_only=True)


def _timm_source(tensors: Mapping[str, np.ndarray], description: str) -> _Source:
    out, names, shapes = {}, {}, {}
    for name, value in tensors.items():
        key, array = timm_to_ours(name, value)
        if key in out:
            raise ValueError(f"{description}: {names[key]!r} and {name!r} both name our parameter {key!r}")
        out[key], names[key], shapes[key] = array, name, tuple(value.shape)
    return _Source(out, names, shapes, "timm", description)


def read_model_json(path: str | Path) -> dict:
    """The ``model.json`` record of a ``save_pretrained`` directory."""
    path = Path(path)
    record = read_json(epath.Path(path) / MODEL_JSON, "convert the weights again (python -m layerscale_jax.convert "
                       "... --out DIR --overwrite) or save_pretrained(model, DIR, overwrite=True)")
    if record.get("format") != FORMAT:
        raise ValueError(f"{str(path / MODEL_JSON)!r}: format {record.get('format')!r}, expected {FORMAT!r}")
    return record


def saved_config(path: str | Path, **overrides):
    """The architecture config of a ``save_pretrained`` directory, with ``overrides`` applied on top."""
    record = read_model_json(path)
    return model_config(record["model"], **{**record["overrides"], **overrides})


def _orbax_source(path: Path) -> _Source:
    import orbax.checkpoint as ocp

    cfg = saved_config(path)
    params_dir = (path / PARAMS_DIR).absolute()
    checkpointer = ocp.StandardCheckpointer()
    tree = checkpointer.metadata(params_dir).item_metadata.tree
    sharding = jax.sharding.SingleDeviceSharding(_host_device())
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding), tree)
    restored = checkpointer.restore(params_dir, abstract)
    flat = {k: np.asarray(v) for k, v in flatten(restored).items()}
    if cfg.scan_layers:
        flat = _unstack(flat, cfg.depth)
    src = _Source(flat, {k: k for k in flat}, {k: tuple(v.shape) for k, v in flat.items()}, "ours",
                  f"orbax checkpoint {str(path)!r}")
    return _encoder_of(src) if isinstance(cfg, MAEConfig) else src


# ---------------------------------------------------------------------------------------------------------------
# Training workdirs.

def is_training_workdir(path: str | Path) -> bool:
    """Whether ``path`` is a training workdir (it has a ``checkpoints/`` directory and no ``model.json``)."""
    path = Path(path)
    return (path / CHECKPOINTS_DIR).is_dir() and not (path / MODEL_JSON).is_file()


def workdir_checkpoint(workdir: str | Path, step: int | None = None) -> tuple[int, Path]:
    """``(step, directory)`` of the newest usable checkpoint of a training workdir (or of ``step``).

    Usable: orbax finished writing it (its directory has its final, numeric name), it holds both the train state and
    the config, and its files still match the SHA-256 digests the run recorded (``checkpoints/meta/<step>/``). A
    corrupt newest checkpoint is skipped with a warning, as a resumed run would; a corrupt ``step`` is an error.
    Raises ``FileNotFoundError`` naming the workdir when there is none.
    """
    root = Path(workdir) / CHECKPOINTS_DIR
    steps = sorted((int(d.name) for d in root.iterdir() if d.name.isdigit() and (d / "state").is_dir()
                    and (d / "config").is_dir()), reverse=True) if root.is_dir() else []
    if step is not None and step not in steps:
        raise FileNotFoundError(f"training workdir {str(workdir)!r} has no complete checkpoint at step {step} "
                                f"(complete steps: {sorted(steps)})")
    corrupt = {}
    for candidate in [step] if step is not None else steps:
        reason = corruption(root / str(candidate), root / "meta" / str(candidate) / "checksums.json")
        if reason is None:
            return candidate, root / str(candidate)
        corrupt[candidate] = reason
        log.warning("%s: the checkpoint at step %d is corrupt (%s); skipped", workdir, candidate, reason)
    if corrupt:
        raise ValueError(f"training workdir {str(workdir)!r}: no usable checkpoint; corrupt: "
                         + "; ".join(f"step {s}: {r}" for s, r in corrupt.items()))
    raise FileNotFoundError(f"training workdir {str(workdir)!r} has no complete checkpoint in {str(root)!r}")


def workdir_config(workdir: str | Path, step: int | None = None) -> dict:
    """The experiment config stored with a training workdir's newest complete checkpoint (or ``step``'s)."""
    _, directory = workdir_checkpoint(workdir, step)
    return checkpoint_config(directory)


def checkpoint_config(directory: Path) -> dict:
    """The experiment config stored in the checkpoint ``directory`` (checked already)."""
    config_file = directory / "config" / "metadata"
    try:
        with open(config_file) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{str(config_file)!r}: the stored config cannot be read ({err})") from err
    if not isinstance(config.get("model"), dict) or "name" not in config["model"]:
        raise ValueError(f"{str(config_file)!r}: the stored config has no model section with a name")
    return config


def _workdir_model_config(config: dict, **overrides):
    model = dict(config["model"])
    return model["name"], model_config(model.pop("name"), **{**model, **overrides})


def _workdir_source(workdir: Path, step: int | None = None, ema: bool | None = None,
                    checkpoint: tuple[int, Path] | None = None) -> _Source:
    """The parameters of a training checkpoint (``ema``: its EMA; None: the EMA when the run kept one, as its
    evaluation did) in our flat naming, unrolled. ``checkpoint``: ``workdir_checkpoint``'s answer when the caller
    has it already (the files are checked, and a corrupt newest step reported, once)."""
    import orbax.checkpoint as ocp

    step, directory = checkpoint or workdir_checkpoint(workdir, step)
    _, cfg = _workdir_model_config(checkpoint_config(directory))
    state_dir = (directory / "state").absolute()
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)        # orbax warns that the state item has no step metadata of its own
    try:
        checkpointer = ocp.PyTreeCheckpointer()
        tree = checkpointer.metadata(state_dir).item_metadata.tree
        key = ("ema" if "ema" in tree else "params") if ema is None else ("ema" if ema else "params")
        if key not in tree:
            raise ValueError(f"checkpoint {str(directory)!r} holds no EMA of the parameters "
                             "(the run had optim.ema_decay=0); export its parameters instead")
        sharding = jax.sharding.SingleDeviceSharding(_host_device())
        abstract = {key: jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding),
                                      tree[key])}
        restored = checkpointer.restore(state_dir, args=ocp.args.PyTreeRestore(
            item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True))
    finally:
        absl_logger.setLevel(level)
    flat = {}
    for name, value in flatten(restored[key]).items():
        flat[name[:-len(".value")] if name.endswith(".value") else name] = np.asarray(value)
    if cfg.scan_layers:
        flat = _unstack(flat, cfg.depth)
    log.info("%s: the %s of the checkpoint at step %d", workdir, "EMA parameters" if key == "ema" else "parameters",
             step)
    src = _Source(flat, {k: k for k in flat}, {k: tuple(v.shape) for k, v in flat.items()}, "ours",
                  f"training checkpoint {str(directory)!r} ({key})")
    return _encoder_of(src) if isinstance(cfg, MAEConfig) else src


def _host_device():
    try:
        return jax.local_devices(backend="cpu")[0]       # host memory: the arrays go through numpy anyway
    except RuntimeError:
        return jax.local_devices()[0]


def _read_source(source) -> _Source:
    if isinstance(source, _Source):
        return source
    if isinstance(source, Mapping):
        return _timm_source(flatten_tensors(source), "the given state dict")
    path = Path(source)
    if path.is_dir():
        if is_training_workdir(path):
            return _workdir_source(path)
        if not (path / MODEL_JSON).is_file():
            raise ValueError(f"{str(path)!r} is a directory without {MODEL_JSON} or {CHECKPOINTS_DIR}/: neither "
                             "written by save_pretrained nor a training workdir")
        return _orbax_source(path)
    if is_timm_file(path):
        return _timm_source(read_state_dict(path), f"{str(path)!r}")
    if not path.exists():
        raise FileNotFoundError(f"pretrained source {str(path)!r} does not exist")
    raise ValueError(f"{str(path)!r}: expected a .safetensors/.npz/.pth file, a save_pretrained directory or a "
                     "training workdir")


# ---------------------------------------------------------------------------------------------------------------
# Matching a source against a model.

def _show(key: str, src: _Source, fam: str, ndim: int) -> str:
    if key in src.names:
        name = src.names[key]
    elif src.convention == "timm":
        name = ours_to_timm_name(key, ndim, fam) or key
    else:
        name = key
    return repr(name) if name == key else f"{name!r} (ours {key!r})"


def _shape_in_source(key: str, shape: tuple[int, ...], src: _Source) -> tuple[int, ...]:
    return timm_shape(key, shape) if src.convention == "timm" else tuple(shape)


def _source_arch(src: _Source) -> dict[str, Any]:
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


def _hints(cfg, src: _Source, missing: list[str], unexpected: list[str]) -> list[str]:
    hints = [f"hint: the source has {field}={value!r}, the model {field}={getattr(cfg, field)!r}"
             for field, value in _source_arch(src).items() if hasattr(cfg, field) and getattr(cfg, field) != value]
    if "fc_norm.scale" in missing and "norm.scale" in unexpected:
        hints.append("hint: the source has a final 'norm' (global_pool='token'); build the model with "
                     "global_pool='token'")
    if "norm.scale" in missing and "fc_norm.scale" in unexpected:
        hints.append("hint: the source has 'fc_norm' (global_pool='avg'); build the model with global_pool='avg'")
    return hints


def _plan(model: nnx.Module, src: _Source) -> tuple[dict[str, np.ndarray], bool]:
    """Validate ``src`` against ``model`` and adapt it; returns (the values to load, whether the head keeps the
    model's initialisation because only ``num_classes`` differs).

    Raises one ValueError listing every problem; nothing is modified here.
    """
    cfg = model.cfg
    fam = family(cfg)
    expected = _expected_params(model)
    fresh: list[str] = []
    if src.encoder_only:   # MAE encoder → classifier: a new head; with global_pool='avg' a new fc_norm, no norm
        fresh = sorted(k for k in expected if k.split(".")[0] in ("head", "fc_norm") and k not in src.tensors)
        if "norm.scale" not in expected:
            src = dataclasses.replace(src, tensors={k: v for k, v in src.tensors.items()
                                                    if k.split(".")[0] != "norm"})
    missing = sorted(set(expected) - set(src.tensors) - set(fresh), key=_natural)
    unexpected = sorted(set(src.tensors) - set(expected), key=_natural)

    head_k = src.tensors.get("head.kernel")
    head_b = src.tensors.get("head.bias")
    want_k = expected["head.kernel"][0]
    reinit_head = (head_k is not None and head_k.ndim == 2 and head_k.shape != want_k
                   and head_k.shape[0] == want_k[0]
                   and (head_b is None or tuple(head_b.shape) == (head_k.shape[1],)))

    values, mismatched = {}, []
    for key in sorted(set(expected) & set(src.tensors), key=_natural):
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
            lines += [f"  {_show(k, src, fam, len(expected[k][0]))}: expected shape "
                      f"{_shape_in_source(k, expected[k][0], src)}" for k in missing]
        if unexpected:
            lines.append(f"{len(unexpected)} unexpected key(s) (in the source, not in the model):")
            lines += [f"  {_show(k, src, fam, src.tensors[k].ndim)}: found shape {src.shapes[k]}" for k in unexpected]
        if mismatched:
            lines.append(f"{len(mismatched)} shape mismatch(es):")
            lines += [f"  {_show(k, src, fam, len(expected[k][0]))}: expected shape "
                      f"{_shape_in_source(k, expected[k][0], src)}, found {src.shapes[k]}" for k in mismatched]
        raise ValueError("\n".join(lines))

    if reinit_head:
        log.warning("num_classes differs (source head %s, model %d classes): the head keeps its fresh "
                    "initialisation, everything else is loaded", tuple(head_k.shape[::-1]), cfg.num_classes)
    if fresh:
        log.warning("%s has no %s: kept at their fresh initialisation, everything else is loaded",
                    src.description, ", ".join(fresh))
    return values, reinit_head or bool(fresh)


def _assign(model: nnx.Module, values: Mapping[str, np.ndarray]) -> None:
    """Write ``values`` (unrolled flat keys) into ``model``, in its layout, dtypes and shardings."""
    if model.cfg.scan_layers:
        values = _stack(values, model.cfg.depth)
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


# ---------------------------------------------------------------------------------------------------------------
# Public API.

def load_pretrained(model: nnx.Module, source) -> nnx.Module:
    """Load ``source`` into ``model`` **in place** and return ``model`` (for chaining).

    ``source``: a timm/official checkpoint file (``.safetensors``, ``.npz``, ``.pth``/``.pt``/``.bin``), a
    ``save_pretrained`` directory, or a mapping ``timm name → array``. ``model`` supplies the layout, the dtypes,
    the shardings (of its current arrays) and, when ``num_classes`` differs, the freshly initialised head; it may
    be abstract (``nnx.eval_shape``) unless the head has to be re-initialised. Every problem is reported in one
    ValueError before anything is written.
    """
    src = _read_source(source)
    values, reinit_head = _plan(model, src)
    if reinit_head and _is_abstract(model):
        raise ValueError("the source has no usable head for this model (num_classes differs, or an MAE encoder), and "
                         "the model is abstract: build it with real parameters so that its freshly initialised head "
                         "can be kept")
    _assign(model, values)
    return model


def _is_abstract(model: nnx.Module) -> bool:
    return any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(_param_tree(model)))


def _build_and_load(make, source, rngs: nnx.Rngs | None) -> nnx.Module:
    """Build ``make(rngs)`` abstractly, fill it from ``source``; initialise for real only to keep a fresh head."""
    src = _read_source(source)
    model = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
    values, reinit_head = _plan(model, src)
    if reinit_head or jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param))):   # state a checkpoint does not fill
        model = make(rngs if rngs is not None else nnx.Rngs(0))
    _assign(model, values)
    return model


def from_timm(name: str, source, *, rngs: nnx.Rngs | None = None, **overrides) -> nnx.Module:
    """``create_model(name, **overrides)`` holding the weights of ``source`` (see ``load_pretrained``).

    ``overrides`` may change the layout (``scan_layers``), ``img_size`` (pos_embed is resampled) and ``num_classes``
    (the head is initialised from ``rngs``); architecture fields must match the checkpoint. Parameters are only
    initialised when the head needs it; otherwise the model is built abstractly and filled from ``source``.
    """
    return _build_and_load(lambda r: create_model(name, rngs=r, **overrides), source, rngs)


def to_timm(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's parameters as a timm state dict (timm names and PyTorch layouts, numpy arrays).

    ``timm.create_model(name, **same_arch).load_state_dict({k: torch.from_numpy(v) ...}, strict=True)`` accepts
    it. Raises ValueError for parameters timm has no name for (``branch_scaling`` other than layerscale/none).
    """
    from layerscale_jax.layers.lora import adapted_layers
    if any(not layer.lora_merged for _, layer in adapted_layers(model)):
        raise ValueError("the model has LoRA adapters that are not merged: lora.merge(model) first, so the exported "
                         "weights include them")
    fam = family(model.cfg)
    specs = _expected_params(model)
    untranslatable = [k for k, (shape, _) in specs.items() if ours_to_timm_name(k, len(shape), fam) is None]
    if untranslatable:
        raise ValueError(f"timm has no name for {sorted(untranslatable, key=_natural)} "
                         f"(branch_scaling={model.cfg.branch_scaling!r}); only layerscale and none export")
    out = {}
    for key, value in unrolled_params(model).items():
        if is_fused_qkv(key):
            value = qkv_timm_order(np.asarray(value), model.cfg.num_heads)
        name, array = ours_to_timm(key, value, fam)
        out[name] = np.array(array)                       # a contiguous, writable copy
    return out


def _jsonable(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return jnp.dtype(value).name                           # dtype fields


def _registry_record(cfg, name: str | None) -> dict:
    arch = {f.name: _jsonable(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}

    def overrides_for(candidate):
        base = model_config(candidate)
        return {k: v for k, v in arch.items() if _jsonable(getattr(base, k)) != v}

    if name is None:
        candidates = [n for n in list_models() if type(model_config(n)) is type(cfg)]
        name = min(candidates, key=lambda n: len(overrides_for(n)))
    elif type(model_config(name)) is not type(cfg):
        raise ValueError(f"name={name!r} is a {type(model_config(name)).__name__} model, "
                         f"but the model has a {type(cfg).__name__}")
    return {"format": FORMAT, "model": name, "overrides": overrides_for(name),
            "config_class": type(cfg).__name__, "arch": arch}


def save_pretrained(model: nnx.Module, out_dir: str | Path, *, name: str | None = None,
                    overwrite: bool = False) -> Path:
    """Write ``out_dir/params`` (orbax checkpoint of ``nnx.to_pure_dict(nnx.state(model, nnx.Param))``) and
    ``out_dir/model.json`` (registry ``name`` — by default the registered name closest to ``model.cfg`` — plus the
    overrides that rebuild ``model.cfg`` exactly, and every architecture field for reference)."""
    import orbax.checkpoint as ocp

    out = Path(out_dir).absolute()
    record = _registry_record(model.cfg, name)
    if (out / PARAMS_DIR).exists() and not overwrite:
        raise FileExistsError(f"{str(out / PARAMS_DIR)!r} exists; pass overwrite=True (--overwrite) to replace it")
    log_orbax_errors_on_one_line()
    checkpointer = ocp.StandardCheckpointer()
    try:
        checkpointer.save(out / PARAMS_DIR, _param_tree(model), force=overwrite)
        checkpointer.wait_until_finished()
        if jax.process_index() == 0:
            with open(out / MODEL_JSON, "w") as f:
                json.dump(record, f, indent=2)
                f.write("\n")
    except Exception as err:
        release_waiting_save_threads()            # orbax's threads end now, not at its barrier's timeout
        gc.collect()                              # its failed asyncio tasks report now, before the error line
        for partial in out.glob(f"{PARAMS_DIR}.orbax-checkpoint-tmp*"):
            shutil.rmtree(partial, ignore_errors=True)
        raise UserError(f"writing {str(out)!r} failed ({type(err).__name__}: {' '.join(str(err).split())}); "
                        "free space or choose another directory") from err
    return out


def load_model(path: str | Path, *, rngs: nnx.Rngs | None = None, **overrides) -> nnx.Module:
    """Rebuild the model saved in a ``save_pretrained`` directory (``overrides`` on top, e.g. ``scan_layers``)
    and load its weights."""
    cfg = saved_config(path, **overrides)
    return _build_and_load(lambda r: create_from_config(cfg, rngs=r), path, rngs)


def load_workdir(workdir: str | Path, *, step: int | None = None, ema: bool | None = None,
                 rngs: nnx.Rngs | None = None, checkpoint: tuple[int, Path] | None = None,
                 **overrides) -> tuple[nnx.Module, str]:
    """``(model, registry name)``: the model a training run built (from the config stored with its checkpoint,
    ``overrides`` on top, e.g. ``scan_layers``) holding the parameters of its newest complete checkpoint (or of
    ``step``). ``ema``: True for the EMA of the parameters, False for the parameters, None (default) for the EMA
    when the run kept one (the weights its evaluation used). ``checkpoint``: ``workdir_checkpoint``'s answer when
    the caller has it already (its files are not hashed again; ``step`` is then not used)."""
    checkpoint = checkpoint or workdir_checkpoint(workdir, step)
    name, cfg = _workdir_model_config(checkpoint_config(checkpoint[1]), **overrides)
    source = _workdir_source(Path(workdir), ema=ema, checkpoint=checkpoint)
    return _build_and_load(lambda r: create_from_config(cfg, rngs=r), source, rngs), name
