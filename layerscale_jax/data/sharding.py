"""Per-process numpy batches -> global `jax.Array`s sharded over the mesh's batch axes."""

import jax
from jax.sharding import NamedSharding, PartitionSpec


def batch_sharding(mesh, batch_axes=("data", "fsdp")):
    """NamedSharding splitting the leading dim over those of `batch_axes` that the mesh has (others replicate)."""
    axes = tuple(a for a in batch_axes if a in mesh.axis_names)
    if not axes:
        raise ValueError(f"none of batch_axes={batch_axes} is an axis of the mesh (axes: {mesh.axis_names})")
    return NamedSharding(mesh, PartitionSpec(axes))


def to_global_batch(batch, mesh, batch_axes=("data", "fsdp")):
    """{name: numpy [b, ...]} of this process -> {name: jax.Array [b * process_count, ...]}.

    Uses `jax.make_array_from_process_local_data`; the per-process batch must split evenly over this process's
    devices along the batch axes.
    """
    sharding = batch_sharding(mesh, batch_axes)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)
