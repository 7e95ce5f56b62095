"""Which rows of a global batch each process reads, for any device layout: the read plan equals the batch sharding
on permuted CPU meshes, and the input pipeline reads row blocks in any arrangement as exactly those rows of the one
global batch (train, padded evaluation, resume inside a partly used batch)."""
import dataclasses
import json
from collections import defaultdict

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from layerscale_jax import data
from layerscale_jax.data.sharding import batch_sharding, device_rows, read_plan, row_indices
from layerscale_jax.train.sharding import MESH_AXES

from test_data import (assert_same_batches, states_and_batches, synthetic_config, take,  # noqa: F401
                       toy_source_with_bad_records)

G = 16
SHAPES = [(8, 1, 1), (1, 8, 1), (2, 4, 1), (4, 1, 2), (2, 2, 2), (1, 1, 8)]


def permuted_mesh(shape, seed):
    devices = np.empty(8, dtype=object)
    devices[:] = jax.devices()[:8]
    return Mesh(np.random.default_rng(seed).permutation(devices).reshape(shape), MESH_AXES)


@dataclasses.dataclass(frozen=True)
class Stand:
    """A real CPU device standing in for a device of process ``process_index``."""
    device: object
    process_index: int


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_device_rows_equal_the_batch_shardings_indices_on_permuted_cpu_meshes(shape):
    for seed in range(3):
        mesh = permuted_mesh(shape, seed)
        truth = {d: index[0].indices(G)[:2] for d, index in batch_sharding(mesh).devices_indices_map((G,)).items()}
        assert device_rows(mesh.devices, mesh.axis_names, G) == truth


def test_read_plan_gives_each_process_exactly_the_rows_its_devices_hold():
    """4 stand-in processes of 2 CPU devices each, on meshes whose device order is shuffled: each process's rows are
    the union of its devices' shards under the real sharding, in blocks, each row once."""
    non_contiguous = 0
    for shape in SHAPES:
        for seed in range(3):
            mesh = permuted_mesh(shape, seed)
            stands = np.vectorize(lambda d: Stand(d, d.id // 2), otypes=[object])(mesh.devices)
            truth = defaultdict(set)
            for d, index in batch_sharding(mesh).devices_indices_map((G,)).items():
                truth[d.id // 2].update(range(*index[0].indices(G)[:2]))
            plan = read_plan(stands, mesh.axis_names, G)
            assert {p: sorted(row_indices(rows)) for p, rows in plan.items()} == {p: sorted(r) for p, r in
                                                                                   truth.items()}
            non_contiguous += sum(len(rows) > 1 for rows in plan.values())
    assert non_contiguous > 0          # shuffled layouts do give processes several blocks


def test_row_blocks_in_any_order_read_those_rows_of_the_global_batch():
    cfg = synthetic_config(augment={"hflip": True, "crop_padding": 1})     # per-batch random draws are sliced too
    whole = take(data.make_train_iterator(cfg, global_batch_size=12, seed=0, process_index=0, process_count=1), 3)
    it = data.make_train_iterator(cfg, global_batch_size=12, seed=0, rows=[(9, 12), (0, 3), (3, 5)])
    assert it.get_state()["rows"] == [[0, 5], [9, 12]]                     # sorted, adjacent blocks merged
    index = [0, 1, 2, 3, 4, 9, 10, 11]
    for part, full in zip(take(it, 3), whole):
        for key in ("image", "label"):
            np.testing.assert_array_equal(part[key], full[key][index])


def test_eval_with_interleaved_rows_assembles_the_padded_global_batches():
    cfg = synthetic_config()                           # 50 test examples: 4 batches of 16, the last one padded
    plan = {0: ((0, 4), (8, 12)), 1: ((4, 8), (12, 16))}
    whole = list(data.make_eval_iterator(cfg, global_batch_size=G, process_index=0, process_count=1))
    parts = {p: list(data.make_eval_iterator(cfg, global_batch_size=G, rows=rows)) for p, rows in plan.items()}
    for j, full in enumerate(whole):
        for key in ("image", "label", "mask"):
            assembled = np.empty_like(full[key])
            for p, rows in plan.items():
                assembled[row_indices(rows)] = parts[p][j][key]
            np.testing.assert_array_equal(assembled, full[key])
    assert sum(int(b["mask"].sum()) for b in whole) == 50


@pytest.mark.parametrize("rows", [[(0, 4), (2, 6)], [(0, 20)], [], [(3, 3)], [(0, "a")]])
def test_invalid_rows_are_refused_naming_them(rows):
    with pytest.raises(ValueError, match=r"rows="):
        data.make_train_iterator(synthetic_config(), global_batch_size=G, seed=0, rows=rows)


def test_resume_inside_a_refilled_batch_is_exact_with_row_blocks(toy_source_with_bad_records):  # noqa: F811
    cfg = data.default_data_config("digits")
    cfg.cache, cfg.skip_bad_records = False, True
    rows = [(0, 2), (4, 6)]
    states, batches, step = states_and_batches(cfg, 16, global_batch_size=8, seed=1, rows=rows)
    resumed = data.make_train_iterator(cfg, global_batch_size=8, seed=1, rows=rows)
    resumed.set_state(json.loads(json.dumps(states[step])))
    assert_same_batches(take(resumed, 16 - step), batches[step:])
    other = data.make_train_iterator(cfg, global_batch_size=8, seed=1, rows=[(0, 4)])
    with pytest.raises(ValueError, match=r"partly used batch .* saved for rows \[\[0, 2\], \[4, 6\]\]"):
        other.set_state(states[step])
    other.close()


def test_a_state_saved_with_one_contiguous_row_range_still_loads(toy_source_with_bad_records):  # noqa: F811
    """Train-iterator states written before rows could be several blocks hold ``"rows": [lo, hi]``."""
    cfg = data.default_data_config("digits")
    cfg.cache, cfg.skip_bad_records = False, True
    states, batches, step = states_and_batches(cfg, 16, global_batch_size=4, seed=1, process_index=0,
                                               process_count=1)
    old = dict(states[step], rows=[0, 4])
    resumed = data.make_train_iterator(cfg, global_batch_size=4, seed=1, rows=[(0, 4)])
    resumed.set_state(json.loads(json.dumps(old)))
    assert_same_batches(take(resumed, 16 - step), batches[step:])
