"""Parameter names and layouts: timm's PyTorch state dicts ↔ our flat parameter keys.

Our flat keys are the paths of ``nnx.to_pure_dict(nnx.state(model, nnx.Param))`` in the *unrolled* layout joined
with dots, e.g. ``blocks.3.attn.qkv.kernel``. They mirror timm's names except for the leaf and the array layout:

    timm                                   ours                               array
    ``<linear>.weight`` (out, in)          ``<linear>.kernel`` (in, out)      transpose
    ``patch_embed.proj.weight`` (O,I,kh,kw) ``patch_embed.proj.kernel`` (kh,kw,I,O)  permute (2, 3, 1, 0)
    ``<norm>.weight``                      ``<norm>.scale``                   unchanged (LayerNorm)
    ``blocks.N.ls1.gamma`` (DeiT III)      ``blocks.N.ls1.gamma``             unchanged
    ``blocks.N.gamma_1`` (CaiT)            ``blocks.N.ls1.gamma``             unchanged
    ``blocks.N.attn.qkv.{weight,bias}``    ``blocks.N.attn.qkv.{kernel,bias}`` output columns [q | k | v] →
                                                                              heads-major (``qkv_heads_major``)

Official checkpoints are accepted too: tensors under a ``model`` (or ``state_dict``) key, a ``module.`` prefix
(official CaiT), ``gamma_1``/``gamma_2`` in DeiT III blocks (official FB DeiT III).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from layerscale_jax.arch import CaiTConfig, ViTConfig

# LayerNorm modules: their ``weight`` is our ``scale`` (no transpose).
NORM_MODULES = ("norm", "norm1", "norm2", "fc_norm")
# Axis permutations from timm's layout to ours, by the number of dimensions of a ``weight``.
_TO_OURS = {2: (1, 0), 4: (2, 3, 1, 0)}
_TO_TIMM = {2: (1, 0), 4: (3, 2, 0, 1)}
_WRAPPER_KEYS = ("model", "state_dict")
_GAMMA_OFFICIAL = re.compile(r"(^|\.)gamma_([12])$")


def is_fused_qkv(key: str) -> bool:
    """Our fused q/k/v projection (``<...>.attn.qkv.kernel`` / ``.bias``), whose output columns are heads-major."""
    return key.endswith((".attn.qkv.kernel", ".attn.qkv.bias"))


def qkv_heads_major(value: np.ndarray, num_heads: int) -> np.ndarray:
    """Last axis from timm's ``[q | k | v]`` (each ``heads × d_h``) to ours, heads-major ``(heads, 3, d_h)``."""
    *lead, n = value.shape
    return value.reshape(*lead, 3, num_heads, n // (3 * num_heads)).swapaxes(-3, -2).reshape(*lead, n)


def qkv_timm_order(value: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of ``qkv_heads_major``: our heads-major columns back to timm's ``[q | k | v]``."""
    *lead, n = value.shape
    return value.reshape(*lead, num_heads, 3, n // (3 * num_heads)).swapaxes(-3, -2).reshape(*lead, n)


def family(cfg) -> str:
    """``deit3`` or ``cait``: which timm naming the model's LayerScale keys use on export."""
    if isinstance(cfg, CaiTConfig):
        return "cait"
    if isinstance(cfg, ViTConfig):
        return "deit3"
    raise ValueError(f"no timm naming for config type {type(cfg).__name__}")


def to_numpy(value: Any) -> np.ndarray:
    """An array-like (numpy, jax, or a torch tensor, duck-typed so torch is never imported) as a numpy array."""
    if hasattr(value, "detach"):                      # torch.Tensor
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":      # numpy cannot view torch's bfloat16
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def unwrap_state_dict(state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
    """Tensors under a ``model`` / ``state_dict`` key (official and training checkpoints) are taken from there."""
    for key in _WRAPPER_KEYS:
        inner = state_dict.get(key)
        if isinstance(inner, Mapping):
            return unwrap_state_dict(inner)
    return state_dict


def canonical_timm_name(name: str) -> str:
    """Official names → timm's: drop a ``module.`` prefix, ``gamma_1``/``gamma_2`` → ``ls1.gamma``/``ls2.gamma``."""
    if name.startswith("module."):
        name = name[len("module."):]
    return _GAMMA_OFFICIAL.sub(lambda m: f"{m.group(1)}ls{m.group(2)}.gamma", name)


def timm_to_ours(name: str, value: np.ndarray) -> tuple[str, np.ndarray]:
    """One timm (or official) tensor → ``(our flat key, array in our layout)``.

    Names we do not know are passed through (with ``weight`` → ``kernel`` as for any Linear), so that the
    caller reports them as unexpected keys.
    """
    name = canonical_timm_name(name)
    parts = name.split(".")
    if parts[-1] != "weight":
        return name, value
    module = parts[-2] if len(parts) > 1 else ""
    if module in NORM_MODULES:
        return ".".join(parts[:-1] + ["scale"]), value
    perm = _TO_OURS.get(value.ndim)
    if perm is None:
        return name, value
    return ".".join(parts[:-1] + ["kernel"]), np.transpose(value, perm)


def ours_to_timm_name(key: str, ndim: int, fam: str, role: str | None) -> str | None:
    """Our flat key of a parameter with ``role`` (``layers.params``) → timm's name; ``None`` where timm has no such
    parameter (a scalar branch multiplier, a LoRA factor) or the key is not one of the model's parameters
    (``role=None``). The role decides, not the leaf's name: kernels become ``weight`` (Dense and Conv layouts),
    LayerNorm scales ``weight``, LayerScale's λ of branch ``lsN`` timm's ``lsN.gamma`` (DeiT III) or ``gamma_N``
    (CaiT); biases, the class token and position embeddings keep our key."""
    parts = key.split(".")
    if role == "norm":
        return ".".join(parts[:-1] + ["weight"])
    if role == "weight":
        return ".".join(parts[:-1] + ["weight"]) if ndim in _TO_TIMM else None
    if role == "layerscale" and len(parts) >= 2 and parts[-2] in ("ls1", "ls2"):
        branch = parts[-2][-1]
        return ".".join(parts[:-2] + [f"gamma_{branch}"] if fam == "cait" else parts[:-1] + ["gamma"])
    if role in ("bias", "token", "position"):
        return key
    return None


def ours_to_timm(key: str, value: np.ndarray, fam: str, role: str) -> tuple[str | None, np.ndarray]:
    """One of our parameters (with its ``role``) → ``(timm name or None, array in timm's layout)``."""
    name = ours_to_timm_name(key, value.ndim, fam, role)
    if role == "weight" and name is not None:
        value = np.transpose(value, _TO_TIMM[value.ndim])
    return name, value


def timm_shape(key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape our parameter ``key`` of ``shape`` has in timm's layout (for error messages)."""
    if key.endswith(".kernel") and len(shape) in _TO_TIMM:
        return tuple(shape[i] for i in _TO_TIMM[len(shape)])
    return tuple(shape)
