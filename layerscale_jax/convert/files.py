"""Reading and writing timm-style weight files: ``.safetensors`` and ``.npz`` (no torch), ``.pth``/``.pt``/``.bin``
(torch, imported only here, and only with ``weights_only=True`` so that no arbitrary object is unpickled)."""
from __future__ import annotations

import contextlib
import io
import zipfile
from pathlib import Path
from typing import Mapping

import numpy as np
from etils import epath

from layerscale_jax.convert.naming import to_numpy, unwrap_state_dict
from layerscale_jax.errors import InputFileError, UserError
from layerscale_jax.paths import is_url


class MissingDependencyError(UserError, ImportError):
    """An optional package (torch, for .pth files) is needed for this input."""

TORCH_SUFFIXES = (".pth", ".pt", ".bin")
TIMM_SUFFIXES = (".safetensors", ".npz") + TORCH_SUFFIXES


def is_timm_file(path: str | Path) -> bool:
    return Path(path).suffix in TIMM_SUFFIXES


def read_state_dict(path: str | Path) -> dict[str, np.ndarray]:
    """A timm or official checkpoint file as a flat ``name → numpy array`` mapping (wrappers such as ``model``
    removed; the names are left as in the file)."""
    path = epath.Path(path)              # gs://... too: read whole into memory (pathlib would make it gs:/...)
    if path.is_dir():
        raise IsADirectoryError(f"weights file {str(path)!r} is a directory")
    if not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
    suffix = path.suffix
    if suffix == ".safetensors":
        from safetensors.numpy import load, load_file
        try:
            tensors = load(path.read_bytes()) if is_url(path) else load_file(str(path))
        except Exception as err:  # safetensors raises its own SafetensorError (header too large, truncated, ...)
            raise InputFileError(f"{str(path)!r} is not a valid safetensors file ({err})") from err
    elif suffix == ".npz":
        try:
            with np.load(io.BytesIO(path.read_bytes()) if is_url(path) else path, allow_pickle=False) as npz:
                tensors = {k: npz[k] for k in npz.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
            raise InputFileError(f"{str(path)!r} is not a valid .npz file of arrays ({err})") from err
        except AttributeError as err:   # np.load returned a single array (an .npy file named .npz)
            raise InputFileError(f"{str(path)!r} is not a valid .npz file of arrays (it holds one array)") from err
    elif suffix in TORCH_SUFFIXES:
        tensors = _torch_load(path)
    else:
        raise InputFileError(f"{str(path)!r}: unknown weights format {suffix!r}; expected one of {TIMM_SUFFIXES} "
                             "or an orbax directory written by save_pretrained")
    return flatten_tensors(tensors)


def _torch_load(path: Path) -> Mapping:
    try:
        import torch
    except ImportError as err:
        raise MissingDependencyError(f"reading {str(path)!r} needs torch (pip install 'layerscale-jax[timm]'); "
                          "safetensors and npz files need no torch") from err
    try:
        return torch.load(io.BytesIO(path.read_bytes()) if is_url(path) else str(path), map_location="cpu",
                          weights_only=True)
    except Exception as err:  # torch raises UnpicklingError for anything beyond tensors and containers
        raise InputFileError(
            f"{str(path)!r} could not be read with torch.load(weights_only=True) (it holds more than tensors, "
            f"e.g. pickled training arguments): {err}. Re-save only its state dict, or convert it to safetensors "
            "in a trusted environment; arbitrary pickles are never loaded here.") from err


def flatten_tensors(tensors: Mapping) -> dict[str, np.ndarray]:
    """Unwrap ``model``/``state_dict`` and turn every tensor into numpy; non-tensor entries are dropped."""
    tensors = unwrap_state_dict(tensors)
    out = {}
    for name, value in tensors.items():
        if isinstance(value, (int, float, str, bytes, type(None))) or isinstance(value, Mapping):
            continue                                      # e.g. an 'epoch' next to the tensors
        out[str(name)] = to_numpy(value)
    return out


def write_state_dict(tensors: Mapping[str, np.ndarray], path: str | Path) -> Path:
    """Write ``name → array`` as ``.safetensors`` or ``.npz`` (by suffix). npz has no bfloat16: such arrays are
    written as float32 there (exactly). The file is written beside ``path`` and renamed over it when whole: a failed
    write (a full or read-only disk: one ``UserError`` naming the file) leaves no partial file."""
    path = Path(path)
    if path.suffix not in (".safetensors", ".npz"):
        raise InputFileError(f"{str(path)!r}: export writes .safetensors or .npz, not {path.suffix!r}")
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    partial = path.with_name(path.name + ".partial" + path.suffix)    # renamed over path once whole
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".safetensors":
            from safetensors.numpy import save_file
            save_file(arrays, str(partial))
        else:
            np.savez(partial, **{k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v
                                 for k, v in arrays.items()})
        partial.replace(path)
    except Exception as err:  # safetensors wraps a full or read-only disk in its own SafetensorError
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise UserError(f"writing {str(path)!r} failed ({' '.join(str(err).split())}); free space or choose "
                        "another file") from err
    return path
