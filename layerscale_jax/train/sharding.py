"""Device mesh and sharding rules: logical axis names on parameters, mapped to mesh axes by rules in the config.

The mesh has three axes, ``data`` (pure data parallel), ``fsdp`` (data parallel with parameters and optimizer
state sharded) and ``tensor`` (tensor-parallel attention heads and MLP hidden units). The batch is split over
``data`` and ``fsdp``. Each parameter has logical axis names (``embed``, ``heads``, ``mlp``, ``classes``,
``layers``), and the config's rules map each logical name to a mesh axis (or ``None``: replicated), e.g.
``embed → fsdp``, ``heads → tensor``, ``mlp → tensor``. A dimension that the mesh axis does not divide stays
replicated.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from layerscale_jax.layers.partitioning import activation_sharding, logical_to_spec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Default logical → mesh axis rules: FSDP over the embedding dimension, tensor parallelism over heads and MLP.
DEFAULT_RULES = (
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("classes", None),
    ("layers", None),
)


def make_mesh(mesh_config: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``data × fsdp × tensor`` mesh; one size may be -1 (all remaining devices).

    Axis types are ``Auto`` on purpose: the train step states its shardings explicitly at the jit boundary and
    lets XLA's partitioner propagate them inside, as pjit did.
    """
    devices = list(devices if devices is not None else jax.devices())
    sizes = {}
    for axis in MESH_AXES:
        value = mesh_config.get(axis, 1)
        if not isinstance(value, int) or (value < 1 and value != -1):
            raise ValueError(f"mesh.{axis}={value!r} must be a positive integer or -1")
        sizes[axis] = value
    unknown = [a for a in sizes if sizes[a] == -1]
    if len(unknown) > 1:
        raise ValueError(f"mesh: at most one axis may be -1, got {unknown}")
    known = math.prod(v for v in sizes.values() if v != -1)
    if unknown:
        if len(devices) % known:
            raise ValueError(f"mesh {dict(sizes)}: {len(devices)} devices are not divisible by {known}")
        sizes[unknown[0]] = len(devices) // known
    total = math.prod(sizes.values())
    if total != len(devices):
        raise ValueError(f"mesh {dict(sizes)} needs {total} devices but {len(devices)} are available "
                         f"(set one axis to -1 to use all of them)")
    shape = tuple(sizes[a] for a in MESH_AXES)
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def _leaf_logical_axes(names: tuple[str, ...], leaf: str, ndim: int) -> tuple:
    """Logical axes of an unstacked parameter from its module path (timm-style names) and leaf name."""
    module = names[-1] if names else ""
    if leaf in ("cls_token", "pos_embed"):
        return (None, None, "embed")
    if leaf == "gamma" or (leaf in ("scale", "bias") and module.startswith(("norm", "fc_norm"))):
        return ("embed",)
    if leaf == "alpha":
        return ()
    if module == "proj" and names[-2:-1] == ("patch_embed",):
        return (None, None, None, "embed") if leaf == "kernel" else ("embed",)
    table = {
        "qkv": ("embed", "heads"), "q": ("embed", "heads"), "k": ("embed", "heads"), "v": ("embed", "heads"),
        "proj": ("heads", "embed"), "fc1": ("embed", "mlp"), "fc2": ("mlp", "embed"),
        "head": ("embed", "classes"), "proj_l": (None, None), "proj_w": (None, None),
    }
    if module in table:
        kernel_axes = table[module]
        if leaf in ("lora_a", "lora_b"):        # LoRA A (d_in, r), B (r, d_out): the kernel's input / output axis
            return (kernel_axes[0], None) if leaf == "lora_a" else (None, kernel_axes[1])
        return kernel_axes if leaf == "kernel" else kernel_axes[-1:]
    return (None,) * ndim


def path_names(path) -> tuple[str, ...]:
    """Module/leaf names of a parameter's key path, without list indices and the Variable's ``.value``."""
    names = []
    for k in path:
        if isinstance(k, jax.tree_util.GetAttrKey):
            continue
        name = str(getattr(k, "key", getattr(k, "idx", k)))
        if not name.isdigit():
            names.append(name)
    return tuple(names)


def param_logical_axes(params: nnx.State, scan_layers: bool) -> Any:
    """A tree like ``params`` holding each parameter's logical axis names (``layers`` first when stacked)."""
    def axes(path, value):
        names = path_names(path)
        stacked = scan_layers and names[0] == "blocks"
        base = _leaf_logical_axes(names[:-1], names[-1], value.ndim - int(stacked))
        result = (("layers",) if stacked else ()) + tuple(base)
        if len(result) != value.ndim:
            result = (None,) * value.ndim
        return result

    return jax.tree_util.tree_map_with_path(axes, params)


def validate_rules(rules) -> dict[str, Any]:
    rules = dict((name, target) for name, target in rules)
    for name, target in rules.items():
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        for t in targets:
            if t not in MESH_AXES:
                raise ValueError(f"sharding rule {name!r} → {target!r}: {t!r} is not a mesh axis {MESH_AXES}")
    return rules


def activation_rules(rules) -> dict[str, Any]:
    """Logical → mesh axes for activations (``layers.partitioning``): examples over the batch axes, heads and MLP
    units where the parameter rules put them (tensor parallelism), ``embed`` replicated."""
    rules = validate_rules(rules)
    return {"batch": BATCH_AXES, "heads": rules.get("heads"), "mlp": rules.get("mlp")}


def with_activation_sharding(fn, mesh: Mesh, rules):
    """``fn`` traced inside ``activation_sharding(mesh, activation_rules(rules))``."""
    act_rules = activation_rules(rules)

    def wrapped(*args, **kwargs):
        with activation_sharding(mesh, act_rules):
            return fn(*args, **kwargs)

    return wrapped


def param_shardings(abstract_params, mesh: Mesh, rules, scan_layers: bool):
    """NamedShardings for a (possibly abstract) parameter tree."""
    rules = validate_rules(rules)
    logical = param_logical_axes(abstract_params, scan_layers)
    return jax.tree.map(lambda ax, p: NamedSharding(mesh, logical_to_spec(ax, p.shape, mesh, rules)),
                        logical, abstract_params, is_leaf=lambda x: isinstance(x, tuple))


def describe(shardings) -> str:
    lines = []
    for path, s in jax.tree_util.tree_leaves_with_path(shardings):
        if tuple(s.spec) and any(a is not None for a in s.spec):
            lines.append(f"  {jax.tree_util.keystr(path)}: {s.spec}")
    return "\n".join(lines) if lines else "  (all parameters replicated)"


def global_batch_array(local: np.ndarray, mesh: Mesh) -> jax.Array:
    return jax.make_array_from_process_local_data(batch_sharding(mesh), local)


# -- what a compiled step communicates ---------------------------------------------------------------------------

COLLECTIVE_OPS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE = re.compile(r"= (\(?[^=]*?\)?) (" + "|".join(COLLECTIVE_OPS) + r")(?:-start)?\(")
_COMMENT = re.compile(r"/\*.*?\*/")             # e.g. /*index=5*/ inside a long tuple shape
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program: its kind and the shapes of the arrays it produces (per device)."""
    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @property
    def largest(self) -> int:
        """Elements of the largest array it produces."""
        return max((math.prod(s) for s in self.shapes), default=0)

    @property
    def bytes(self) -> int:
        sizes = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
                 "f64": 8, "s64": 8, "u64": 8}
        return sum(math.prod(s) * sizes.get(d, 4) for s, d in zip(self.shapes, self.dtypes))


def collectives(compiled_hlo: str) -> list[Collective]:
    """The collectives in a compiled program's HLO text (``jax.jit(f).lower(...).compile().as_text()``)."""
    found = []
    for line in compiled_hlo.splitlines():
        match = _COLLECTIVE.search(_COMMENT.sub("", line))
        if match:
            arrays = _ARRAY.findall(match.group(1))
            found.append(Collective(match.group(2), tuple(tuple(int(d) for d in dims.split(",") if d)
                                                          for _, dims in arrays),
                                    tuple(dtype for dtype, _ in arrays)))
    return found
