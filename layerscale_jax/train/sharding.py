"""Device mesh and sharding rules: logical axis names on parameters, mapped to mesh axes by rules in the config.

The mesh has three axes, ``data`` (pure data parallel), ``fsdp`` (data parallel with parameters and optimizer
state sharded) and ``tensor`` (tensor-parallel attention heads and MLP hidden units). The batch is split over
``data`` and ``fsdp``. Each parameter carries logical axis names (``embed``, ``heads``, ``mlp``, ``classes``,
``layers``), set where it is created (``layers.params``), and the config's rules map each logical name to a mesh
axis (or ``None``: replicated), e.g. ``embed → fsdp``, ``heads → tensor``, ``mlp → tensor``. A dimension that the
mesh axis does not divide stays replicated, except on ``tensor``: there it is an error (``check_tensor_parallelism``),
since a split head makes every block gather its activations.

The mesh's device order comes from ``jax.experimental.mesh_utils`` (the physical topology; across slices or
processes with ``mesh.dcn_*``: ``mesh_devices``); each process reads the batch rows its devices hold, whatever order
that gives (``data.sharding``).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from layerscale_jax.data.sharding import BATCH_AXES
from layerscale_jax.errors import ConfigError
from layerscale_jax.layers.params import is_variable, logical_axes, map_variables
from layerscale_jax.layers.partitioning import activation_sharding, logical_to_spec
# The mesh's axes and the default rules are fields of config.train, checked there (no jax).
from layerscale_jax.train.config import DCN_AXES, MESH_AXES, MeshSettings


def granules(devices: Sequence[Any]) -> tuple[str, list[list[Any]]]:
    """``(kind, groups)``: the devices grouped by slice when they span several (``slice_index``: a multi-slice TPU
    job), else by process (CPU and GPU devices carry no slice), each group sorted by its key."""
    kind = "slice" if len({getattr(d, "slice_index", 0) for d in devices}) > 1 else "process"
    attribute = "slice_index" if kind == "slice" else "process_index"
    groups: dict[int, list] = {}
    for d in devices:
        groups.setdefault(getattr(d, attribute), []).append(d)
    return kind, [groups[k] for k in sorted(groups)]


def mesh_devices(mesh_config: MeshSettings | Mapping[str, int], devices: Sequence[Any]) -> np.ndarray:
    """The ``devices`` arranged as the ``data × fsdp × tensor`` mesh of ``mesh_config`` (``train.mesh``; a mapping
    is made a ``MeshSettings``), a pure function of the device objects, so mock TPU devices work too.

    ``mesh.<axis>`` are the sizes within a granule (one may be -1: its remaining devices), ``mesh.dcn_<axis>`` the
    granules along each axis (default 1); mesh axis ``a`` has ``dcn_a × a`` devices, granule-major. One granule:
    ``mesh_utils.create_device_mesh`` (the physical topology decides the order, as ``jax.make_mesh``); several:
    ``mesh_utils.create_hybrid_device_mesh`` over slices, or over processes where devices carry no slice. Physical
    axes may be split (as ``jax.make_mesh`` allows on v5e), so e.g. fsdp=8 fits a 4×4×4 v5p torus.
    """
    devices = list(devices)
    if not devices:
        raise ConfigError("no devices to build the mesh from")
    mesh_config = MeshSettings.of(mesh_config)
    ici, dcn = ({axis: getattr(mesh_config, axis) for axis in axes} for axes in (MESH_AXES, DCN_AXES))
    dcn_shape = tuple(dcn[f"dcn_{a}"] for a in MESH_AXES)
    kind, groups = granules(devices)
    if kind == "process" and math.prod(dcn_shape) == 1:
        groups = [devices]                           # one granule: processes matter only when split across
    if math.prod(dcn_shape) != len(groups):
        product = " × ".join(f"dcn_{a}={dcn[f'dcn_{a}']}" for a in MESH_AXES)
        plural = {"slice": "slices", "process": "processes"}[kind]
        raise ConfigError(f"train.mesh: {product} = {math.prod(dcn_shape)} granules, but the {len(devices)} devices "
                          f"belong to {len(groups)} {kind if len(groups) == 1 else plural}; the dcn_* sizes must "
                          f"multiply to the number of {plural}")
    per_granule = {len(g) for g in groups}
    if len(per_granule) != 1:
        raise ConfigError(f"train.mesh: the {kind}s hold different numbers of devices {sorted(per_granule)}")
    (count,) = per_granule
    where = f" per {kind}" if len(groups) > 1 else ""
    fill = [a for a in MESH_AXES if ici[a] == -1]
    known = math.prod(v for v in ici.values() if v != -1)
    if fill:
        if count % known:
            raise ConfigError(f"train.mesh {ici}: {count} devices{where} are not divisible by {known}")
        ici[fill[0]] = count // known
    if math.prod(ici.values()) != count:
        raise ConfigError(f"train.mesh {ici} needs {math.prod(ici.values())} devices{where} but {count} are "
                          f"available (set one axis to -1 to use all of them)")
    shape = tuple(ici[a] for a in MESH_AXES)
    if len(groups) == 1:
        return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    return mesh_utils.create_hybrid_device_mesh(shape, dcn_shape, devices, process_is_granule=kind == "process",
                                                allow_split_physical_axes=True)


def make_mesh(mesh_config: MeshSettings | Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The ``data × fsdp × tensor`` mesh of ``mesh_config`` over ``devices`` (default: all), see ``mesh_devices``.

    Axis types are ``Auto`` on purpose: the train step states its shardings explicitly at the jit boundary and
    lets XLA's partitioner propagate them inside, as pjit did.
    """
    array = mesh_devices(mesh_config, devices if devices is not None else jax.devices())
    return Mesh(array, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


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


def param_logical_axes(params: nnx.State) -> Any:
    """A tree like ``params`` (an ``nnx.State`` of the model's parameters) holding each parameter's logical axis
    names: its ``logical_axes`` metadata, set where the parameter is created (``layers.params``)."""
    def axes(path, variable):
        names = logical_axes(variable)
        if names is None or len(names) != len(variable.shape):
            raise ValueError(f"parameter {'/'.join(path_names(path))} of shape {tuple(variable.shape)} carries "
                             f"logical axes {names}; create it with layerscale_jax.layers.params.param")
        return names

    return map_variables(axes, params)


def activation_rules(rules) -> dict[str, Any]:
    """Logical → mesh axes for activations (``layers.partitioning``): examples over the batch axes, heads and MLP
    units where the parameter rules put them (tensor parallelism), ``embed`` replicated. ``rules``: (logical axis,
    mesh axes) pairs, checked where the config entered (``train.config.sharding_rules``)."""
    rules = dict(rules)
    return {"batch": BATCH_AXES, "heads": rules.get("heads"), "mlp": rules.get("mlp")}


def with_activation_sharding(fn, mesh: Mesh, rules):
    """``fn`` traced inside ``activation_sharding(mesh, activation_rules(rules))``."""
    act_rules = activation_rules(rules)

    def wrapped(*args, **kwargs):
        with activation_sharding(mesh, act_rules):
            return fn(*args, **kwargs)

    return wrapped


def param_shardings(abstract_params: nnx.State, mesh: Mesh, rules) -> Any:
    """NamedShardings for a (possibly abstract) ``nnx.State`` of parameters, from their logical axes by ``rules``."""
    rules = dict(rules)
    logical = param_logical_axes(abstract_params)
    return jax.tree.map(lambda ax, p: NamedSharding(mesh, logical_to_spec(ax, p.shape, mesh, rules)),
                        logical, abstract_params, is_leaf=lambda x: isinstance(x, tuple))


def opt_state_shardings(abstract_opt_state, mesh: Mesh, rules) -> Any:
    """Shardings for an optimizer state made by ``tx.init(params)`` from an ``nnx.State``: every leaf inside a
    parameter's ``nnx.Variable`` by that parameter's logical axes (optax builds Adam's moments, accumulators and
    the like with ``jax.tree.map`` over the parameters, which keeps each Variable and its metadata), so a moment is
    sharded as its parameter is; every other leaf (step counts, scalars) replicated."""
    rules = dict(rules)
    rep = replicated(mesh)

    def sharding(node):
        if not is_variable(node):
            return rep
        axes = logical_axes(node)
        return jax.tree.map(lambda leaf: NamedSharding(mesh, logical_to_spec(axes, leaf.shape, mesh, rules))
                            if axes is not None and len(axes) == leaf.ndim else rep, node)

    return jax.tree.map(sharding, abstract_opt_state, is_leaf=is_variable)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_tensor_parallelism(model_name: str, model: nnx.Module, mesh: Mesh, rules) -> None:
    """Refuse a ``tensor`` axis that would split what it shards: every attention module's heads (a head split
    across devices makes every block all-gather its qkv activations) and every other parameter dimension whose
    logical axis the rules put on ``tensor`` (the MLP's hidden units by default), instead of leaving it replicated
    silently. The error names the model, both numbers and the tensor sizes that divide all of them."""
    size = mesh.shape.get("tensor", 1)
    if size == 1:
        return
    rules = dict(rules)

    def on_tensor(name):
        target = rules.get(name)
        return "tensor" in ((target,) if isinstance(target, str) else tuple(target or ()))

    needs: dict[str, int] = {}                     # what must divide by the tensor size: description → number
    if on_tensor("heads"):
        for path, node in nnx.iter_graph(model):
            if isinstance(node, nnx.Module) and isinstance(getattr(node, "num_heads", None), int):
                where = ".".join(str(p) for p in path if not str(p).isdigit()) or "model"
                needs.setdefault(f"num_heads={node.num_heads} ({where})", node.num_heads)
    params = nnx.state(model, nnx.Param)

    def collect(path, axes, param):
        for name, dim in zip(axes, param.shape):
            if name is not None and name != "heads" and on_tensor(name):
                needs.setdefault(f"{name} width {dim} ({'.'.join(path_names(path)[:-1])})", dim)

    jax.tree_util.tree_map_with_path(collect, param_logical_axes(params), params,
                                     is_leaf=lambda x: isinstance(x, tuple))
    bad = [(what, n) for what, n in needs.items() if n % size]
    if bad:
        what, n = bad[0]
        works = _divisors(math.gcd(*needs.values()))
        raise ConfigError(f"model {model_name}: {what} is not divisible by train.mesh.tensor={size} ({n} % {size} = "
                          f"{n % size}): tensor parallelism would split it across devices and gather activations in "
                          f"every block. Tensor sizes that divide every tensor-sharded dimension of this model: "
                          f"{', '.join(map(str, works))}")


def describe(shardings) -> str:
    lines = []
    for path, s in jax.tree_util.tree_leaves_with_path(shardings):
        if tuple(s.spec) and any(a is not None for a in s.spec):
            lines.append(f"  {jax.tree_util.keystr(path)}: {s.spec}")
    return "\n".join(lines) if lines else "  (all parameters replicated)"
