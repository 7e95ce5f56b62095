"""Training workdirs as a source of weights: the newest usable checkpoint (complete, and its files matching the
digests the run recorded), the experiment config stored with it, and its parameters or their EMA."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import jax
import numpy as np
from etils import epath

from layerscale_jax.arch import MAEConfig, model_config
from layerscale_jax.checksums import corruption
from layerscale_jax.convert.flat import flatten, unstack_blocks
from layerscale_jax.convert.sources import MODEL_JSON, Source, encoder_of, host_device
from layerscale_jax.errors import ConfigError, InputFileError
from layerscale_jax.paths import is_url

log = logging.getLogger(__name__)


CHECKPOINTS_DIR = "checkpoints"     # of a training workdir: <step>/state (orbax train state), <step>/config (JSON)


def is_training_workdir(path: str | Path) -> bool:
    """Whether ``path`` is a training workdir (it has a ``checkpoints/`` directory and no ``model.json``)."""
    path = epath.Path(path)              # gs://... too (pathlib would make it gs:/...)
    return (path / CHECKPOINTS_DIR).is_dir() and not (path / MODEL_JSON).is_file()


def workdir_checkpoint(workdir: str | Path, step: int | None = None) -> tuple[int, Path]:
    """``(step, directory)`` of the newest usable checkpoint of a training workdir (or of ``step``).

    Usable: orbax finished writing it (its directory has its final, numeric name), it holds both the train state and
    the config, and its files still match the SHA-256 digests the run recorded (``checkpoints/meta/<step>/``). A
    corrupt newest checkpoint is skipped with a warning, as a resumed run would; a corrupt ``step`` is an error.
    Raises ``FileNotFoundError`` naming the workdir when there is none.
    """
    root = epath.Path(workdir) / CHECKPOINTS_DIR
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
        raise InputFileError(f"training workdir {str(workdir)!r}: no usable checkpoint; corrupt: "
                             + "; ".join(f"step {s}: {r}" for s, r in corrupt.items()))
    raise FileNotFoundError(f"training workdir {str(workdir)!r} has no complete checkpoint in {str(root)!r}")


def checkpoint_config(directory: Path) -> dict:
    """The experiment config stored in the checkpoint ``directory`` (checked already)."""
    config_file = directory / "config" / "metadata"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise InputFileError(f"{str(config_file)!r}: the stored config cannot be read ({err})") from err
    if not isinstance(config.get("model"), dict) or "name" not in config["model"]:
        raise InputFileError(f"{str(config_file)!r}: the stored config has no model section with a name")
    return config


def workdir_model_config(config: dict, **overrides):
    model = dict(config["model"])
    return model["name"], model_config(model.pop("name"), **{**model, **overrides})


def workdir_source(workdir: Path, step: int | None = None, ema: bool | None = None,
                   checkpoint: tuple[int, Path] | None = None) -> Source:
    """The parameters of a training checkpoint (``ema``: its EMA; None: the EMA when the run kept one, as its
    evaluation did) in our flat naming, unrolled. ``checkpoint``: ``workdir_checkpoint``'s answer when the caller
    has it already (the files are checked, and a corrupt newest step reported, once)."""
    import orbax.checkpoint as ocp

    step, directory = checkpoint or workdir_checkpoint(workdir, step)
    _, cfg = workdir_model_config(checkpoint_config(directory))
    state_dir = directory / "state" if is_url(directory) else (directory / "state").absolute()
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)        # orbax warns that the state item has no step metadata of its own
    try:
        checkpointer = ocp.PyTreeCheckpointer()
        tree = checkpointer.metadata(state_dir).item_metadata.tree
        key = ("ema" if "ema" in tree else "params") if ema is None else ("ema" if ema else "params")
        if key not in tree:
            raise ConfigError(f"checkpoint {str(directory)!r} holds no EMA of the parameters "
                              "(the run had optim.ema_decay=0); export its parameters instead")
        sharding = jax.sharding.SingleDeviceSharding(host_device())
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
        flat = unstack_blocks(flat, cfg.depth)
    log.info("%s: the %s of the checkpoint at step %d", workdir, "EMA parameters" if key == "ema" else "parameters",
             step)
    src = Source(flat, {k: k for k in flat}, {k: tuple(v.shape) for k, v in flat.items()}, "ours",
                 f"training checkpoint {str(directory)!r} ({key})")
    return encoder_of(src) if isinstance(cfg, MAEConfig) else src
