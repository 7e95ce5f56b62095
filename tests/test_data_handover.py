"""Batches cross from grain's worker processes to the train loop as uint8 and are normalised after the boundary
(a quarter of the bytes through shared memory, no copy out of it), with the same batches as before."""

import numpy as np
import pytest

from layerscale_jax import data


def jpeg_config(num_workers, interpolation="bicubic"):
    cfg = data.default_data_config("synthetic")
    cfg.image_size, cfg.num_train, cfg.synthetic_jpeg_shape = 24, 32, (40, 56)
    cfg.num_workers, cfg.prefetch = num_workers, 1
    a = cfg.augment
    a.random_resized_crop, a.hflip, a.three_augment, a.color_jitter = True, True, True, 0.3
    a.interpolation = interpolation
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])  # bilinear: TensorFlow in the worker process
def test_batches_cross_the_worker_boundary_as_uint8_and_are_normalised_after_it(interpolation):
    it = data.make_train_iterator(jpeg_config(0, interpolation), global_batch_size=8, seed=1, process_index=0,
                                  process_count=1)
    handed_over = [it._fn(j) for j in range(2)]  # what a worker process puts into shared memory
    in_process = [next(it) for _ in range(2)]
    it.close()
    assert all(b["image"].dtype == np.uint8 for b in handed_over)
    for raw, batch in zip(handed_over, in_process):
        np.testing.assert_array_equal(batch["image"], it._normalize(raw)["image"])
        assert batch["image"].dtype == np.float32
    workers = data.make_train_iterator(jpeg_config(1, interpolation), global_batch_size=8, seed=1, process_index=0,
                                       process_count=1)
    through_workers = [next(workers) for _ in range(2)]
    workers.close()
    for got, expected in zip(through_workers, in_process):
        assert set(got) == set(expected) == {"image", "label"}
        for k in got:
            np.testing.assert_array_equal(got[k], expected[k])
            assert got[k].dtype == expected[k].dtype and type(got[k]) is np.ndarray  # not a shared-memory array


_EVAL_PASS_WITH_A_WORKER = """
from layerscale_jax import data
cfg = data.default_data_config("synthetic")
cfg.image_size, cfg.num_train, cfg.num_test = 16, 32, 48
cfg.num_workers, cfg.prefetch = 1, 2
with data.make_eval_iterator(cfg, global_batch_size=16, process_index=0, process_count=1) as batches:
    print("eval batches", sum(1 for _ in batches))
"""


@pytest.mark.slow
def test_a_finished_eval_pass_through_a_worker_leaves_no_shared_memory_behind():
    # Without the pipeline's clean-up, the last batch grain handed over sits in a reference cycle past the end of the
    # pass and grain unlinks segments on a background thread that the interpreter's exit can cut short: the resource
    # tracker warns "There appear to be 3 leaked shared_memory objects" (one per array of the batch) in most runs of
    # this script (more often run as `python -c`, as here, than as a file). With it one object still leaks now and
    # then (cause not found), so a warning is retried once: the test fails when two runs in a row warn.
    import subprocess
    import sys

    for attempt in range(2):
        proc = subprocess.run([sys.executable, "-c", _EVAL_PASS_WITH_A_WORKER], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "eval batches 3" in proc.stdout
        if "leaked shared_memory" not in proc.stderr:
            return
    raise AssertionError(f"two runs in a row warned of leaked shared memory: {proc.stderr[-2000:]}")
