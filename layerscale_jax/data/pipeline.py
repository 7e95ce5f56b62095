"""Train and eval iterators: deterministic, per-process sharded, exactly resumable; grain runs them.

Order (train). The global stream is a sequence of positions q = 0, 1, 2, ...; position q is record
`perm_e[q mod N]` of epoch e = q // N, where perm_e is a permutation of the N train records seeded by (seed, e), so
every epoch visits every record once, reshuffled per epoch, and batches run on across epoch boundaries (an infinite
stream has no remainder to drop). Global batch j is positions [j G, (j + 1) G): its row i is position j G + i. A
process reads only the rows of each global batch that its devices hold: `rows`, sorted ``(start, stop)`` blocks
derived from the batch sharding by the train loop (`data.sharding.process_batch_rows`; any number of blocks, as a
TPU topology or a multi-slice mesh lays them out; processes whose devices hold the same rows, e.g. tensor
parallelism spanning processes, read the same data), by default the p-th of P equal slices [p b, (p + 1) b),
b = G / P. Its local batch is those rows in increasing order. The batch an example lands in, and its row there,
therefore do not depend on the number of processes or the device layout.

Randomness. Batch j's augmentation parameters are drawn from a generator seeded by (seed, j) for all G images of
the global batch, and each process takes its rows; per-image crops use a generator seeded by (seed, q). So row i of
batch j is a pure function of (config, seed, j, i): the number of grain workers, prefetch threads or processes and
the mesh's device order change nothing. (Mixup/CutMix run later, inside the jitted step on the global batch.)

Execution. `grain.MapDataset.range(j0, ...).map(batch_fn)` -> `to_iter_dataset` (prefetch threads) -> optional
`mp_prefetch` (worker processes) -> `_Normalize`. One grain element is one batch: records are read in a batch read,
fixed-size work is vectorised in numpy over the batch, and grain's per-element overhead is paid once per batch
rather than once per image. (`grain.DataLoader` with an `IndexSampler` pays it per image, which caps its throughput
even with no-op transforms: too slow for `digits`.) Batches stay uint8 until
`_Normalize`, which runs after the worker-process boundary (in a prefetch thread of the calling process), so a
worker hands over a quarter of the bytes through shared memory, and the float32 batch is written once, into an
ordinary array (no copy out of shared memory).

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
import dataclasses
import gc
import threading
import time

import numpy as np
from PIL import Image

from layerscale_jax.data import sources, transforms
from layerscale_jax.data.config import DIGITS, SYNTHETIC, validate_data_config
from layerscale_jax.data.randaugment import rand_augment
from layerscale_jax.data.sharding import normalize_rows, row_indices
from layerscale_jax.data.sources import BadRecordError

STATE_VERSION = 1
_INFINITE = 2**62  # "infinite" number of train batches.
_READ_CHUNK = 1024  # records per read when filling the cache.

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Per-dataset normalisation constants (mean, std of pixel values / 255 over the train split).
NORMALIZATION = {
    DIGITS: ((0.3048,), (0.3756,)),  # computed on the 1,442 digits train images (0..255 scaling).
    SYNTHETIC: (None, None),  # uniform noise: 0.5 and 1/sqrt(12) per channel, filled in by `normalization`.
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagenet2012": (IMAGENET_MEAN, IMAGENET_STD),
    "imagenet_v2": (IMAGENET_MEAN, IMAGENET_STD),
    "imagenette": (IMAGENET_MEAN, IMAGENET_STD),
}


def normalization(name, channels):
    """(mean, std) tuples for dataset `name`; unknown names: ImageNet's (3 channels) or 0.5 / 0.5 (1 channel)."""
    base = name.split("/")[0].split(":")[0]
    if base == SYNTHETIC:
        return (0.5,) * channels, (float(1 / np.sqrt(12)),) * channels
    if base in NORMALIZATION:
        mean, std = NORMALIZATION[base]
        if len(mean) == channels:
            return mean, std
    return (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,) * channels, (0.5,) * channels)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What the model and the train loop need to know about a dataset."""

    name: str
    num_classes: int
    image_size: int  # square side the model sees
    channels: int
    num_train: int
    num_test: int  # examples of the evaluated split (`eval_split`)
    mean: tuple  # per channel, of pixel / 255
    std: tuple
    train_split: str = "train"
    eval_split: str = "test"


def _info(settings, train_src, eval_src, num_classes, channels):
    mean, std = normalization(settings.name, channels)
    return DatasetInfo(
        train_split=train_src.split,
        eval_split=eval_src.split,
        name=settings.name,
        num_classes=num_classes,
        image_size=settings.image_size,
        channels=channels,
        num_train=len(train_src),
        num_test=len(eval_src),
        mean=tuple(mean),
        std=tuple(std),
    )


def get_dataset_info(data_config):
    """DatasetInfo for `data_config` (prepares `digits` on first use; raises if a TFDS dataset is not prepared)."""
    settings = validate_data_config(data_config)
    return _info(settings, *sources.open_sources(settings))


# --------------------------------------------------------------------------------------------- order & records


class _Order:
    """Position q -> record key: perm_e[q mod N] with perm_e seeded by (seed, e). Keeps a few epochs cached.

    perm_e is a uniform permutation of the N records, or, with `block` > 0 (`data.read_block`), a read plan for
    sharded storage: the records in blocks of `block` consecutive keys (consecutive records of one ArrayRecord shard),
    the blocks in a random order, and the records of every `window` consecutive blocks of that order shuffled
    together (`data.read_window`). A process reads consecutive positions of each global batch (its rows), so a batch
    of b rows touches at most ~2 `window` blocks, b / `window` records from each, instead of b records spread over
    every shard. Each epoch still visits every record once, and the plan is a function of (seed, epoch) alone.
    """

    _KEEP = 4

    def __init__(self, num_records, seed, block=0, window=1):
        self.n, self.seed, self.block, self.window = num_records, seed, block, window
        self._perms = collections.OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"n": self.n, "seed": self.seed, "block": self.block, "window": self.window}

    def __setstate__(self, state):
        self.__init__(state["n"], state["seed"], state["block"], state["window"])

    def _plan(self, epoch):
        rng = np.random.default_rng([self.seed, 0, epoch])
        if not self.block:
            return rng.permutation(self.n)
        starts = rng.permutation(np.arange(0, self.n, self.block))
        order = (starts[:, None] + np.arange(self.block)).ravel()
        order = order[order < self.n]                     # the last block may be short
        span = self.block * self.window
        full = self.n - self.n % span
        order[:full] = rng.permuted(order[:full].reshape(-1, span), axis=1).ravel()
        order[full:] = rng.permutation(order[full:])
        return order

    def _perm(self, epoch):
        with self._lock:
            perm = self._perms.get(epoch)
            if perm is None:
                perm = self._plan(epoch)
                self._perms[epoch] = perm
                if len(self._perms) > self._KEEP:
                    self._perms.popitem(last=False)
            return perm

    def keys(self, positions):
        epochs = positions // self.n
        out = np.empty_like(positions)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm(int(e))[positions[sel] % self.n]
        return out


class _Records:
    """Reads, checks and decodes records of a source. Bad records raise, or come back as None when skipping."""

    def __init__(self, source, channels, num_classes, skip_bad):
        self.source, self.channels, self.num_classes, self.skip_bad = source, channels, num_classes, skip_bad

    def read(self, keys):
        """The source's records of `keys`, read in increasing key order (so in file order within each shard of a
        sharded source), returned in the order of `keys`."""
        keys = np.asarray(keys)
        ascending = np.argsort(keys, kind="stable")
        records = [None] * len(keys)
        for i, record in zip(ascending, self.source.read(keys[ascending])):
            records[i] = record
        return records

    def load(self, keys, decode=None):
        """(images, labels) of `keys`; `decode(raw, i)` turns record i's stored image into the image returned
        (default: `transforms.decode_image`), its ValueError marking the record bad like a decode error."""
        images, labels = [], np.zeros(len(keys), np.int32)
        for i, (key, (raw, label)) in enumerate(zip(keys, self.read(keys))):
            try:
                label = int(label)
                if not 0 <= label < self.num_classes:
                    raise ValueError(f"label {label} is outside [0, {self.num_classes})")
                image = decode(raw, i) if decode else transforms.decode_image(raw, self.channels)
            except (ValueError, TypeError) as e:
                images.append(self.bad(key, e))
                continue
            images.append(image)
            labels[i] = label
        return images, labels

    def bad(self, key, error):
        """Record `key` is bad (`error` says why): BadRecordError naming it, or None when skipping."""
        if not self.skip_bad:
            raise BadRecordError(
                f"bad {self.source.describe(key)}: {error}. "
                "Set data.skip_bad_records=True to skip (and count) such records."
            )
        return None


@dataclasses.dataclass
class _Cache:
    images: object  # uint8 [N, S, S, C] when `final`, else a list of decoded images of any size
    labels: np.ndarray
    final: bool  # images are already at the model's size (the per-image train stage is deterministic)
    skipped: int


def _build_cache(records, element_fn):
    """Decodes the whole split (in chunks) into memory; `element_fn` (or None) is the deterministic image stage."""
    images, labels, skipped = [], [], 0
    n = len(records.source)
    for start in range(0, n, _READ_CHUNK):
        keys = np.arange(start, min(start + _READ_CHUNK, n))
        imgs, labs = records.load(keys)
        for img, lab in zip(imgs, labs):
            if img is None:
                skipped += 1
                continue
            images.append(element_fn(img) if element_fn else img)
            labels.append(lab)
    if not images:
        raise ValueError(f"every record of {records.source.describe(0).split(' of ', 1)[1]} is bad")
    final = element_fn is not None
    return _Cache(np.stack(images) if final else images, np.asarray(labels, np.int32), final, skipped)


# --------------------------------------------------------------------------------------------- batch functions


@dataclasses.dataclass
class _Geometry:
    """This process reads the rows `rows` (sorted ``(start, stop)`` blocks) of every global batch; `index` holds
    their global row indices in local order."""
    global_batch: int
    rows: tuple

    def __post_init__(self):
        self.index = row_indices(self.rows)
        self.per_process = len(self.index)

    def positions(self, j):
        return j * self.global_batch + self.index


class _TrainBatch:
    """Train batch j of this process: {"image": uint8 [b,S,S,C], "label": int32 [b], "_valid": bool [b]}."""

    def __init__(self, settings, records, cache, order, seed, geometry, channels, mean):
        self.s, self.aug = settings, settings.augment
        self.records, self.cache, self.order, self.seed, self.g = records, cache, order, seed, geometry
        self.channels = channels
        fill = tuple(int(round(255 * m)) for m in mean)  # RandAugment's fill: the mean colour
        self.fill = fill if channels == 3 else fill[0]

    def element(self, image, position, defer=False):
        """Per-image train stage on a decoded image or a stored record (decoded only as far as its crop needs):
        random-resized crop (seeded by position) or resize + centre crop. `defer`: a bilinear JPEG window comes
        back undecoded (`transforms.JpegWindow`), for `_decode_windows`."""
        if self.aug.random_resized_crop:
            rng = np.random.default_rng([self.seed, 2, int(position)])
            return transforms.decode_random_resized_crop(
                image, self.channels, self.s.image_size, self.aug.crop_scale, rng, self.aug.interpolation, defer
            )
        return transforms.resize_center_crop(transforms.decode_image(image, self.channels), self.s.image_size)

    def __call__(self, j):
        g, size = self.g, self.s.image_size
        positions = g.positions(j)
        keys = self.order.keys(positions)
        valid = np.ones(g.per_process, bool)
        if self.cache is not None:
            labels = self.cache.labels[keys]
            if self.cache.final:
                x = self.cache.images[keys]
            else:
                x = np.stack([self.element(self.cache.images[k], q) for k, q in zip(keys, positions)])
        else:
            images, labels = self.records.load(keys, lambda raw, i: self.element(raw, positions[i], defer=True))
            self._decode_windows(images, keys)
            x = np.zeros((g.per_process, size, size, self.channels), np.uint8)
            for i, image in enumerate(images):
                if image is None:
                    valid[i] = False
                else:
                    x[i] = image
        return {"image": self.augment(x, j), "label": labels, "_valid": valid}

    def _decode_windows(self, images, keys):
        """Replaces the batch's `JpegWindow`s by their crops, decoded in one call (`transforms.bilinear_jpeg_crops`);
        a window that cannot be decoded makes its record bad."""
        at = [i for i, image in enumerate(images) if isinstance(image, transforms.JpegWindow)]
        crops = transforms.bilinear_jpeg_crops([images[i] for i in at], self.s.image_size, self.channels)
        for i, crop in zip(at, crops):
            images[i] = self.records.bad(keys[i], crop) if isinstance(crop, ValueError) else crop

    def draw(self, j):
        """Random parameters of batch j, drawn for the whole global batch (seeded by (seed, j)), then this
        process's rows taken."""
        aug, g = self.aug, self.g
        rng = np.random.default_rng([self.seed, 1, int(j)])
        n, sl = g.global_batch, g.index
        params = {}
        if aug.crop_padding:
            params["offsets"] = rng.integers(0, 2 * aug.crop_padding + 1, size=(n, 2))[sl]
        if aug.hflip:
            params["flip"] = (rng.random(n) < 0.5)[sl]
        if aug.randaugment is not None:
            params["randaugment_seed"] = rng.integers(0, 2**63, size=n)[sl]
        if aug.three_augment:
            params["three_augment"] = rng.integers(0, 3, size=n)[sl]
            params["blur_sigma"] = rng.uniform(0.1, 2.0, size=n)[sl]
        if aug.color_jitter > 0:
            s = aug.color_jitter
            params["jitter_factors"] = rng.uniform(max(0.0, 1.0 - s), 1.0 + s, size=(n, 3))[sl]
            params["jitter_order"] = np.argsort(rng.random((n, 3)), axis=1)[sl]
        return params

    def augment(self, x, j):
        """Batch stage on uint8 [b, S, S, C], a new array of this batch (changed in place): translate -> flip ->
        per-image PIL ops; uint8 out (normalised by `_Normalize`)."""
        aug, p = self.aug, self.draw(j)
        if aug.crop_padding:
            x = transforms.translate(x, p["offsets"][:, 0], p["offsets"][:, 1], aug.crop_padding)
        per_image = aug.randaugment is not None or aug.three_augment or aug.color_jitter > 0
        if aug.hflip and not per_image:  # else flipped in `per_image`, where the image is in PIL anyway.
            x = transforms.hflip(x, p["flip"])
        if per_image:
            for i in range(len(x)):
                x[i] = self.per_image(x[i], {k: v[i] for k, v in p.items()})
        return x

    def per_image(self, image, p):
        """Flip -> RandAugment -> 3-Augment -> colour jitter on one uint8 image, with PIL."""
        aug = self.aug
        img = transforms.to_pil(image)
        if aug.hflip and p["flip"]:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if aug.randaugment is not None:
            img = rand_augment(img, aug.randaugment, np.random.default_rng(p["randaugment_seed"]), self.fill)
        if aug.three_augment:
            img = transforms.three_augment(img, p["three_augment"], p["blur_sigma"])
        if aug.color_jitter > 0:
            img = transforms.color_jitter(img, p["jitter_factors"], p["jitter_order"])
        return transforms.from_pil(img)


class _EvalBatch:
    """Eval batch j (uint8 images): positions past the end of the split are padding (mask False), as are skipped
    bad records."""

    def __init__(self, settings, records, num_records, geometry, channels):
        self.s, self.records, self.n, self.g = settings, records, num_records, geometry
        self.channels = channels

    def __call__(self, j):
        g, size = self.g, self.s.image_size
        positions = g.positions(j)
        real = np.flatnonzero(positions < self.n)
        x = np.zeros((g.per_process, size, size, self.channels), np.uint8)
        labels = np.zeros(g.per_process, np.int32)
        mask = np.zeros(g.per_process, bool)
        images, labs = self.records.load(positions[real]) if real.size else ([], [])
        bad = 0
        for i, image, label in zip(real, images, labs):
            if image is None:
                bad += 1
                continue
            x[i] = transforms.resize_center_crop(image, size, self.s.crop_pct)
            labels[i], mask[i] = label, True
        return {"image": x, "label": labels, "mask": mask, "_bad": np.int64(bad)}


class _Normalize:
    """The last stage of every batch: its uint8 "image" normalised into a new float32 array, the other arrays
    copied. After the worker-process boundary, so what grain handed over in shared memory is read once and
    released now (rather than by finalizers at interpreter exit, which fail noisily)."""

    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, batch):
        return {k: transforms.normalize(v, self.mean, self.std) if k == "image" else np.array(v, copy=True)
                for k, v in batch.items()}


def _grain_iterator(batch_fn, normalize, start, stop, num_workers, prefetch):
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


# --------------------------------------------------------------------------------------------- iterators


class TrainIterator:
    """Infinite iterator of per-process train batches {"image": float32 [b,S,S,C], "label": int32 [b]}.

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

    @property
    def per_process_batch_size(self):
        return self._b

    def _start(self, next_batch, bad_records):
        self.close()
        s = self._settings
        self._it = _grain_iterator(self._fn, self._normalize, next_batch, _INFINITE, s.num_workers, s.prefetch)
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
            raise ValueError(f"not a train-iterator state of version {STATE_VERSION}: {state!r}")
        for field in ("dataset", "seed", "global_batch_size", "num_records"):
            if state.get(field) != self._meta[field]:
                raise ValueError(
                    f"iterator state has {field}={state.get(field)!r} but this iterator has {self._meta[field]!r}"
                )
        offset = int(state["offset"])
        if offset and _saved_rows(state.get("rows")) != self._meta["rows"]:
            # A partly used batch (records were skipped): only the rows this state was read with are meaningful.
            raise ValueError(
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


def _release_handed_over_batches():
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


class EvalIterator:
    """One pass over the eval split: per-process batches {"image", "label", "mask"}; len() = number of batches."""

    def __init__(self, batch_fn, normalize, num_batches, settings):
        self._num_batches, self._workers = num_batches, settings.num_workers
        self._it = _grain_iterator(batch_fn, normalize, 0, num_batches, settings.num_workers, settings.prefetch)
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
                _release_handed_over_batches()
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


def _rows(global_batch_size, process_index, process_count, rows):
    """The rows of each global batch that this process reads: sorted, merged ``(start, stop)`` blocks.

    ``rows`` is given by the train loop, derived from the batch sharding (``data.sharding.process_batch_rows``): any
    number of blocks, in any order; when the mesh's batch axes do not span the processes, several processes read the
    same rows. Otherwise process ``p`` of ``P`` reads ``[p b, (p + 1) b)``, ``b = G / P`` (default: this JAX process
    of all of them).
    """
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive int, got {global_batch_size!r}")
    if rows is not None:
        if process_index is not None or process_count is not None:
            raise ValueError("give either rows or process_index/process_count, not both")
        return normalize_rows(rows, global_batch_size)
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not isinstance(process_count, int) or process_count < 1:
        raise ValueError(f"process_count must be a positive int, got {process_count!r}")
    if not isinstance(process_index, int) or not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index!r}")
    if global_batch_size % process_count:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by process_count={process_count}"
        )
    b = global_batch_size // process_count
    return ((process_index * b, (process_index + 1) * b),)


def _saved_rows(rows):
    """The ``rows`` of a saved state as ``[[start, stop], ...]``; states written before rows could be several
    blocks hold one ``[lo, hi]``."""
    if isinstance(rows, (list, tuple)) and len(rows) == 2 and all(isinstance(r, int) for r in rows):
        return [list(rows)]
    return rows


def make_train_iterator(data_config, *, global_batch_size, seed, process_index=None, process_count=None, rows=None):
    """Infinite, deterministic, per-process sharded, exactly resumable train iterator (see module docstring).

    This process yields the same rows of every global batch, in increasing order: ``rows`` (``(start, stop)``
    blocks, e.g. ``data.sharding.process_batch_rows(mesh, global_batch_size)``), or the ``process_index``-th of
    ``process_count`` equal slices (default: from JAX).
    """
    settings = validate_data_config(data_config)
    geometry = _Geometry(global_batch_size, _rows(global_batch_size, process_index, process_count, rows))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    seed = int(seed)
    train_src, _, num_classes, channels = sources.open_sources(settings)
    mean, std = normalization(settings.name, channels)
    records = _Records(train_src, channels, num_classes, settings.skip_bad_records)
    fn = _TrainBatch(settings, records, None, None, seed, geometry, channels, mean)
    cache = None
    if settings.cache:
        deterministic = None if settings.augment.random_resized_crop else (lambda img: fn.element(img, 0))
        cache = _build_cache(records, deterministic)
    num_records = len(cache.labels) if cache is not None else len(train_src)
    fn.cache, fn.order = cache, _Order(num_records, seed, settings.read_block, settings.read_window)
    if cache is not None:
        fn.records = None  # Everything is in memory; do not ship the source to workers.
    meta = {
        "dataset": settings.name,
        "seed": seed,
        "global_batch_size": global_batch_size,
        "num_records": num_records,
        "rows": [list(block) for block in geometry.rows],
    }
    return TrainIterator(fn, _Normalize(mean, std), geometry.per_process, settings, meta,
                         cache.skipped if cache is not None else 0)


def make_eval_iterator(data_config, *, global_batch_size, process_index=None, process_count=None, rows=None):
    """One pass over the eval split, padded (mask False) so every example counts exactly once across processes.

    ``rows`` / ``process_index``, ``process_count`` as for ``make_train_iterator``.
    """
    settings = validate_data_config(data_config)
    geometry = _Geometry(global_batch_size, _rows(global_batch_size, process_index, process_count, rows))
    _, eval_src, num_classes, channels = sources.open_sources(settings)
    mean, std = normalization(settings.name, channels)
    records = _Records(eval_src, channels, num_classes, settings.skip_bad_records)
    n = len(eval_src)
    num_batches = -(-n // global_batch_size)
    fn = _EvalBatch(settings, records, n, geometry, channels)
    return EvalIterator(fn, _Normalize(mean, std), num_batches, settings)


def measure_pipeline(data_config, global_batch_size, num_batches, warmup=2):
    """Images/s of the train pipeline alone (one process, process_index 0 of 1), after `warmup` batches.

    Returns a dict: images_per_s (wall clock), images_per_cpu_s, startup_seconds (iterator creation + warmup),
    num_workers, prefetch, cache, image_shape, ...
    """
    settings = validate_data_config(data_config)
    t0 = time.perf_counter()
    it = make_train_iterator(settings, global_batch_size=global_batch_size, seed=0, process_index=0, process_count=1)
    try:
        for _ in range(warmup):
            next(it)
        start_s = time.perf_counter() - t0
        t1, c1 = time.perf_counter(), time.process_time()
        for _ in range(num_batches):
            batch = next(it)
        seconds, cpu_seconds = time.perf_counter() - t1, time.process_time() - c1
    finally:
        it.close()
    return {
        "name": settings.name,
        "image_size": settings.image_size,
        "image_shape": list(batch["image"].shape[1:]),
        "global_batch_size": global_batch_size,
        "num_batches": num_batches,
        "num_workers": settings.num_workers,
        "prefetch": settings.prefetch,
        "cache": settings.cache,
        "seconds": seconds,
        "startup_seconds": start_s,
        "images_per_s": global_batch_size * num_batches / seconds,
        # CPU time of this process (prefetch threads included, worker processes not): with num_workers=0 this
        # gives images per CPU-second, a load-independent estimate of what one free core sustains.
        "process_cpu_seconds": cpu_seconds,
        "images_per_cpu_s": global_batch_size * num_batches / max(cpu_seconds, 1e-9),
    }
