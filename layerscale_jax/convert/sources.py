"""Sources of weights read into one form (``Source``: our flat names, the unrolled layout, the names and shapes
in the source for messages): a timm or official checkpoint (or an in-memory state dict), a ``save_pretrained``
directory (``params/`` orbax checkpoint and ``model.json``), and the encoder of an MAE pre-training checkpoint."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Mapping

import jax
import numpy as np
from etils import epath

from layerscale_jax.arch import MAEConfig, model_config
from layerscale_jax.convert.flat import flatten, unstack_blocks
from layerscale_jax.convert.naming import timm_to_ours
from layerscale_jax.errors import InputFileError
from layerscale_jax.paths import is_url, read_json

log = logging.getLogger(__name__)


MODEL_JSON = "model.json"
PARAMS_DIR = "params"
FORMAT = "layerscale_jax.params/v1"


@dataclasses.dataclass
class Source:
    """Tensors of a checkpoint in our flat naming and layout (unrolled), with their names in the source."""
    tensors: dict[str, np.ndarray]
    names: dict[str, str]                 # our key → the name in the source
    shapes: dict[str, tuple[int, ...]]    # our key → the shape in the source's layout
    convention: str                       # "timm" or "ours": how to print expected names and shapes
    description: str
    encoder_only: bool = False            # an MAE encoder: no head (nor fc_norm) to load


def encoder_of(src: Source) -> Source:
    """The encoder of an MAE pre-training checkpoint (``models.mae``): the decoder and the mask token are dropped;
    the classifier's head (and ``fc_norm``) keep their fresh initialisation when loaded (MAE's fine-tuning)."""
    dropped = [k for k in src.tensors if k == "mask_token" or k.startswith("decoder_")]
    keep = {k: v for k, v in src.tensors.items() if k not in dropped}
    log.info("%s: an MAE checkpoint; its encoder is used (%d decoder tensors dropped)", src.description, len(dropped))
    return Source(keep, {k: src.names[k] for k in keep}, {k: src.shapes[k] for k in keep}, src.convention,
                  f"the MAE encoder of {src.description}", encoder_only=True)


def timm_source(tensors: Mapping[str, np.ndarray], description: str) -> Source:
    out, names, shapes = {}, {}, {}
    for name, value in tensors.items():
        key, array = timm_to_ours(name, value)
        if key in out:
            raise InputFileError(f"{description}: {names[key]!r} and {name!r} both name our parameter {key!r}")
        out[key], names[key], shapes[key] = array, name, tuple(value.shape)
    return Source(out, names, shapes, "timm", description)


def read_model_json(path: str | Path) -> dict:
    """The ``model.json`` record of a ``save_pretrained`` directory."""
    path = epath.Path(path)
    record = read_json(path / MODEL_JSON, "convert the weights again (python -m layerscale_jax.convert "
                       "... --out DIR --overwrite) or save_pretrained(model, DIR, overwrite=True)")
    if record.get("format") != FORMAT:
        raise InputFileError(f"{str(path / MODEL_JSON)!r}: format {record.get('format')!r}, expected {FORMAT!r}")
    return record


def saved_config(path: str | Path, **overrides):
    """The architecture config of a ``save_pretrained`` directory, with ``overrides`` applied on top."""
    record = read_model_json(path)
    return model_config(record["model"], **{**record["overrides"], **overrides})


def orbax_source(path: Path) -> Source:
    import orbax.checkpoint as ocp

    cfg = saved_config(path)
    params_dir = path / PARAMS_DIR if is_url(path) else (path / PARAMS_DIR).absolute()
    checkpointer = ocp.StandardCheckpointer()
    tree = checkpointer.metadata(params_dir).item_metadata.tree
    sharding = jax.sharding.SingleDeviceSharding(host_device())
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding), tree)
    restored = checkpointer.restore(params_dir, abstract)
    flat = {k: np.asarray(v) for k, v in flatten(restored).items()}
    if cfg.scan_layers:
        flat = unstack_blocks(flat, cfg.depth)
    src = Source(flat, {k: k for k in flat}, {k: tuple(v.shape) for k, v in flat.items()}, "ours",
                 f"orbax checkpoint {str(path)!r}")
    return encoder_of(src) if isinstance(cfg, MAEConfig) else src


def host_device():
    try:
        return jax.local_devices(backend="cpu")[0]       # host memory: the arrays go through numpy anyway
    except RuntimeError:
        return jax.local_devices()[0]
