"""Train and eval iterators: deterministic, per-process sharded, exactly resumable; grain runs them.

Row i of train batch j is a pure function of (config, seed, j, i), whatever the number of processes, grain workers
or the mesh's device order. The pieces are documented where they live: the order of records (``data.order``), the
batch functions and their seeds (``data.batches``, reading ``data.records``), how grain runs them
(``data.execution``); this module builds the iterators and their resumable state.

Resume. `get_state()` is a small JSON-able dict (next batch index, records already taken from a partly used batch,
bad-record count, the rows read); `set_state` restarts grain at that batch. States agree across processes unless
records were skipped, and a state without a partly used batch (`offset == 0`) can be restored on another process
count or device layout; one with a partly used batch only on the same rows (a state saved as one contiguous
``[lo, hi]`` reads as ``[[lo, hi]]``).

Bad records. A label outside [0, num_classes) or an undecodable image raises `BadRecordError` naming the record;
with `skip_bad_records`, it is dropped and counted (`iterator.bad_records`); train batches are refilled from the
next batch so every batch keeps b examples, eval marks it `mask=False`.
"""

import collections

import numpy as np

from layerscale_jax.data import sources
from layerscale_jax.data.batches import EvalBatch, SignalBatch, TrainBatch
from layerscale_jax.data.config import MNIST1D, validate_data_config
from layerscale_jax.data.dataset_info import normalization
from layerscale_jax.data.execution import HandOver, Normalize, grain_iterator, release_handed_over_batches
from layerscale_jax.data.order import Geometry, Order, process_rows
from layerscale_jax.data.records import Records, build_cache
from layerscale_jax.errors import ConfigError

STATE_VERSION = 1
_INFINITE = 2**62  # "infinite" number of train batches.


class TrainIterator:
    """Infinite iterator of per-process train batches {"image": float32 [b,S,S,C] (uint8 with
    ``make_train_iterator(normalize=False)``), "label": int32 [b]}.

    `get_state()` -> JSON-serialisable dict; `set_state(state)` resumes on exactly the batches an uninterrupted run
    would have produced. `bad_records` counts the records skipped so far (with `data.skip_bad_records`).
    """

    def __init__(self, batch_fn, normalize, per_process_batch, settings, meta, cache_skipped):
        self._fn, self._normalize, self._b = batch_fn, normalize, per_process_batch
        self._settings, self._meta = settings, meta
        self._cache_skipped = cache_skipped
        self._it = None
        self._start(0, 0)

    @property
    def bad_records(self):
        return self._cache_skipped + self._stream_bad

    def _start(self, next_batch, bad_records):
        self.close()
        s = self._settings
        self._it = grain_iterator(self._fn, self._normalize, next_batch, _INFINITE, s.num_workers, s.prefetch)
        self._next_pull = next_batch
        self._chunks = collections.deque()  # [batch index, valid rows (dict), bad records before this batch]
        self._offset = 0  # rows of the first chunk already yielded
        self._stream_bad = bad_records

    def __iter__(self):
        return self

    def _pull(self):
        batch = next(self._it)
        j, self._next_pull = self._next_pull, self._next_pull + 1
        valid = batch.pop("_valid")
        n_valid = int(valid.sum())
        bad_before = self._stream_bad
        self._stream_bad += len(valid) - n_valid
        if n_valid < len(valid):
            batch = {k: v[valid] for k, v in batch.items()}
        if n_valid:
            self._chunks.append([j, batch, bad_before])

    def __next__(self):
        if self._it is None:
            raise RuntimeError("the train iterator is closed")
        while sum(len(c[1]["label"]) for c in self._chunks) - self._offset < self._b:
            self._pull()
        head = self._chunks[0][1]
        if self._offset == 0 and len(head["label"]) == self._b:
            self._chunks.popleft()
            return head
        parts, need = [], self._b
        while need:
            rows = self._chunks[0][1]
            take = min(len(rows["label"]) - self._offset, need)
            parts.append({k: v[self._offset : self._offset + take] for k, v in rows.items()})
            need -= take
            self._offset += take
            if self._offset == len(rows["label"]):
                self._chunks.popleft()
                self._offset = 0
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def get_state(self):
        if self._chunks:
            next_batch, _, bad = self._chunks[0]
            offset = self._offset
        else:
            next_batch, offset, bad = self._next_pull, 0, self._stream_bad
        return {"version": STATE_VERSION, "next_batch": next_batch, "offset": offset, "bad_records": bad, **self._meta}

    def set_state(self, state):
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ConfigError(f"not a train-iterator state of version {STATE_VERSION}: {state!r}")
        for field in ("dataset", "seed", "global_batch_size", "num_records"):
            if state.get(field) != self._meta[field]:
                raise ConfigError(
                    f"iterator state has {field}={state.get(field)!r} but this iterator has {self._meta[field]!r}"
                )
        offset = int(state["offset"])
        if offset and _saved_rows(state.get("rows")) != self._meta["rows"]:
            # A partly used batch (records were skipped): only the rows this state was read with are meaningful.
            raise ConfigError(
                f"iterator state with a partly used batch (offset={offset}) was saved for rows "
                f"{state.get('rows')!r} of each global batch; this iterator reads rows {self._meta['rows']!r}"
            )
        self._start(int(state["next_batch"]), int(state["bad_records"]))
        if offset:
            self._pull()
            self._offset = offset

    def close(self):
        it, self._it = self._it, None
        if it is not None and hasattr(it, "close"):
            it.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # Interpreter shutdown: modules may already be gone.
            pass


class EvalIterator:
    """One pass over the eval split: per-process batches {"image", "label", "mask"}; len() = number of batches."""

    def __init__(self, batch_fn, normalize, num_batches, settings):
        self._num_batches, self._workers = num_batches, settings.num_workers
        self._it = grain_iterator(batch_fn, normalize, 0, num_batches, settings.num_workers, settings.prefetch)
        self.bad_records = 0

    def __len__(self):
        return self._num_batches

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            raise StopIteration
        try:
            batch = next(self._it)
        except StopIteration:
            self.close()
            if self._workers:
                release_handed_over_batches()
            raise
        self.bad_records += int(batch.pop("_bad"))
        return batch

    def close(self):
        it, self._it = self._it, None
        if it is not None and hasattr(it, "close"):
            it.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _saved_rows(rows):
    """The ``rows`` of a saved state as ``[[start, stop], ...]``; states written before rows could be several
    blocks hold one ``[lo, hi]``."""
    if isinstance(rows, (list, tuple)) and len(rows) == 2 and all(isinstance(r, int) for r in rows):
        return [list(rows)]
    return rows


def make_train_iterator(data_config, *, global_batch_size, seed, process_index=None, process_count=None, rows=None,
                        normalize=True):
    """Infinite, deterministic, per-process sharded, exactly resumable train iterator (see module docstring).

    ``normalize`` False: images come out uint8 [b,S,S,C], as the batch functions build them, for a caller that
    normalises them elsewhere (``benchmarks/bench_input_peer.py`` against a tf.data peer that stops at uint8 too).

    This process yields the same rows of every global batch, in increasing order: ``rows`` (``(start, stop)``
    blocks, e.g. ``data.sharding.process_batch_rows(mesh, global_batch_size)``), or the ``process_index``-th of
    ``process_count`` equal slices (default: from JAX).
    """
    settings = validate_data_config(data_config)
    geometry = Geometry(global_batch_size, process_rows(global_batch_size, process_index, process_count, rows))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative int, got {seed!r}")
    seed = int(seed)
    train_src, _, num_classes, channels = sources.open_sources(settings)
    if settings.name == MNIST1D:
        order = Order(len(train_src), seed, settings.read_block, settings.read_window)
        meta = _train_meta(settings, seed, global_batch_size, len(train_src), geometry)
        return TrainIterator(SignalBatch(train_src, geometry, order), Normalize(None, None), geometry.per_process,
                             settings, meta, 0)
    mean, std = normalization(settings.name, channels)
    records = Records(train_src, channels, num_classes, settings.skip_bad_records)
    fn = TrainBatch(settings, records, None, None, seed, geometry, channels, mean)
    cache = None
    if settings.cache:
        deterministic = None if settings.augment.random_resized_crop else (lambda img: fn.element(img, 0))
        cache = build_cache(records, deterministic)
    num_records = len(cache.labels) if cache is not None else len(train_src)
    fn.cache, fn.order = cache, Order(num_records, seed, settings.read_block, settings.read_window)
    if cache is not None:
        fn.records = None  # Everything is in memory; do not ship the source to workers.
    meta = _train_meta(settings, seed, global_batch_size, num_records, geometry)
    return TrainIterator(fn, Normalize(mean, std) if normalize else HandOver(), geometry.per_process, settings, meta,
                         cache.skipped if cache is not None else 0)


def _train_meta(settings, seed, global_batch_size, num_records, geometry):
    """What a saved iterator state must agree with (``TrainIterator.set_state``), and the rows it was read with."""
    return {
        "dataset": settings.name,
        "seed": seed,
        "global_batch_size": global_batch_size,
        "num_records": num_records,
        "rows": [list(block) for block in geometry.rows],
    }


def make_eval_iterator(data_config, *, global_batch_size, process_index=None, process_count=None, rows=None):
    """One pass over the eval split, padded (mask False) so every example counts exactly once across processes.

    ``rows`` / ``process_index``, ``process_count`` as for ``make_train_iterator``.
    """
    settings = validate_data_config(data_config)
    geometry = Geometry(global_batch_size, process_rows(global_batch_size, process_index, process_count, rows))
    _, eval_src, num_classes, channels = sources.open_sources(settings)
    n = len(eval_src)
    num_batches = -(-n // global_batch_size)
    if settings.name == MNIST1D:
        return EvalIterator(SignalBatch(eval_src, geometry), Normalize(None, None), num_batches, settings)
    mean, std = normalization(settings.name, channels)
    records = Records(eval_src, channels, num_classes, settings.skip_bad_records)
    fn = EvalBatch(settings, records, n, geometry, channels)
    return EvalIterator(fn, Normalize(mean, std), num_batches, settings)
