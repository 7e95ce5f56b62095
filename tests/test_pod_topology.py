"""Pod layouts without a pod: mock TPU devices (id, coords, core_on_chip, process_index, slice_index, platform,
device_kind, as JAX's TPU devices carry them) arranged by the project's mesh (``mesh_utils`` orders them by the torus,
per device kind), and the read plan of each host. For the meshes of the pod commands in docs/multihost.md: every host
reads exactly the rows its chips hold, every row is read once, and hosts with non-contiguous rows exist (the
layouts a single (lo, hi) range per host could not serve)."""
import dataclasses
import itertools
from collections import Counter

import jax
import numpy as np
import pytest
from jax.experimental import mesh_utils

from layerscale_jax.data.sharding import device_rows, read_plan, row_indices
from layerscale_jax.train import sharding as shard_lib

G = 1024  # a global batch every mesh below divides


@dataclasses.dataclass(frozen=True)
class MockTpu:
    id: int
    process_index: int
    coords: tuple
    slice_index: int
    device_kind: str
    core_on_chip: int = 0         # v4, v5e, v5p: one device per chip (megacore)
    platform: str = "tpu"


@dataclasses.dataclass(frozen=True)
class MockGpu:
    id: int
    process_index: int
    device_kind: str = "NVIDIA H100 80GB HBM3"
    platform: str = "gpu"


def tpu_pod(device_kind, chips, host_chips, slices=1):
    """``slices`` slices of ``chips`` (x, y, z) chips each; each host (process) owns an ``host_chips`` block, hosts
    numbered z-, y-, then x-major within a slice and slice by slice; device ids follow process order."""
    (X, Y, Z), (hx, hy, hz) = chips, host_chips
    hosts = (X // hx) * (Y // hy) * (Z // hz)
    found = []
    for s in range(slices):
        for z, y, x in itertools.product(range(Z), range(Y), range(X)):
            host = ((z // hz) * (Y // hy) + y // hy) * (X // hx) + x // hx
            found.append((s * hosts + host, s, (x, y, z)))
    return [MockTpu(i, p, c, s, device_kind) for i, (p, s, c) in enumerate(sorted(found))]


PODS = {
    "v4-32": lambda: tpu_pod("TPU v4", (2, 2, 4), (2, 2, 1)),                  # 16 chips, 4 hosts
    "v5e-32": lambda: tpu_pod("TPU v5 lite", (4, 8, 1), (2, 2, 1)),            # 32 chips, 8 hosts of 2x2
    "v5p-128": lambda: tpu_pod("TPU v5", (4, 4, 4), (2, 2, 1)),                # 64 chips, 16 hosts
    "2xv5e-16": lambda: tpu_pod("TPU v5 lite", (4, 4, 1), (2, 2, 1), slices=2),
    "2xv5e-256": lambda: tpu_pod("TPU v5 lite", (16, 16, 1), (2, 2, 1), slices=2),
    "4x8-gpu": lambda: [MockGpu(8 * node + g, node) for node in range(4) for g in range(8)],
}
POD_COMMAND = {"data": -1, "fsdp": 8}                       # docs/multihost.md: a TPU pod slice
FSDP_CONFIGS = {"data": 1, "fsdp": -1}                      # configs/imagenet_*.py
CASES = [
    ("v4-32", POD_COMMAND), ("v5e-32", POD_COMMAND), ("v5p-128", POD_COMMAND),
    ("v4-32", FSDP_CONFIGS), ("v5e-32", FSDP_CONFIGS), ("v5p-128", FSDP_CONFIGS),
    ("v5e-32", {"data": -1, "fsdp": 2, "tensor": 2}), ("v5p-128", {"data": -1, "tensor": 4}),
    ("2xv5e-16", {"dcn_data": 2, **POD_COMMAND}), ("2xv5e-16", {"dcn_data": 2, **FSDP_CONFIGS}),
    ("2xv5e-256", {"dcn_data": 2, **FSDP_CONFIGS}),           # docs/multihost.md: two v5e-256 slices
    ("4x8-gpu", {"data": 4, "fsdp": 8}),                      # docs/multihost.md: a SLURM GPU cluster
]


def case_id(case):
    pod, mesh = case
    return pod + "-" + "_".join(f"{k}{v}" for k, v in mesh.items())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_host_reads_exactly_the_rows_its_devices_hold_and_every_row_is_read(case):
    pod, mesh_config = case
    devices = PODS[pod]()
    array = shard_lib.mesh_devices(mesh_config, devices)
    assert sorted(d.id for d in array.flat) == sorted(d.id for d in devices)       # each device once
    plan = read_plan(array, shard_lib.MESH_AXES, G)
    held, holders = {}, {}
    for device, (start, stop) in device_rows(array, shard_lib.MESH_AXES, G).items():
        held.setdefault(device.process_index, set()).update(range(start, stop))
        for r in range(start, stop):
            holders.setdefault(r, set()).add(device.process_index)
    assert sorted(plan) == sorted(held) == sorted({d.process_index for d in devices})
    for p, rows in plan.items():
        read = row_indices(rows)
        assert len(read) == len(set(read)) and set(read) == held[p], p
    # Each row is read once by every host whose devices hold it: one host, unless `tensor` spans hosts.
    readers = Counter(int(r) for rows in plan.values() for r in row_indices(rows))
    assert sorted(readers) == list(range(G))
    assert all(readers[r] == len(holders[r]) for r in range(G))
    if mesh_config.get("tensor", 1) == 1:
        assert set(readers.values()) == {1}
    assert len({len(row_indices(rows)) for rows in plan.values()}) == 1          # equal local batches


@pytest.mark.parametrize("pod", ["v5e-32", "v4-32", "2xv5e-256"])
def test_the_pod_command_leaves_hosts_with_non_contiguous_rows(pod):
    """The layouts that stopped the first pod launch ("the devices of process 0 hold non-contiguous rows")."""
    mesh = {"dcn_data": 2, **FSDP_CONFIGS} if pod.startswith("2x") else POD_COMMAND
    plan = read_plan(shard_lib.mesh_devices(mesh, PODS[pod]()), shard_lib.MESH_AXES, G)
    assert sum(len(rows) > 1 for rows in plan.values()) > 0, plan


@pytest.mark.parametrize("pod, mesh, shape, blocks", [
    ("v4-32", POD_COMMAND, (2, 8, 1), 4), ("v5e-32", POD_COMMAND, (4, 8, 1), 2), ("v5p-128", POD_COMMAND, (8, 8, 1), 1),
    ("v4-32", FSDP_CONFIGS, (1, 16, 1), 4), ("v5e-32", FSDP_CONFIGS, (1, 32, 1), 2),
    ("v5p-128", FSDP_CONFIGS, (1, 64, 1), 4), ("2xv5e-256", {"dcn_data": 2, **FSDP_CONFIGS}, (2, 256, 1), 2),
])
def test_blocks_per_host_are_those_of_the_docs_table(pod, mesh, shape, blocks):
    array = shard_lib.mesh_devices(mesh, PODS[pod]())
    assert array.shape == shape
    assert {len(rows) for rows in read_plan(array, shard_lib.MESH_AXES, G).values()} == {blocks}


def test_tensor_across_hosts_makes_those_hosts_read_the_same_rows():
    devices = PODS["v5e-32"]()
    array = np.array(devices, dtype=object).reshape(4, 1, 8)              # tensor=8 spans 2 hosts of 4 chips
    plan = read_plan(array, shard_lib.MESH_AXES, G)
    tensor_groups = {frozenset(d.process_index for d in array[i].flat) for i in range(4)}
    for group in tensor_groups:
        assert len(group) == 2 and len({plan[p] for p in group}) == 1


@pytest.mark.parametrize("pod, mesh, shape", [("v4-32", POD_COMMAND, (2, 8, 1)), ("v5e-32", POD_COMMAND, (4, 8, 1)),
                                              ("v5e-32", FSDP_CONFIGS, (1, 32, 1)),
                                              ("v5p-128", FSDP_CONFIGS, (1, 64, 1))])
def test_one_slice_is_laid_out_as_jax_make_mesh_does(pod, mesh, shape):
    devices = PODS[pod]()
    expected = jax.make_mesh(shape, shard_lib.MESH_AXES, devices=devices).devices
    assert (shard_lib.mesh_devices(mesh, devices) == expected).all()


def test_v5p_pod_command_splits_a_physical_axis_where_jax_make_mesh_would_refuse():
    """fsdp=8 on a 4x4x4 torus: no product of whole physical axes is 8; ``mesh_utils`` needs
    ``allow_split_physical_axes`` (``jax.make_mesh`` allows it on v5e only)."""
    devices = PODS["v5p-128"]()
    with pytest.raises(NotImplementedError):
        mesh_utils.create_device_mesh((8, 8, 1), devices)
    assert shard_lib.mesh_devices(POD_COMMAND, devices).shape == (8, 8, 1)


# -- multi-slice ---------------------------------------------------------------------------------------------------

def test_dcn_data_puts_one_slice_per_data_block_each_laid_out_by_its_torus():
    devices = PODS["2xv5e-16"]()
    array = shard_lib.mesh_devices({"dcn_data": 2, **FSDP_CONFIGS}, devices)
    assert array.shape == (2, 16, 1)
    for s in range(2):
        own = [d for d in devices if d.slice_index == s]
        assert {d.slice_index for d in array[s].flat} == {s}
        assert (array[s:s + 1] == mesh_utils.create_device_mesh((1, 16, 1), own,
                                                                allow_split_physical_axes=True)).all()
    plan = read_plan(array, shard_lib.MESH_AXES, G)        # each slice reads its half of the batch
    for p, rows in plan.items():
        assert {int(r) // (G // 2) for r in row_indices(rows)} == {p // 4}


def test_without_slices_processes_are_the_granules_and_can_interleave_the_batch():
    """CPU/GPU devices carry no slice: ``dcn_*`` spans processes. ``data=2, dcn_fsdp=2`` over 2 processes of 2
    devices (tests/test_multihost.py runs it) gives each process every other quarter of the batch."""
    devices = [MockGpu(i, i // 2, platform="cpu", device_kind="cpu") for i in range(4)]
    array = shard_lib.mesh_devices({"data": 2, "dcn_fsdp": 2}, devices)
    assert [[d.process_index for d in row] for row in array[:, :, 0]] == [[0, 1], [0, 1]]
    assert read_plan(array, shard_lib.MESH_AXES, 16) == {0: ((0, 4), (8, 12)), 1: ((4, 8), (12, 16))}


@pytest.mark.parametrize("mesh, message", [
    ({"dcn_data": 4}, r"dcn_data=4 × dcn_fsdp=1 × dcn_tensor=1 = 4 granules, but the 32 devices belong to 2 "
                      r"slices; the dcn_\* sizes must multiply to the number of slices$"),
    ({"data": -1}, r"= 1 granules, but the 32 devices belong to 2 slice"),
    ({"dcn_data": 2, "data": 3, "fsdp": -1}, r"16 devices per slice are not divisible by 3"),
    ({"dcn_data": 2, "data": 2, "fsdp": 4}, r"needs 8 devices per slice but 16 are available"),
    ({"dcn_fsdp": 0}, r"train.mesh.dcn_fsdp=0 must be a positive integer$"),
    ({"dcn_data": -1}, r"train.mesh.dcn_data=-1 must be a positive integer$"),
    ({"data": -1, "fsdp": -1}, r"at most one of data, fsdp, tensor may be -1"),
], ids=["dcn_product", "slices_without_dcn", "not_divisible", "wrong_product", "dcn_zero", "dcn_fill", "two_fills"])
def test_bad_multi_slice_meshes_are_refused_naming_the_fields(mesh, message):
    with pytest.raises(ValueError, match=message):
        shard_lib.mesh_devices(mesh, PODS["2xv5e-16"]())
