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
import os
import shutil
from pathlib import Path
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from layerscale_jax.arch import list_models, model_config
from layerscale_jax.convert.files import flatten_tensors, is_timm_file, read_state_dict
from layerscale_jax.convert.flat import expected_params, natural_key, param_roles, param_tree, unrolled_params
from layerscale_jax.convert.matching import assign_params, plan_load
from layerscale_jax.convert.naming import family, is_fused_qkv, ours_to_timm, ours_to_timm_name, qkv_timm_order
from layerscale_jax.convert.sources import (
    FORMAT,
    MODEL_JSON,
    PARAMS_DIR,
    Source,
    orbax_source,
    saved_config,
    timm_source,
)
from layerscale_jax.convert.workdir import (
    CHECKPOINTS_DIR,
    checkpoint_config,
    is_training_workdir,
    workdir_checkpoint,
    workdir_model_config,
    workdir_source,
)
from layerscale_jax.errors import ConfigError, InputFileError, UserError
from layerscale_jax.models.registry import create_from_config, create_model
from layerscale_jax.paths import as_path, is_url
from layerscale_jax.orbax_failures import log_orbax_errors_on_one_line, release_waiting_save_threads


def load_pretrained(model: nnx.Module, source) -> nnx.Module:
    """Load ``source`` into ``model`` **in place** and return ``model`` (for chaining).

    ``source``: a timm/official checkpoint file (``.safetensors``, ``.npz``, ``.pth``/``.pt``/``.bin``), a
    ``save_pretrained`` directory, or a mapping ``timm name → array``. ``model`` supplies the layout, the dtypes,
    the shardings (of its current arrays) and, when ``num_classes`` differs, the freshly initialised head; it may
    be abstract (``nnx.eval_shape``) unless the head has to be re-initialised. Every problem is reported in one
    ValueError before anything is written.
    """
    src = _read_source(source)
    values, reinit_head = plan_load(model, src)
    if reinit_head and _is_abstract(model):
        raise ConfigError("the source has no usable head for this model (num_classes differs, or an MAE encoder), and "
                          "the model is abstract: build it with real parameters so that its freshly initialised head "
                          "can be kept")
    assign_params(model, values)
    return model


def _is_abstract(model: nnx.Module) -> bool:
    return any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(param_tree(model)))


def _read_source(source) -> Source:
    if isinstance(source, Source):
        return source
    if isinstance(source, Mapping):
        return timm_source(flatten_tensors(source), "the given state dict")
    # gs://... read as such (pathlib made it gs:/...); file://... local; another scheme: one line naming it
    path = as_path(source, "pretrained source") if is_url(os.fspath(source)) else epath.Path(source)
    if path.is_dir():
        if is_training_workdir(path):
            return workdir_source(path)
        if not (path / MODEL_JSON).is_file():
            raise InputFileError(f"{str(path)!r} is a directory without {MODEL_JSON} or {CHECKPOINTS_DIR}/: neither "
                                 "written by save_pretrained nor a training workdir")
        return orbax_source(path)
    if is_timm_file(path):
        return timm_source(read_state_dict(path), f"{str(path)!r}")
    if not path.exists():
        raise FileNotFoundError(f"pretrained source {str(path)!r} does not exist")
    raise InputFileError(f"{str(path)!r}: expected a .safetensors/.npz/.pth file, a save_pretrained directory or a "
                         "training workdir")


def _build_and_load(make, source, rngs: nnx.Rngs | None) -> nnx.Module:
    """Build ``make(rngs)`` abstractly, fill it from ``source``; initialise for real only to keep a fresh head."""
    src = _read_source(source)
    model = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
    values, reinit_head = plan_load(model, src)
    if reinit_head or jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param))):   # state a checkpoint does not fill
        model = make(rngs if rngs is not None else nnx.Rngs(0))
    assign_params(model, values)
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
        raise ConfigError("the model has LoRA adapters that are not merged: lora.merge(model) first, so the exported "
                          "weights include them")
    fam = family(model.cfg)
    specs, roles = expected_params(model), param_roles(model)
    untranslatable = [k for k, (shape, _) in specs.items() if ours_to_timm_name(k, len(shape), fam, roles[k]) is None]
    if untranslatable:
        raise ConfigError(f"timm has no name for {sorted(untranslatable, key=natural_key)} "
                          f"(branch_scaling={model.cfg.branch_scaling!r}); only layerscale and none export")
    out = {}
    for key, value in unrolled_params(model).items():
        if is_fused_qkv(key):
            value = qkv_timm_order(np.asarray(value), model.cfg.num_heads)
        name, array = ours_to_timm(key, value, fam, roles[key])
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
        raise ConfigError(f"name={name!r} is a {type(model_config(name)).__name__} model, "
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
        checkpointer.save(out / PARAMS_DIR, param_tree(model), force=overwrite)
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
    name, cfg = workdir_model_config(checkpoint_config(checkpoint[1]), **overrides)
    source = workdir_source(Path(workdir), ema=ema, checkpoint=checkpoint)
    return _build_and_load(lambda r: create_from_config(cfg, rngs=r), source, rngs), name
