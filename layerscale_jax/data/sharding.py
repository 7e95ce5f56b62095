"""Per-process numpy batches -> global `jax.Array`s sharded over the mesh's batch axes.

Which rows of a global batch a process must read follows from the batch sharding: the union of the row ranges of the
process's addressable devices. With the batch axes spanning the processes (data or fsdp across hosts) each process
reads its own disjoint slice; when they do not (e.g. `tensor` spanning the processes, data × fsdp within one), the
processes read the same rows, as the replicated layout requires.
"""

import jax
from jax.sharding import NamedSharding, PartitionSpec

BATCH_AXES = ("data", "fsdp")


def batch_sharding(mesh, batch_axes=BATCH_AXES):
    """NamedSharding splitting the leading dim over those of `batch_axes` that the mesh has (others replicate)."""
    axes = tuple(a for a in batch_axes if a in mesh.axis_names)
    if not axes:
        raise ValueError(f"none of batch_axes={batch_axes} is an axis of the mesh (axes: {mesh.axis_names})")
    return NamedSharding(mesh, PartitionSpec(axes))


def process_batch_rows(mesh, global_batch_size, batch_axes=BATCH_AXES):
    """``(lo, hi)``: the rows of a global batch held by this process's devices under the batch sharding."""
    sharding = batch_sharding(mesh, batch_axes)
    ranges = sorted({index[0].indices(global_batch_size)[:2]
                     for index in sharding.addressable_devices_indices_map((global_batch_size,)).values()})
    lo, hi = ranges[0][0], ranges[0][0]
    for start, stop in ranges:
        if start > hi:
            raise ValueError(f"the devices of process {jax.process_index()} hold non-contiguous rows {ranges} of the "
                             f"global batch ({global_batch_size}) on mesh {dict(mesh.shape)}; order the mesh's "
                             f"devices so each process's devices are adjacent on the batch axes")
        hi = max(hi, stop)
    return lo, hi


def to_global_batch(batch, mesh, global_batch_size=None, batch_axes=BATCH_AXES):
    """{name: numpy [hi - lo, ...]} holding rows [lo, hi) (``process_batch_rows``) -> {name: global jax.Array}.

    ``global_batch_size`` defaults to the local size × the process count (each process its own slice).
    """
    sharding = batch_sharding(mesh, batch_axes)
    local_rows = {x.shape[0] for x in jax.tree.leaves(batch)}
    if len(local_rows) != 1:
        raise ValueError(f"the arrays of a batch disagree on the number of rows: {sorted(local_rows)}")
    (local,) = local_rows
    size = global_batch_size if global_batch_size is not None else local * jax.process_count()
    lo, hi = process_batch_rows(mesh, size, batch_axes)      # once per batch, not per array
    if local != hi - lo:
        raise ValueError(f"this process holds rows [{lo}, {hi}) of the global batch of {size} on mesh "
                         f"{dict(mesh.shape)}, but its local batch has {local} rows")

    def put(x):
        def shard(index):
            start, stop = index[0].indices(size)[:2]
            return x[start - lo:stop - lo]

        return jax.make_array_from_callback((size,) + x.shape[1:], sharding, shard)

    return jax.tree.map(put, batch)
