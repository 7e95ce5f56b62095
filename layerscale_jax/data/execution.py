"""How the batch functions run: on grain, in prefetch threads or worker processes.

`grain.MapDataset.range(j0, ...).map(batch_fn)` -> `to_iter_dataset` (prefetch threads) -> optional `mp_prefetch`
(worker processes) -> `Normalize`. One grain element is one batch: records are read in a batch read, fixed-size work
is vectorised in numpy over the batch, and grain's per-element overhead is paid once per batch rather than once per
image. (`grain.DataLoader` with an `IndexSampler` pays it per image, which caps its throughput even with no-op
transforms: too slow for `digits`.) Batches stay uint8 until `Normalize`, which runs after the worker-process
boundary (in a prefetch thread of the calling process), so a worker hands over a quarter of the bytes through shared
memory, and the float32 batch is written once, into an ordinary array (no copy out of shared memory).
"""

import gc

import numpy as np

from layerscale_jax.data import transforms


class Normalize:
    """The last stage of every batch: its uint8 "image" normalised into a new float32 array (``mean`` None: an
    input that is standardised already, such as mnist1d's signals, copied as float32), the other arrays copied.
    After the worker-process boundary, so what grain handed over in shared memory is read once and released now
    (rather than by finalizers at interpreter exit, which fail noisily)."""

    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def _image(self, x):
        if self.mean is None:
            return np.array(x, np.float32, copy=True)
        return transforms.normalize(x, self.mean, self.std)

    def __call__(self, batch):
        return {k: self._image(v) if k == "image" else np.array(v, copy=True) for k, v in batch.items()}


class HandOver:
    """The last stage of a batch whose images stay uint8 (``make_train_iterator(normalize=False)``): every array
    copied, as ``Normalize`` copies them, so what grain handed over in shared memory is released now."""

    def __call__(self, batch):
        return {k: np.array(v, copy=True) for k, v in batch.items()}


def grain_iterator(batch_fn, normalize, start, stop, num_workers, prefetch):
    """Batches `start` .. `stop` - 1 of `batch_fn`, then `normalize`d: in `prefetch` threads of this process, or
    built by `num_workers` worker processes and normalised in a prefetch thread here."""
    import grain

    ds = grain.MapDataset.range(start, stop).map(batch_fn)
    read = grain.ReadOptions(num_threads=prefetch, prefetch_buffer_size=prefetch)
    if num_workers == 0:
        return iter(ds.map(normalize).to_iter_dataset(read))
    from absl import flags

    # grain's worker processes read an absl flag; outside `absl.app.run` (tests, notebooks) nothing parsed them.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    it_ds = ds.to_iter_dataset(read).mp_prefetch(
        grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=max(1, prefetch))
    ).map(normalize)
    return iter(grain.experimental.ThreadPrefetchIterDataset(it_ds, prefetch_buffer_size=prefetch))


def release_handed_over_batches():
    """Unlinks the shared memory of the batches grain's workers handed over and the pass no longer holds, before
    the caller goes on (or the interpreter exits: else the resource tracker warns of "leaked shared_memory
    objects" at the end of every run that evaluated with workers; tests/test_data_handover.py). grain keeps the
    last batch in a reference cycle through the end-of-stream exception of its prefetch thread, so it is collected
    here; and it unlinks segments on a one-thread pool, so a no-op sent through that pool returns once the
    unlinks queued before it are done (grain exposes no call to wait for them)."""
    from grain.multiprocessing import SharedMemoryArray

    gc.collect()
    deleter = getattr(SharedMemoryArray, "_del_thread_pool", None)
    if deleter is not None:
        deleter.apply(int)
