"""Per-process numpy batches -> global `jax.Array`s sharded over the mesh's batch axes, for any device layout.

Which rows a process reads. The batch sharding `PartitionSpec(("data", "fsdp"))` cuts a global batch of G rows into
n = data × fsdp equal shards; the device at mesh position (d, f, t) holds shard k = d · fsdp + f, i.e. rows
[k G/n, (k + 1) G/n) (`device_rows`). A process reads the union of its devices' shards: its *rows*, a sorted tuple
of disjoint ``(start, stop)`` blocks with adjacent shards merged (`read_plan`, `process_batch_rows`), and its local
batch is those rows in increasing order. That is the layout `jax.make_array_from_process_local_data` assembles the
global array from, so any mesh works: a TPU topology (`mesh_utils` orders devices by the torus, and a host's
devices may sit at non-adjacent mesh positions), a mesh across slices or processes (`train.mesh.dcn_*`), or
processes whose devices hold the same shards (`tensor` spanning them), which then read the same rows.
"""
import functools
import math
from collections import defaultdict

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from layerscale_jax.errors import ConfigError

BATCH_AXES = ("data", "fsdp")


def _present(axis_names, batch_axes):
    axes = tuple(a for a in batch_axes if a in axis_names)
    if not axes:
        raise ConfigError(f"none of batch_axes={batch_axes} is an axis of the mesh (axes: {tuple(axis_names)})")
    return axes


def batch_sharding(mesh, batch_axes=BATCH_AXES):
    """NamedSharding splitting the leading dim over those of `batch_axes` that the mesh has (others replicate)."""
    return NamedSharding(mesh, PartitionSpec(_present(mesh.axis_names, batch_axes)))


def normalize_rows(rows, global_batch_size):
    """``rows`` (``(start, stop)`` blocks of a global batch, in any order) sorted, with adjacent blocks merged.

    Raises ``ValueError`` naming ``rows`` when a block is empty, outside ``[0, global_batch_size)`` or overlaps
    another one.
    """
    try:
        blocks = sorted((int(start), int(stop)) for start, stop in rows)
    except (TypeError, ValueError):
        raise ConfigError(f"rows={rows!r} must be a sequence of (start, stop) pairs of ints") from None
    if not blocks:
        raise ConfigError(f"rows={rows!r} is empty: a process reads at least one row of each global batch")
    merged = []
    for start, stop in blocks:
        if not 0 <= start < stop <= global_batch_size:
            raise ConfigError(f"rows={rows!r}: block ({start}, {stop}) must satisfy 0 <= start < stop <= "
                              f"global_batch_size={global_batch_size}")
        if merged and start < merged[-1][1]:
            raise ConfigError(f"rows={rows!r}: blocks overlap at row {start}")
        if merged and start == merged[-1][1]:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return tuple(merged)


def row_indices(rows):
    """The global row indices of ``rows`` (normalised blocks) in local-batch order: int64 [number of rows]."""
    return np.concatenate([np.arange(start, stop, dtype=np.int64) for start, stop in rows])


def device_rows(devices, axis_names, global_batch_size, batch_axes=BATCH_AXES):
    """``{device: (start, stop)}``: the rows of a global batch each device of a mesh's device array holds.

    ``devices`` is the mesh's ``devices`` array (real JAX devices, or any hashable objects, e.g. mock TPU devices),
    ``axis_names`` its axis names. Shard k = row-major index over the batch axes present, rows [k G/n, (k+1) G/n);
    equal to ``NamedSharding(mesh, P(batch_axes)).devices_indices_map`` (tested).
    """
    devices = np.asarray(devices, dtype=object)
    axis_names = tuple(axis_names)
    positions = [axis_names.index(a) for a in _present(axis_names, batch_axes)]
    shards = math.prod(devices.shape[p] for p in positions)
    if global_batch_size % shards:
        raise ConfigError(f"global batch of {global_batch_size} rows is not divisible by the {shards} shards of the "
                          f"mesh's batch axes {dict((axis_names[p], devices.shape[p]) for p in positions)}")
    per_shard = global_batch_size // shards
    out = {}
    for index in np.ndindex(devices.shape):
        k = 0
        for p in positions:
            k = k * devices.shape[p] + index[p]
        out[devices[index]] = (k * per_shard, (k + 1) * per_shard)
    return out


def read_plan(devices, axis_names, global_batch_size, batch_axes=BATCH_AXES):
    """``{process_index: rows}``: the rows of a global batch each process reads (its devices' shards, merged).

    Pure: ``devices`` may hold any objects with a ``process_index`` (see ``device_rows``), so the plan of a pod can
    be computed and checked anywhere.
    """
    shards = defaultdict(set)
    for device, block in device_rows(devices, axis_names, global_batch_size, batch_axes).items():
        shards[device.process_index].add(block)
    return {p: normalize_rows(blocks, global_batch_size) for p, blocks in sorted(shards.items())}


@functools.lru_cache(maxsize=64)
def process_batch_rows(mesh, global_batch_size, batch_axes=BATCH_AXES):
    """This process's rows of a global batch under the batch sharding of ``mesh`` (``read_plan``)."""
    plan = read_plan(mesh.devices, mesh.axis_names, global_batch_size, batch_axes)
    if jax.process_index() not in plan:
        raise ValueError(f"mesh {dict(mesh.shape)} has no device of process {jax.process_index()}")
    return plan[jax.process_index()]


def to_global_batch(batch, mesh, global_batch_size=None, batch_axes=BATCH_AXES):
    """{name: numpy [r, ...]} holding this process's rows (``process_batch_rows``, in increasing order) ->
    {name: global jax.Array of ``global_batch_size`` rows}, assembled by ``jax.make_array_from_process_local_data``.

    ``global_batch_size`` defaults to the local size × the process count (each process its own slice).
    """
    sharding = batch_sharding(mesh, batch_axes)
    local_rows = {x.shape[0] for x in jax.tree.leaves(batch)}
    if len(local_rows) != 1:
        raise ValueError(f"the arrays of a batch disagree on the number of rows: {sorted(local_rows)}")
    (local,) = local_rows
    size = global_batch_size if global_batch_size is not None else local * jax.process_count()
    rows = process_batch_rows(mesh, size, tuple(batch_axes))      # once per batch, not per array
    held = sum(stop - start for start, stop in rows)
    if local != held:
        raise ValueError(f"this process holds rows {list(rows)} ({held} rows) of the global batch of {size} on mesh "
                         f"{dict(mesh.shape)}, but its local batch has {local} rows")
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x, (size,) + x.shape[1:]), batch)
