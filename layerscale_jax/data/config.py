"""The data config: every field of `config.data`, its default, and its validation.

This is the one place where the input-pipeline fields are documented. `default_data_config(name)` returns an
`ml_collections.ConfigDict` with every field; `validate_data_config(cfg)` checks a config (a ConfigDict, a dict or
any attribute object; missing fields take the defaults for its `name`) and returns a frozen `DataSettings`, raising
`ValueError` naming the field and the value at the boundary where a bad value enters.

Fields (`data.*`):
  name               'digits' (offline default), 'mnist1d' (offline, 1-D signals: `data.mnist1d`), 'synthetic', or
                     any TFDS image-classification name ('cifar10', 'imagenet2012', ...) prepared as array_record in
                     `data_dir`.
  data_dir           TFDS data directory; None -> $TFDS_DATA_DIR, else ~/tensorflow_datasets. A local path (`~`
                     expanded), file://PATH or gs://BUCKET/PATH (docs/storage.md).
  train_split        the split trained on: 'train', or any TFDS split string ('train[:99%]'; digits also has
                     'train_without_validation', the train split less its stratified 'validation' part).
  eval_split         the split evaluated during and after training; None -> 'test' if the dataset has one, else
                     'validation' (imagenet2012). Metrics of the 'test' split are named test_*, of any other split
                     val_* (select rates and budgets on 'validation'; report 'test' once, for the final runs).
  image_size         square side (pixels) the model sees. digits: 8 (native), cifar*/synthetic: 32, others: 224.
                     mnist1d: the signal's length, which must equal `data.mnist1d.final_seq_length` (40).
  num_workers        grain worker processes per host (0 = batches are built in the calling process).
  prefetch           batches built ahead in background threads of each process (0 = synchronous).
  read_block         0: each epoch is a uniform permutation of the train records. > 0: a read plan for sharded
                     storage (ArrayRecord on a bucket): blocks of this many consecutive records, in a random order per
                     epoch, the records of `read_window` consecutive blocks shuffled together, so each process reads
                     a batch from a few blocks instead of every shard (`data.order.Order`; docs/data.md).
  read_window        with read_block > 0: how many blocks are shuffled together (more: better mixing, more blocks
                     read per batch).
  cache              decode the whole train split into memory once, at iterator creation (small datasets only).
  crop_pct           eval: resize the shorter side to image_size / crop_pct, then centre-crop image_size.
  skip_bad_records   False: a bad record raises an error naming it. True: it is skipped and counted
                     (`iterator.bad_records`).
  mixup_alpha        Beta(alpha, alpha) for mixup; 0 disables. Read by the train step via `mixup_cutmix`.
  cutmix_alpha       Beta(alpha, alpha) for CutMix; 0 disables.
  label_smoothing    epsilon of the smoothed one-hot targets (timm convention: off = eps / K, on = 1 - eps + off).
  augment.random_resized_crop  Inception-style random-resized crop (else: resize shorter side + centre crop).
  augment.crop_scale           (min, max) area fraction of the random-resized crop.
  augment.interpolation        resize filter of the random-resized crop: 'bicubic' (PIL bicubic, antialiased: the
                               DeiT III / timm recipe) or 'bilinear' (big_vision's inception crop with TensorFlow's
                               own ops: decode_and_crop_jpeg of the window, tf.image.resize(antialias=False), cast
                               to uint8; `data.transforms`).
  augment.crop_padding         random translation: reflect-pad by this many pixels and randomly crop back
                               (DeiT III's "simple random crop"; 1 px for digits). 0 disables.
  augment.hflip                random horizontal flip with p = 0.5 (off for digits: digits are not mirror-symmetric).
  augment.three_augment        DeiT III 3-Augment: one of grayscale / solarize / gaussian blur per image.
  augment.color_jitter         brightness, contrast and saturation jitter strength (0 disables).
  augment.randaugment          None or a timm-style RandAugment string, e.g. 'rand-m9-mstd0.5-inc1'.
  num_classes, channels, num_train, num_test   synthetic only: the shape of the random dataset.
  synthetic_jpeg_shape         synthetic only: None (raw uint8 images of image_size) or (height, width): records
                               are JPEG bytes of that shape, so the decode path is exercised (benchmarks).
  mnist1d.*          mnist1d only (`data.mnist1d`, `layerscale_jax.data.mnist1d`): the split sizes `num_train`,
                     `num_validation`, `num_test` and the generator's arguments (`seed`, `template_len`, `padding`,
                     `scale_coeff`, `max_translation`, `corr_noise_scale`, `iid_noise_scale`, `shear_scale`,
                     `final_seq_length`; the package's defaults). Its splits are 'train', 'validation' and 'test';
                     the signals are used as generated: every `augment` field is off, CutMix is refused (it cuts
                     image boxes), `cache` is ignored (the splits are arrays in memory).
"""

import dataclasses
import math
import re
from collections.abc import Mapping

import ml_collections

from layerscale_jax.data.mnist1d import NAME as MNIST1D
from layerscale_jax.data.mnist1d import SPLITS as MNIST1D_SPLITS
from layerscale_jax.data.mnist1d import Mnist1dSettings
from layerscale_jax.errors import ConfigError
from layerscale_jax.settings import boolean, check_fields, integer, number
from layerscale_jax.paths import as_path

DIGITS = "digits"
SYNTHETIC = "synthetic"
INTERPOLATIONS = ("bicubic", "bilinear")  # data.augment.interpolation

_AUGMENT_FIELDS = (
    "random_resized_crop",
    "crop_scale",
    "interpolation",
    "crop_padding",
    "hflip",
    "three_augment",
    "color_jitter",
    "randaugment",
)


def default_data_config(name=DIGITS):
    """Returns a ConfigDict with every data field, with the defaults for dataset `name`."""
    small = name in (DIGITS, SYNTHETIC) or name.startswith("cifar") or "mnist" in name
    signals = name == MNIST1D
    cfg = ml_collections.ConfigDict()
    cfg.name = name
    cfg.data_dir = ml_collections.FieldReference(None, field_type=str)
    cfg.train_split = "train"
    cfg.eval_split = ml_collections.FieldReference(None, field_type=str)
    cfg.image_size = (8 if name == DIGITS else (32 if small else 224)) if not signals else \
        Mnist1dSettings.final_seq_length
    cfg.num_workers = 0
    cfg.prefetch = 2
    cfg.read_block = 0
    cfg.read_window = 16
    cfg.cache = small and name != SYNTHETIC
    cfg.crop_pct = 1.0 if small else 0.875
    cfg.skip_bad_records = False
    cfg.augment = ml_collections.ConfigDict(
        {
            "random_resized_crop": not small,
            "crop_scale": (0.08, 1.0),
            "interpolation": "bicubic",
            "crop_padding": 1 if name == DIGITS else (4 if small and name not in (SYNTHETIC, MNIST1D) else 0),
            "hflip": name != DIGITS and "mnist" not in name,
            "three_augment": not small,
            "color_jitter": 0.0 if small else 0.3,
            "randaugment": ml_collections.FieldReference(None, field_type=str),
        }
    )
    if name == SYNTHETIC:
        cfg.augment.hflip = False
    # DeiT III ImageNet-1k recipe: mixup 0.8, CutMix 1.0, no label smoothing (BCE loss); small data: smoothing only.
    cfg.mixup_alpha = 0.0 if small else 0.8
    cfg.cutmix_alpha = 0.0 if small else 1.0
    cfg.label_smoothing = 0.1 if small else 0.0
    cfg.num_classes = 10
    cfg.channels = 3
    cfg.num_train = 1024
    cfg.num_test = 256
    cfg.synthetic_jpeg_shape = ml_collections.FieldReference(None, field_type=tuple)
    if signals:
        cfg.mnist1d = ml_collections.ConfigDict({f.name: f.default for f in dataclasses.fields(Mnist1dSettings)})
    return cfg


@dataclasses.dataclass(frozen=True)
class RandAugmentSpec:
    """Parsed timm-style RandAugment string: `rand-m{magnitude}-n{num_ops}-mstd{std}-inc{0|1}`."""

    magnitude: float = 9.0
    num_ops: int = 2
    magnitude_std: float = 0.0
    increasing: bool = True


@dataclasses.dataclass(frozen=True)
class AugmentSettings:
    random_resized_crop: bool
    crop_scale: tuple
    interpolation: str
    crop_padding: int
    hflip: bool
    three_augment: bool
    color_jitter: float
    randaugment: RandAugmentSpec | None


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """A validated data config (see the module docstring for the meaning of every field)."""

    name: str
    data_dir: str | None
    train_split: str
    eval_split: str | None
    image_size: int
    num_workers: int
    prefetch: int
    read_block: int
    read_window: int
    cache: bool
    crop_pct: float
    skip_bad_records: bool
    augment: AugmentSettings
    mixup_alpha: float
    cutmix_alpha: float
    label_smoothing: float
    num_classes: int
    channels: int
    num_train: int
    num_test: int
    synthetic_jpeg_shape: tuple | None
    mnist1d: Mnist1dSettings | None = None


# Input at pod scale (the ImageNet configs): ArrayRecord shards on a bucket, read by every host.
SHARDED_READ_BLOCK, SHARDED_READ_WINDOW = 256, 16


def use_sharded_input(cfg, workers: int) -> None:
    """Set ``cfg`` (a data ConfigDict) for a large sharded dataset read by many hosts: ``workers`` grain worker
    processes per JAX process, each building ``prefetch`` batches ahead in its own threads, and the block read plan
    (``read_block`` consecutive records, ``read_window`` blocks shuffled together; docs/data.md)."""
    cfg.num_workers = workers
    cfg.read_block, cfg.read_window = SHARDED_READ_BLOCK, SHARDED_READ_WINDOW


def _get(obj, name, default):
    if isinstance(obj, Mapping) and not isinstance(obj, ml_collections.ConfigDict):
        return obj.get(name, default)
    return getattr(obj, name, default)


_RAND_RE = re.compile(r"^rand(-(m[0-9.]+|n[0-9]+|mstd[0-9.]+|inc[01]))*$")


def parse_randaugment(spec):
    """Parses 'rand-m9-mstd0.5-inc1' (timm syntax; m = magnitude 0..10, n = ops per image, mstd, inc)."""
    if spec is None or spec == "":
        return None
    if not isinstance(spec, str) or not _RAND_RE.match(spec):
        raise ConfigError(
            f"data.augment.randaugment must be None or like 'rand-m9-n2-mstd0.5-inc1', got {spec!r}"
        )
    kwargs = {}
    for part in spec.split("-")[1:]:
        try:
            if part.startswith("mstd"):
                kwargs["magnitude_std"] = float(part[4:])
            elif part.startswith("m"):
                kwargs["magnitude"] = float(part[1:])
            elif part.startswith("n"):
                kwargs["num_ops"] = int(part[1:])
            elif part.startswith("inc"):
                kwargs["increasing"] = part == "inc1"
        except ValueError:
            raise ConfigError(f"data.augment.randaugment={spec!r}: {part!r} is not a number") from None
    parsed = RandAugmentSpec(**kwargs)
    if not 0 <= parsed.magnitude <= 10 or parsed.num_ops < 1:
        raise ConfigError(f"data.augment.randaugment needs 0 <= m <= 10 and n >= 1, got {spec!r}")
    return parsed


def validate_data_config(cfg):
    """Checks `cfg` (ConfigDict / dict / attribute object) and returns a frozen `DataSettings`."""
    if isinstance(cfg, DataSettings):
        return cfg
    name = _get(cfg, "name", DIGITS)
    if not isinstance(name, str) or not name or name != name.strip():
        raise ConfigError(f"data.name must be 'digits', 'synthetic' or a TFDS dataset name, got {name!r}")
    defaults = default_data_config(name)
    check_fields(cfg, defaults.keys(), "data.")

    def get(field):
        return _get(cfg, field, defaults[field])

    data_dir = get("data_dir")
    if data_dir is not None and (not isinstance(data_dir, str) or not data_dir):
        raise ConfigError(f"data.data_dir must be None or a non-empty path string, got {data_dir!r}")
    if data_dir is not None:
        as_path(data_dir, "data.data_dir")       # a local path, file:// or gs://
    image_size = integer("data.image_size", get("image_size"), 1)
    train_split = get("train_split")
    if not isinstance(train_split, str) or not train_split.strip():
        raise ConfigError(f"data.train_split must be a split name such as 'train', got {train_split!r}")
    eval_split = get("eval_split")
    if eval_split is not None and (not isinstance(eval_split, str) or not eval_split.strip()):
        raise ConfigError(f"data.eval_split must be None or a split name such as 'test', got {eval_split!r}")

    aug = _get(cfg, "augment", None)
    aug_defaults = defaults.augment
    if aug is None:
        aug = aug_defaults
    check_fields(aug, _AUGMENT_FIELDS, "data.augment.")

    def aget(field):
        return _get(aug, field, aug_defaults[field])

    scale = aget("crop_scale")
    if (
        not isinstance(scale, (tuple, list))
        or len(scale) != 2
        or not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in scale)
        or not 0 < scale[0] <= scale[1] <= 1
    ):
        raise ConfigError(f"data.augment.crop_scale must be (min, max) with 0 < min <= max <= 1, got {scale!r}")
    interpolation = aget("interpolation")
    if interpolation not in INTERPOLATIONS:
        raise ConfigError(f"data.augment.interpolation must be 'bicubic' or 'bilinear', got {interpolation!r}")
    crop_padding = integer("data.augment.crop_padding", aget("crop_padding"), 0)
    if crop_padding >= image_size:
        raise ConfigError(
            f"data.augment.crop_padding must be smaller than data.image_size={image_size}, got {crop_padding}"
        )
    augment = AugmentSettings(
        random_resized_crop=boolean("data.augment.random_resized_crop", aget("random_resized_crop")),
        crop_scale=(float(scale[0]), float(scale[1])),
        interpolation=interpolation,
        crop_padding=crop_padding,
        hflip=boolean("data.augment.hflip", aget("hflip")),
        three_augment=boolean("data.augment.three_augment", aget("three_augment")),
        color_jitter=number("data.augment.color_jitter", aget("color_jitter"), 0.0, 1.0),
        randaugment=parse_randaugment(aget("randaugment")),
    )
    channels = integer("data.channels", get("channels"), 1)
    if channels not in (1, 3):
        raise ConfigError(f"data.channels must be 1 or 3, got {channels}")
    jpeg_shape = get("synthetic_jpeg_shape")
    if jpeg_shape is not None:
        if (
            not isinstance(jpeg_shape, (tuple, list))
            or len(jpeg_shape) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in jpeg_shape)
        ):
            raise ConfigError(f"data.synthetic_jpeg_shape must be None or (height, width), got {jpeg_shape!r}")
        jpeg_shape = (int(jpeg_shape[0]), int(jpeg_shape[1]))
    signals = None
    if name == MNIST1D:
        signals = _mnist1d_settings(get("mnist1d"), defaults.mnist1d)
        _check_signal_fields(augment, aug_defaults, get("cutmix_alpha"), image_size, signals,
                             (("train_split", train_split), ("eval_split", eval_split)))
    return DataSettings(
        name=name,
        data_dir=data_dir,
        train_split=train_split,
        eval_split=eval_split,
        image_size=image_size,
        num_workers=integer("data.num_workers", get("num_workers"), 0),
        prefetch=integer("data.prefetch", get("prefetch"), 0),
        read_block=integer("data.read_block", get("read_block"), 0),
        read_window=integer("data.read_window", get("read_window"), 1),
        cache=boolean("data.cache", get("cache")),
        crop_pct=number("data.crop_pct", get("crop_pct"), 0.05, 1.0),
        skip_bad_records=boolean("data.skip_bad_records", get("skip_bad_records")),
        augment=augment,
        mixup_alpha=number("data.mixup_alpha", get("mixup_alpha"), 0.0),
        cutmix_alpha=number("data.cutmix_alpha", get("cutmix_alpha"), 0.0),
        label_smoothing=number("data.label_smoothing", get("label_smoothing"), 0.0, 1.0, high_open=True),
        num_classes=integer("data.num_classes", get("num_classes"), 1),
        channels=channels,
        num_train=integer("data.num_train", get("num_train"), 1),
        num_test=integer("data.num_test", get("num_test"), 1),
        synthetic_jpeg_shape=jpeg_shape,
        mnist1d=signals,
    )


def _mnist1d_settings(cfg, defaults) -> Mnist1dSettings:
    """``data.mnist1d`` checked: sizes ≥ 1 with a multiple of 10 in all (the generator draws ``n // 10`` signals
    per class), a non-negative seed, ``padding`` (low, high) with 0 ≤ low ≤ high, positive lengths, non-negative
    scales."""
    check_fields(cfg, defaults.keys(), "data.mnist1d.")

    def get(field):
        return _get(cfg, field, defaults[field])

    sizes = {f: integer(f"data.mnist1d.{f}", get(f), 1) for f in ("num_train", "num_validation", "num_test")}
    if sum(sizes.values()) % 10:
        raise ConfigError(f"data.mnist1d: num_train + num_validation + num_test = {sum(sizes.values())} must be a "
                          "multiple of 10 (the generator draws the same number of signals of each class)")
    padding = get("padding")
    if (not isinstance(padding, (tuple, list)) or len(padding) != 2
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in padding)
            or not 0 <= padding[0] <= padding[1]):
        raise ConfigError(f"data.mnist1d.padding must be (low, high) integers with 0 <= low <= high, got {padding!r}")
    return Mnist1dSettings(
        **sizes, seed=integer("data.mnist1d.seed", get("seed"), 0), padding=(int(padding[0]), int(padding[1])),
        template_len=integer("data.mnist1d.template_len", get("template_len"), 2),
        max_translation=integer("data.mnist1d.max_translation", get("max_translation"), 1),
        final_seq_length=integer("data.mnist1d.final_seq_length", get("final_seq_length"), 2),
        **{f: number(f"data.mnist1d.{f}", get(f), 0.0) for f in ("scale_coeff", "corr_noise_scale", "iid_noise_scale",
                                                            "shear_scale")})


def _check_signal_fields(augment, aug_defaults, cutmix_alpha, image_size, signals, splits) -> None:
    """1-D signals are used as generated: no image augmentation, no CutMix; the length is the generator's."""
    for field in _AUGMENT_FIELDS:
        value = getattr(augment, field)
        expected = parse_randaugment(aug_defaults[field]) if field == "randaugment" else aug_defaults[field]
        if field != "crop_scale" and field != "interpolation" and value != expected:
            raise ConfigError(f"data.augment.{field}={value!r}: mnist1d signals take no image augmentation "
                              f"(leave it at {expected!r})")
    if cutmix_alpha:
        raise ConfigError(f"data.cutmix_alpha={cutmix_alpha!r}: CutMix cuts image boxes; mnist1d signals take "
                          "mixup_alpha only")
    if image_size != signals.final_seq_length:
        raise ConfigError(f"data.image_size={image_size} must equal data.mnist1d.final_seq_length="
                          f"{signals.final_seq_length} (the signal's length)")
    for field, split in splits:
        if split is not None and split not in MNIST1D_SPLITS:
            raise ConfigError(f"data.{field}={split!r} is not a split of mnist1d {MNIST1D_SPLITS}")
