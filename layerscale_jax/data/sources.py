"""Record sources: prepared TFDS datasets (array_record, read without TensorFlow), `digits` and `synthetic`.

A source is a picklable random-access object: `len(source)` records, `source.read(keys)` -> list of
`(image, label)` where `image` is encoded bytes (PNG/JPEG, decoded later by `transforms.decode_image`) or a uint8
array. `source.describe(key)` names a record in error messages.

TensorFlow is never imported here: `tensorflow_datasets` is imported lazily (it does not import TensorFlow for
reading array_record data), and `digits` is prepared in a subprocess (`python -m layerscale_jax.data.prepare`),
because preparing a TFDS dataset imports TensorFlow.
"""

import contextlib
import io
import logging
import os
import subprocess
import sys

import numpy as np

from layerscale_jax.data.config import DIGITS, MNIST1D, SYNTHETIC
from layerscale_jax.errors import ConfigError, InputFileError
from layerscale_jax.paths import as_path, is_url

PREPARE_MODULE = "layerscale_jax.data.prepare"


class DatasetNotPreparedError(FileNotFoundError):
    """A TFDS dataset is not prepared (as array_record) in the data directory."""


class BadRecordError(InputFileError):
    """A record whose image cannot be decoded or whose label is outside [0, num_classes)."""


def resolve_data_dir(data_dir):
    """`data.data_dir`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets (TFDS's own rule): an absolute local path
    (`~` expanded, `file://` removed) or a `gs://` URL, as a string (`layerscale_jax.paths`)."""
    if data_dir:
        return os.fspath(as_path(data_dir, "data.data_dir"))
    return os.fspath(as_path(os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets", "TFDS_DATA_DIR"))


def prepare_command(name, data_dir, manual_dir=None):
    cmd = f"python -m {PREPARE_MODULE} --name={name} --data_dir={data_dir}"
    if manual_dir:
        cmd += f" --manual_dir={manual_dir}"
    return cmd


def _tfds():
    import tensorflow_datasets as tfds  # Lazy: heavy, and only needed for TFDS-backed names.

    return tfds


class _UnpreparedFolderWarning(logging.Filter):
    """TFDS warns "Variant folder ... has no dataset_info.json" each time it looks at a dataset that is not prepared
    (twice before this module's one error line, which says how to prepare it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "has no dataset_info.json" not in record.getMessage()


_UNPREPARED_FOLDER_WARNING = _UnpreparedFolderWarning()


def tfds_builder(name, data_dir):
    """The TFDS builder of `name` in `data_dir` (digits: the package's own builder). Does not prepare."""
    tfds = _tfds()
    if name == DIGITS:
        from layerscale_jax.data.digits import Digits

        return Digits(data_dir=data_dir)
    if _UNPREPARED_FOLDER_WARNING not in logging.getLogger("absl").filters:
        logging.getLogger("absl").addFilter(_UNPREPARED_FOLDER_WARNING)
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
        # TFDS's own message lists all ~450 dataset names; name the closest few instead.
        from layerscale_jax.errors import did_you_mean

        base = name.split("/")[0].split(":")[0]
        known = [DIGITS, SYNTHETIC] + list(tfds.list_builders(with_community_datasets=False))
        detail = did_you_mean(base, known) if base not in known else f" ({str(e).splitlines()[0]})"
        raise ConfigError(
            f"data.name={name!r} is neither 'digits', 'synthetic' nor a TFDS dataset name{detail}"
        ) from None


def _is_prepared_as_array_record(builder):
    if not builder.is_prepared():
        return False
    fmt = builder.info.file_format
    return fmt is not None and "array_record" in str(getattr(fmt, "value", fmt))


def _not_prepared_error(builder, name, data_dir):
    manual_dir = os.path.join(data_dir, "downloads", "manual")
    lines = []
    if builder.is_prepared():
        lines.append(
            f"TFDS dataset '{name}' is prepared in data dir '{data_dir}' as {builder.info.file_format}, but reading "
            "it with grain needs file_format='array_record'. Prepare it as array_record (into another data_dir, "
            "or after removing the old copy) with:"
        )
    else:
        lines.append(f"TFDS dataset '{name}' is not prepared in data dir '{data_dir}'. Prepare it with:")
    manual = getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None)
    lines.append("  " + prepare_command(name, data_dir, manual_dir if manual else None))
    if manual:
        lines.append(
            f"'{name}' needs files you download by hand; put them in the manual dir '{manual_dir}' first. "
            f"TFDS says: {' '.join(str(manual).split())}"
        )
    return DatasetNotPreparedError("\n".join(lines))


@contextlib.contextmanager
def _file_lock(path):
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare_digits(data_dir):
    """Prepares `digits` in `data_dir` (once; safe when several processes call it), in a subprocess."""
    from layerscale_jax.data.digits import Digits

    # Check for the files first: constructing a builder on an empty directory logs a warning.
    info_file = as_path(data_dir) / DIGITS / str(Digits.VERSION) / "dataset_info.json"
    if info_file.exists():
        builder = tfds_builder(DIGITS, data_dir)
        if _is_prepared_as_array_record(builder):
            return builder
    lock = contextlib.nullcontext() if is_url(data_dir) else _file_lock(os.path.join(data_dir, ".digits.prepare.lock"))
    with lock:                  # a bucket has no file locks: there, prepare it once beforehand (data.prepare)
        builder = tfds_builder(DIGITS, data_dir)
        if not _is_prepared_as_array_record(builder):
            cmd = [sys.executable, "-m", PREPARE_MODULE, f"--name={DIGITS}", f"--data_dir={data_dir}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"preparing 'digits' in '{data_dir}' failed (command: {' '.join(cmd)}):\n{proc.stderr[-4000:]}"
                )
            builder = tfds_builder(DIGITS, data_dir)
    return builder


def open_builder(name, data_dir):
    """A prepared (array_record) TFDS builder; prepares `digits` on first use, raises for other unprepared names."""
    data_dir = resolve_data_dir(data_dir)
    if name == DIGITS:
        return prepare_digits(data_dir)
    builder = tfds_builder(name, data_dir)
    if not _is_prepared_as_array_record(builder):
        raise _not_prepared_error(builder, name, data_dir)
    return builder


def split_names(builder, train_split="train", eval_split=None):
    """(train split, eval split) of a TFDS builder, checked against its splits. ``eval_split`` None: 'test' if the
    dataset has one, else 'validation' (imagenet2012). TFDS split strings ('train[:99%]') are accepted."""
    splits = set(builder.info.splits.keys())
    if eval_split is None:
        eval_split = next((s for s in ("test", "validation") if s in splits), None)
        if eval_split is None:
            raise ConfigError(f"TFDS dataset '{builder.name}' has neither a 'test' nor a 'validation' split "
                              f"(splits: {sorted(splits)}); name one with data.eval_split")
    for field, split in (("train_split", train_split), ("eval_split", eval_split)):
        try:
            builder.info.splits[split]
        except (KeyError, ValueError) as e:
            raise ConfigError(f"data.{field}={split!r} is not a split of TFDS dataset '{builder.name}' "
                              f"(splits: {sorted(splits)}): {str(e).splitlines()[0]}") from None
    return train_split, eval_split


def image_label_keys(builder):
    keys = builder.info.supervised_keys
    if not keys or len(keys) != 2 or not all(isinstance(k, str) for k in keys):
        return "image", "label"
    return keys


class TfdsSource:
    """One split of a prepared TFDS dataset, read with `builder.as_data_source` (array_record, no TensorFlow).

    Images are read undecoded (`tfds.decode.SkipDecoding`) and decoded by the pipeline, so an undecodable image
    becomes a named bad record. The data source is opened lazily so the object pickles cheaply to grain workers.
    """

    def __init__(self, name, data_dir, split, num_records, image_key, label_key):
        self.name, self.data_dir, self.split = name, data_dir, split
        self._num_records = num_records
        self._image_key, self._label_key = image_key, label_key
        self._ds = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_ds"] = None
        return state

    def _open(self):
        if self._ds is None:
            tfds = _tfds()
            builder = tfds_builder(self.name, self.data_dir)
            self._ds = builder.as_data_source(self.split, decoders={self._image_key: tfds.decode.SkipDecoding()})
        return self._ds

    def __len__(self):
        return self._num_records

    def describe(self, key):
        return f"record {int(key)} of TFDS '{self.name}' split '{self.split}' in '{self.data_dir}'"

    def read(self, keys):
        ds = self._open()
        records = ds.__getitems__([int(k) for k in keys])
        return [(r[self._image_key], r[self._label_key]) for r in records]


class InMemorySource:
    """Records held in lists: (image bytes or uint8 array, label). Used by tests and for ad-hoc data."""

    def __init__(self, images, labels, name="in_memory", split="train"):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.labels = list(images), list(labels)
        self.name, self.split = name, split

    def __len__(self):
        return len(self.images)

    def describe(self, key):
        return f"record {int(key)} of '{self.name}' split '{self.split}'"

    def read(self, keys):
        return [(self.images[int(k)], self.labels[int(k)]) for k in keys]


class SyntheticSource:
    """Random images and labels, a pure function of (split, key).

    Labels: a SplitMix64 hash of (key, split) modulo num_classes. Raw mode: uniform uint8 images of shape
    (image_size, image_size, channels), the window at offset key * NOISE_STRIDE mod NOISE_BYTES of a fixed 4 MiB
    noise buffer per split (distinct offsets for distinct keys below 4 Mi, one copy per image). JPEG mode
    (`data.synthetic_jpeg_shape=(h, w)`): the record is one of `JPEG_POOL` pre-encoded smooth random JPEGs of that
    shape (quality 90), cycled by key, so a benchmark measures decoding rather than encoding.
    """

    JPEG_POOL = 16
    NOISE_BYTES = 1 << 22
    NOISE_STRIDE = 7919  # prime, so key -> offset is injective for key < NOISE_BYTES

    def __init__(self, split, num_records, image_size, channels, num_classes, jpeg_shape=None):
        self.name, self.split = SYNTHETIC, split
        self._split_id = 0 if split == "train" else 1
        self._n, self._size, self._channels, self._k = num_records, image_size, channels, num_classes
        self._jpeg_shape = jpeg_shape
        self._pool = self._make_jpeg_pool() if jpeg_shape else None
        self._noise = None  # built on first read, in the process that reads (not pickled to workers)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_noise"] = None
        return state

    def _make_jpeg_pool(self):
        from PIL import Image

        h, w = self._jpeg_shape
        pool = []
        for i in range(self.JPEG_POOL):
            rng = np.random.default_rng([7, i])
            coarse = rng.uniform(0, 255, (max(h // 16, 2), max(w // 16, 2), self._channels)).astype(np.float32)
            mode = "RGB" if self._channels == 3 else "L"
            arr = coarse.astype(np.uint8) if self._channels == 3 else coarse[..., 0].astype(np.uint8)
            img = Image.fromarray(arr, mode=mode).resize((w, h), Image.BICUBIC)
            noise = rng.normal(0, 12, (h, w, self._channels))
            arr = np.clip(np.asarray(img, np.float32).reshape(h, w, self._channels) + noise, 0, 255).astype(np.uint8)
            img = Image.fromarray(arr if self._channels == 3 else arr[..., 0], mode=mode)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            pool.append(buf.getvalue())
        return pool

    def __len__(self):
        return self._n

    def describe(self, key):
        return f"record {int(key)} of 'synthetic' split '{self.split}'"

    def read(self, keys):
        keys = np.asarray(keys, np.uint64)
        labels = (_splitmix64(keys * np.uint64(2) + np.uint64(self._split_id)) % np.uint64(self._k)).astype(int)
        if self._pool is not None:
            return [(self._pool[int(k) % len(self._pool)], int(y)) for k, y in zip(keys, labels)]
        shape = (self._size, self._size, self._channels)
        n = int(np.prod(shape))
        if self._noise is None:
            rng = np.random.default_rng([3, self._split_id])
            self._noise = rng.integers(0, 256, self.NOISE_BYTES + n, dtype=np.uint8)
        offsets = (keys * np.uint64(self.NOISE_STRIDE)) % np.uint64(self.NOISE_BYTES)
        return [(self._noise[o : o + n].reshape(shape), int(y)) for o, y in zip(offsets.astype(np.int64), labels)]


class SignalSource:
    """One split of 1-D signals held in memory (`mnist1d`): ``signals`` float32 [n, length], ``labels`` int32 [n].
    The pipeline batches them without decoding or augmentation (``data.batches.SignalBatch``)."""

    def __init__(self, name, split, signals, labels):
        self.name, self.split, self.signals, self.labels = name, split, signals, labels

    def __len__(self):
        return len(self.labels)

    def describe(self, key):
        return f"record {int(key)} of '{self.name}' split '{self.split}'"

    def read(self, keys):
        return [(self.signals[int(k)], int(self.labels[int(k)])) for k in keys]


def open_mnist1d(settings):
    """(train source, eval source, num_classes, channels) of `mnist1d`: ``SignalSource``s, generated and stored in
    the data dir on first use; one channel."""
    from layerscale_jax.data import mnist1d

    data_dir = resolve_data_dir(settings.data_dir)
    if is_url(data_dir):
        raise ConfigError(f"data.data_dir={data_dir!r}: mnist1d is generated on this machine; give a local data dir")
    splits = mnist1d.load(data_dir, settings.mnist1d)
    names = settings.train_split, settings.eval_split or "test"
    train, evaluated = (SignalSource(MNIST1D, split, *splits[split]) for split in names)
    return train, evaluated, mnist1d.NUM_CLASSES, 1


def _splitmix64(x):
    """A fast, well-mixed hash of uint64 counters (Steele et al.'s SplitMix64 finaliser), vectorised."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def open_sources(settings):
    """(train source, eval source, num_classes, channels) for validated `settings`."""
    if settings.name == SYNTHETIC:
        for field, split, allowed in (("train_split", settings.train_split, "train"),
                                      ("eval_split", settings.eval_split or "test", "test")):
            if split != allowed:
                raise ConfigError(f"data.{field}={split!r}: the 'synthetic' dataset has the splits 'train' (trained "
                                  f"on) and 'test' (evaluated) only")
        make = lambda split, n: SyntheticSource(  # noqa: E731
            split, n, settings.image_size, settings.channels, settings.num_classes, settings.synthetic_jpeg_shape
        )
        return (
            make("train", settings.num_train),
            make("test", settings.num_test),
            settings.num_classes,
            settings.channels,
        )
    if settings.name == MNIST1D:
        return open_mnist1d(settings)
    data_dir = resolve_data_dir(settings.data_dir)
    builder = open_builder(settings.name, data_dir)
    train_split, eval_split = split_names(builder, settings.train_split, settings.eval_split)
    image_key, label_key = image_label_keys(builder)
    features = builder.info.features
    num_classes = getattr(features[label_key], "num_classes", None)
    if not num_classes:
        raise ConfigError(f"TFDS dataset '{settings.name}' feature '{label_key}' is not a ClassLabel")
    shape = getattr(features[image_key], "shape", None)
    channels = shape[-1] if shape and shape[-1] in (1, 3) else 3
    splits = builder.info.splits
    make = lambda split: TfdsSource(  # noqa: E731
        settings.name, data_dir, split, splits[split].num_examples, image_key, label_key
    )
    return make(train_split), make(eval_split), int(num_classes), int(channels)
