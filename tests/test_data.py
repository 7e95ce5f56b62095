"""Specification of the input pipeline (layerscale_jax.data). Tiny shapes; `digits` is prepared once per module."""

import io
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from layerscale_jax import data
from layerscale_jax.data import config as data_config_lib
from layerscale_jax.data import digits as digits_lib
from layerscale_jax.data import dataset_info, randaugment, sources, transforms


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tfds"))
    sources.prepare_digits(path)
    return path


def digits_config(data_dir, **overrides):
    cfg = data.default_data_config("digits")
    cfg.data_dir = data_dir
    cfg.update(overrides)
    return cfg


def synthetic_config(**overrides):
    cfg = data.default_data_config("synthetic")
    cfg.image_size = 4
    cfg.channels = 1
    cfg.num_train, cfg.num_test = 60, 50
    cfg.update(overrides)
    return cfg


def take(it, n):
    batches = [next(it) for _ in range(n)]
    it.close()
    return batches


def train_batches(cfg, n, global_batch_size, seed=0, process_index=0, process_count=1):
    it = data.make_train_iterator(
        cfg, global_batch_size=global_batch_size, seed=seed, process_index=process_index, process_count=process_count
    )
    return take(it, n)


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def image_keys(images):
    return [img.tobytes() for img in images]


def png(image):
    buf = io.BytesIO()
    Image.fromarray(image[..., 0]).save(buf, format="PNG")
    return buf.getvalue()


# ------------------------------------------------------------------------------------------------ imports & config


@pytest.mark.slow
def test_importing_the_package_and_reading_digits_never_imports_tensorflow(data_dir):
    code = (
        "import sys, layerscale_jax, layerscale_jax.data as d\n"
        "assert 'tensorflow' not in sys.modules, 'import'\n"
        "cfg = d.default_data_config('digits'); cfg.data_dir = sys.argv[1]\n"
        "it = d.make_train_iterator(cfg, global_batch_size=8, seed=0, process_index=0, process_count=1)\n"
        "next(it); it.close()\n"
        "assert 'tensorflow' not in sys.modules, 'read'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, data_dir], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_default_config_has_every_field_and_validates():
    for name in ("digits", "synthetic", "cifar10", "imagenet2012"):
        settings = data.validate_data_config(data.default_data_config(name))
        assert settings.name == name
    assert data.default_data_config("digits").image_size == 8
    assert data.default_data_config("imagenet2012").crop_pct == 0.875


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("image_size", 0, ["data.image_size", "0"]),
        ("num_workers", -1, ["data.num_workers", "-1"]),
        ("label_smoothing", 1.0, ["data.label_smoothing", "1.0"]),
        ("crop_pct", 1.5, ["data.crop_pct", "1.5"]),
        ("augment.crop_scale", (0.5, 0.1), ["data.augment.crop_scale", "(0.5, 0.1)"]),
        ("augment.randaugment", "rand-x9", ["data.augment.randaugment", "rand-x9"]),
        ("augment.crop_padding", 8, ["data.augment.crop_padding", "8"]),
        ("channels", 2, ["data.channels", "2"]),
    ],
)
def test_invalid_field_raises_naming_field_and_value(field, value, words):
    cfg = data.default_data_config("digits").to_dict()
    if "." in field:
        outer, inner = field.split(".")
        cfg[outer][inner] = value
    else:
        cfg[field] = value
    with pytest.raises(ValueError) as err:
        data.validate_data_config(cfg)
    for word in words:
        assert word in str(err.value)


def test_unknown_field_is_rejected():
    cfg = data.default_data_config("digits").to_dict()
    cfg["augmnet"] = {}
    with pytest.raises(ValueError, match="data.augmnet"):
        data.validate_data_config(cfg)


def test_randaugment_string_is_parsed_like_timm():
    spec = data_config_lib.parse_randaugment("rand-m9-mstd0.5-inc1")
    assert spec == data_config_lib.RandAugmentSpec(magnitude=9.0, num_ops=2, magnitude_std=0.5, increasing=True)


# ------------------------------------------------------------------------------------------------ digits


@pytest.mark.slow
def test_digits_split_is_stratified_disjoint_and_complete(data_dir):
    builder = sources.open_builder("digits", data_dir)
    rows = {
        split: sorted(int(r["sklearn_index"]) for r in builder.as_data_source(split))
        for split in ("train", "test")
    }
    assert (len(rows["train"]), len(rows["test"])) == (1442, 355)
    assert not set(rows["train"]) & set(rows["test"])
    assert sorted(rows["train"] + rows["test"]) == list(range(1797))
    assert (rows["train"], rows["test"]) == tuple(digits_lib.split_indices())
    from sklearn.datasets import load_digits

    labels = load_digits().target
    test_share = np.bincount(labels[rows["test"]], minlength=10) / np.bincount(labels, minlength=10)
    assert np.all((test_share > 0.18) & (test_share <= 0.2))


@pytest.mark.slow
def test_digits_validation_split_is_a_stratified_fifth_of_train_and_the_rest_trains(data_dir):
    builder = sources.open_builder("digits", data_dir)
    rows = {split: sorted(int(r["sklearn_index"]) for r in builder.as_data_source(split))
            for split in ("train", "validation", "train_without_validation")}
    assert (len(rows["validation"]), len(rows["train_without_validation"])) == (285, 1157)
    assert not set(rows["validation"]) & set(rows["train_without_validation"])
    assert sorted(rows["validation"] + rows["train_without_validation"]) == rows["train"]
    assert (rows["train_without_validation"], rows["validation"]) == tuple(digits_lib.validation_indices())
    from sklearn.datasets import load_digits

    labels = load_digits().target
    per_class_train = np.bincount(labels[rows["train"]], minlength=10)
    assert np.array_equal(np.bincount(labels[rows["validation"]], minlength=10), per_class_train // 5)


@pytest.mark.slow
def test_digits_version_1_1_keeps_train_and_test_record_for_record_in_order(tmp_path):
    """Committed results were read from version 1.0.0: the added splits must not move a record of train or test."""
    script = f"""
import tensorflow_datasets as tfds
from layerscale_jax.data import digits as d

class DigitsV100(d.Digits):       # version 1.0.0's builder: the same generator, train and test only
    VERSION = tfds.core.Version("1.0.0")
    def _split_generators(self, dl_manager):
        train, test = d.split_indices()
        return {{"train": self._generate_examples(train), "test": self._generate_examples(test)}}

DigitsV100.__module__ = d.__name__  # TFDS finds a builder's files through its module
old, new = DigitsV100(data_dir="{tmp_path / 'old'}"), d.Digits(data_dir="{tmp_path / 'new'}")
for b in (old, new):
    b.download_and_prepare(file_format="array_record")
for split in ("train", "test"):
    a, b = old.as_data_source(split), new.as_data_source(split)
    order = lambda ds: [int(ds[i]["sklearn_index"]) for i in range(len(ds))]
    assert len(a) == len(b) > 300 and order(a) == order(b), split
print("same order")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "same order" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.slow
def test_eval_split_validation_is_read_and_a_split_not_in_the_dataset_is_an_error(data_dir):
    cfg = dict(name="digits", data_dir=data_dir, train_split="train_without_validation", eval_split="validation")
    info = data.get_dataset_info(cfg)
    assert (info.train_split, info.eval_split, info.num_train, info.num_test) == (
        "train_without_validation", "validation", 1157, 285)
    assert data.get_dataset_info(dict(name="digits", data_dir=data_dir)).eval_split == "test"
    with pytest.raises(ValueError, match=r"data.eval_split='valid' is not a split of TFDS dataset 'digits'"):
        data.get_dataset_info(dict(cfg, eval_split="valid"))
    with pytest.raises(ValueError, match=r"data.train_split='train\[:300%\]'"):
        data.get_dataset_info(dict(cfg, train_split="train[:300%]"))
    with pytest.raises(ValueError, match=r"data.eval_split='validation': the 'synthetic' dataset"):
        data.get_dataset_info(dict(name="synthetic", eval_split="validation"))


def test_digits_records_are_the_sklearn_images_scaled_to_255(data_dir):
    from sklearn.datasets import load_digits

    digits = load_digits()
    record = sources.open_builder("digits", data_dir).as_data_source("test")[0]
    row = int(record["sklearn_index"])
    expected = np.round(digits.images[row] * 255 / 16).astype(np.uint8)
    np.testing.assert_array_equal(record["image"][..., 0], expected)
    assert record["label"] == digits.target[row]


def test_digits_dataset_info(data_dir):
    info = data.get_dataset_info(digits_config(data_dir))
    assert (info.num_classes, info.image_size, info.channels, info.num_train, info.num_test) == (10, 8, 1, 1442, 355)
    assert len(info.mean) == len(info.std) == 1


def test_train_batches_have_the_per_process_size_and_normalised_float_images(data_dir):
    (batch,) = train_batches(digits_config(data_dir), 1, global_batch_size=12, process_index=1, process_count=3)
    assert set(batch) == {"image", "label"}
    assert batch["image"].shape == (4, 8, 8, 1) and batch["image"].dtype == np.float32
    assert batch["label"].shape == (4,) and batch["label"].dtype == np.int32
    info = data.get_dataset_info(digits_config(data_dir))
    mean, std = info.mean[0], info.std[0]
    assert batch["image"].min() >= -mean / std - 1e-5 and batch["image"].max() <= (1 - mean) / std + 1e-5


def test_global_batch_not_divisible_by_process_count_raises_naming_both(data_dir):
    with pytest.raises(ValueError, match="global_batch_size=10 .* process_count=3"):
        data.make_train_iterator(
            digits_config(data_dir), global_batch_size=10, seed=0, process_index=0, process_count=3
        )


# ------------------------------------------------------------------------------------------------ order


def test_same_seed_gives_the_same_batches_and_another_seed_others(data_dir):
    cfg = digits_config(data_dir)
    a = train_batches(cfg, 3, 32, seed=5)
    assert_same_batches(a, train_batches(cfg, 3, 32, seed=5))
    b = train_batches(cfg, 3, 32, seed=6)
    assert not np.array_equal(a[0]["image"], b[0]["image"])


@pytest.mark.slow
def test_processes_read_disjoint_slices_that_make_up_the_single_process_batch(data_dir):
    cfg = digits_config(data_dir)  # with its random translation: augmentation too is process-count independent
    single = train_batches(cfg, 4, 12)
    per_process = [train_batches(cfg, 4, 12, process_index=p, process_count=3) for p in range(3)]
    for j in range(4):
        for key in ("image", "label"):
            joined = np.concatenate([per_process[p][j][key] for p in range(3)])
            np.testing.assert_array_equal(joined, single[j][key])


def test_each_epoch_covers_every_record_once_across_processes_and_reshuffles():
    cfg = synthetic_config(augment={"hflip": False})  # 60 distinct random records, no augmentation
    epochs = []
    for e in range(2):
        seen = []
        for p in range(3):
            it = data.make_train_iterator(cfg, global_batch_size=12, seed=0, process_index=p, process_count=3)
            batches = take(it, 10)[5 * e : 5 * e + 5]  # 5 global batches of 12 = one epoch of 60
            seen += image_keys(np.concatenate([b["image"] for b in batches]))
        epochs.append(seen)
    for seen in epochs:
        assert len(seen) == len(set(seen)) == 60
    assert set(epochs[0]) == set(epochs[1]) and epochs[0] != epochs[1]


# ------------------------------------------------------------------------------------------------ resume


def test_resume_from_a_saved_state_yields_exactly_the_uninterrupted_batches(data_dir):
    cfg = digits_config(data_dir)
    it = data.make_train_iterator(cfg, global_batch_size=64, seed=3, process_index=0, process_count=1)
    for _ in range(30):  # past the end of the first epoch (1442 / 64 = 22.5 batches)
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    expected = take(it, 4)
    resumed = data.make_train_iterator(cfg, global_batch_size=64, seed=3, process_index=0, process_count=1)
    resumed.set_state(state)
    assert_same_batches(take(resumed, 4), expected)


def test_state_of_another_run_is_refused(data_dir):
    cfg = digits_config(data_dir)
    it = data.make_train_iterator(cfg, global_batch_size=8, seed=0, process_index=0, process_count=1)
    state = it.get_state()
    other = data.make_train_iterator(cfg, global_batch_size=8, seed=1, process_index=0, process_count=1)
    with pytest.raises(ValueError, match="seed=0"):
        other.set_state(state)
    it.close()
    other.close()


@pytest.mark.slow
def test_worker_processes_produce_the_same_batches_as_in_process(data_dir):
    in_process = train_batches(digits_config(data_dir), 3, 16)
    assert_same_batches(train_batches(digits_config(data_dir, num_workers=1), 3, 16), in_process)


@pytest.mark.slow
def test_a_state_saved_with_worker_processes_resumes_exactly_without_them(data_dir):
    """The ImageNet configs run worker processes: their iterator state is the same small dict (batches built ahead
    are dropped and built again), so a run may resume with another number of workers."""
    it = data.make_train_iterator(digits_config(data_dir, num_workers=1), global_batch_size=16, seed=2,
                                  process_index=0, process_count=1)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    expected = take(it, 2)
    resumed = data.make_train_iterator(digits_config(data_dir), global_batch_size=16, seed=2, process_index=0,
                                       process_count=1)
    resumed.set_state(state)
    assert_same_batches(take(resumed, 2), expected)


# ------------------------------------------------------------------------------------------------ read plan


class _RecordingSource(sources.InMemorySource):
    """Records which keys each read asks for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = []

    def read(self, keys):
        self.reads.append([int(k) for k in keys])
        return super().read(keys)


@pytest.fixture
def numbered_source(monkeypatch):
    """240 one-pixel records whose pixel is the record's key (mod 256), read as 'digits' without a cache."""
    images = [np.full((1, 1, 1), k, np.uint8) for k in range(240)]
    source = _RecordingSource(images, [k % 10 for k in range(240)], name="numbered")
    monkeypatch.setattr(sources, "open_sources", lambda settings: (source, source, 10, 1))
    cfg = data.default_data_config("digits")
    cfg.update(cache=False, image_size=1, prefetch=0, mixup_alpha=0.0, cutmix_alpha=0.0)
    cfg.augment.update(crop_padding=0, random_resized_crop=False)
    return source, cfg


def keys_of(batches, mean, std):
    return [int(round((x * std + mean) * 255)) for b in batches for x in b["image"].ravel()]


def test_the_block_read_plan_reads_few_blocks_in_key_order_and_visits_every_record_once_per_epoch(numbered_source):
    """data.read_block = 10, read_window = 2 (240 records: 24 blocks): every epoch is a permutation of the 240
    records, different per epoch; each process's part of a batch (12 of 48 rows) comes from at most 2 windows of
    2 blocks, and is read from the source in increasing key order."""
    source, cfg = numbered_source
    cfg.update(read_block=10, read_window=2)
    (mean,), (std,) = dataset_info.normalization("digits", 1)
    batches = train_batches(cfg, 10, 48, process_index=1, process_count=4)      # 2 epochs of 5 global batches
    assert all(read == sorted(read) for read in source.reads)
    for batch in batches:
        blocks = {k // 10 for k in keys_of([batch], mean, std)}
        assert len(blocks) <= 4
    epochs = []
    for e in range(2):
        seen = []
        for p in range(4):
            seen += keys_of(train_batches(cfg, 10, 48, process_index=p, process_count=4)[5 * e: 5 * e + 5], mean, std)
        epochs.append(seen)
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(240)) and epochs[0] != epochs[1]
    cfg.read_block = 0                                                      # without the plan: spread out
    assert len({k // 10 for k in keys_of(train_batches(cfg, 1, 48, process_index=1, process_count=4), mean, std)}) > 4


def test_resume_with_the_block_read_plan_is_exact_on_any_process_count(numbered_source):
    """The plan is a function of (seed, epoch): a state saved by one process resumes on 4 (and each reads its rows
    of the uninterrupted batches)."""
    _, cfg = numbered_source
    cfg.update(read_block=10, read_window=3)
    it = data.make_train_iterator(cfg, global_batch_size=48, seed=5, process_index=0, process_count=1)
    for _ in range(7):                                           # into the second epoch (5 batches per epoch)
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    expected = take(it, 4)
    for p in range(4):
        resumed = data.make_train_iterator(cfg, global_batch_size=48, seed=5, process_index=p, process_count=4)
        resumed.set_state(state)
        assert_same_batches(take(resumed, 4), [{k: v[12 * p: 12 * (p + 1)] for k, v in b.items()} for b in expected])


# ------------------------------------------------------------------------------------------------ eval


@pytest.mark.parametrize("process_count", [1, 3])
def test_eval_counts_every_digits_test_example_exactly_once(data_dir, process_count):
    cfg = digits_config(data_dir)
    labels, lengths = [], set()
    for p in range(process_count):
        it = data.make_eval_iterator(cfg, global_batch_size=96, process_index=p, process_count=process_count)
        batches = list(it)
        lengths.add(len(batches))
        for b in batches:
            assert b["image"].shape == (96 // process_count, 8, 8, 1) and b["mask"].dtype == bool
            labels.append(b["label"][b["mask"]])
    assert lengths == {4}  # ceil(355 / 96): every process runs the same number of batches
    labels = np.concatenate(labels)
    from sklearn.datasets import load_digits

    expected = load_digits().target[digits_lib.split_indices()[1]]
    assert len(labels) == 355
    np.testing.assert_array_equal(np.bincount(labels, minlength=10), np.bincount(expected, minlength=10))


def test_eval_padding_is_masked_and_each_example_appears_once_across_three_processes():
    cfg = synthetic_config()
    info = data.get_dataset_info(cfg)
    seen, padded = [], 0
    for p in range(3):
        for b in data.make_eval_iterator(cfg, global_batch_size=12, process_index=p, process_count=3):
            seen += image_keys(b["image"][b["mask"]])
            padded += int((~b["mask"]).sum())
            np.testing.assert_allclose(b["image"][~b["mask"]], -info.mean[0] / info.std[0], rtol=1e-6)
    assert len(seen) == len(set(seen)) == 50
    assert padded == 5 * 12 - 50


# ------------------------------------------------------------------------------------------------ augmentation


def test_train_augmentation_keeps_shape_dtype_and_range():
    cfg = synthetic_config(
        image_size=16,
        channels=3,
        synthetic_jpeg_shape=(20, 28),
        augment={
            "random_resized_crop": True,
            "crop_padding": 2,
            "hflip": True,
            "three_augment": True,
            "color_jitter": 0.4,
            "randaugment": "rand-m9-mstd0.5-inc1",
        },
    )
    info = data.get_dataset_info(cfg)
    (batch,) = train_batches(cfg, 1, 24)
    assert batch["image"].shape == (24, 16, 16, 3) and batch["image"].dtype == np.float32
    lo = -np.array(info.mean) / np.array(info.std)
    hi = (1 - np.array(info.mean)) / np.array(info.std)
    assert np.all(batch["image"] >= lo - 1e-5) and np.all(batch["image"] <= hi + 1e-5)


@pytest.mark.parametrize("channels", [1, 3])
def test_every_image_op_keeps_shape_dtype_and_range(channels):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (12, 10, channels), dtype=np.uint8)
    outputs = [
        transforms.random_resized_crop(image, 8, (0.08, 1.0), rng),
        transforms.resize_center_crop(image, 8, 0.875),
    ]
    batch = np.stack([outputs[0], outputs[1]])
    outputs += list(transforms.translate(batch, np.array([0, 4]), np.array([4, 1]), 2))
    outputs += list(transforms.hflip(batch, np.array([True, False])))
    pil = transforms.to_pil(outputs[0])
    outputs += [transforms.from_pil(transforms.three_augment(pil, c, 1.5)) for c in range(3)]
    outputs.append(transforms.from_pil(transforms.color_jitter(pil, [0.6, 1.4, 0.7], [2, 0, 1])))
    fill = (128,) * 3 if channels == 3 else 128
    for name in randaugment.OPS:
        for increasing in (True, False):
            out = randaugment.apply_op(name, pil, 0.9, increasing, rng, fill)
            outputs.append(transforms.from_pil(out))
    for out in outputs:
        assert out.shape == (8, 8, channels) and out.dtype == np.uint8  # uint8: the range [0, 255] by type


def test_three_augment_ops_and_flips_do_what_they_say():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    pil = transforms.to_pil(image)
    gray = transforms.from_pil(transforms.three_augment(pil, 0, 1.0))
    assert np.all(gray[..., 0] == gray[..., 1]) and np.all(gray[..., 1] == gray[..., 2])
    solar = transforms.from_pil(transforms.three_augment(pil, 1, 1.0))
    np.testing.assert_array_equal(solar, np.where(image >= 128, 255 - image, image))
    flipped = transforms.hflip(image[None], np.array([True]))[0]
    np.testing.assert_array_equal(flipped, image[:, ::-1])
    same = transforms.translate(image[None], np.array([2]), np.array([2]), 2)[0]
    np.testing.assert_array_equal(same, image)
    shifted = transforms.translate(image[None], np.array([2]), np.array([3]), 2)[0]
    np.testing.assert_array_equal(shifted[:, :-1], image[:, 1:])


def test_eval_resize_and_centre_crop_follow_crop_pct():
    image = np.arange(64 * 48 * 3, dtype=np.int64).reshape(64, 48, 3).astype(np.uint8)
    assert transforms.resize_center_crop(image, 32, 0.875).shape == (32, 32, 3)
    square = np.random.default_rng(0).integers(0, 256, (8, 8, 1), dtype=np.uint8)
    assert transforms.resize_center_crop(square, 8, 1.0) is square


# ------------------------------------------------------------------------------------------------ mixup / cutmix


def test_no_mixing_returns_the_images_and_hand_computed_smoothed_one_hot():
    images = jnp.arange(2 * 2 * 2 * 1, dtype=jnp.float32).reshape(2, 2, 2, 1)
    out, targets = data.mixup_cutmix(
        jax.random.key(0), images, jnp.array([0, 3]), num_classes=4, mixup_alpha=0.0, cutmix_alpha=0.0,
        label_smoothing=0.1,
    )
    np.testing.assert_array_equal(out, images)
    np.testing.assert_allclose(
        targets, [[0.925, 0.025, 0.025, 0.025], [0.025, 0.025, 0.025, 0.925]], rtol=0, atol=1e-7
    )
    assert targets.dtype == jnp.float32


@pytest.mark.slow
def test_mixup_and_cutmix_targets_sum_to_one_and_match_the_mixed_pixels():
    b, k = 4, 4
    images = jnp.broadcast_to(jnp.arange(b, dtype=jnp.float32)[:, None, None, None], (b, 16, 16, 3))
    fn = jax.jit(  # one compile covers both branches: CutMix with p = switch_prob, else mixup
        lambda rng: data.mixup_cutmix(
            rng, images, jnp.arange(b), num_classes=k, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.0
        )
    )
    kinds = set()
    for seed in range(8):
        out, targets = fn(jax.random.key(seed))
        np.testing.assert_allclose(targets.sum(-1), 1.0, atol=1e-6)
        lam = targets[0, 0]  # image 0 (label 0) is mixed with image b - 1 (label b - 1); no smoothing
        # Mixup blends every pixel, CutMix pastes a box: either way the mean of image 0 is (1 - lam) (b - 1).
        np.testing.assert_allclose(out[0].mean(), (1 - lam) * (b - 1), rtol=1e-5, atol=1e-5)  # float32 mean of a blend
        kinds.add("cutmix" if set(np.unique(out[0]).tolist()) <= {0.0, b - 1.0} else "mixup")
    assert kinds == {"cutmix", "mixup"}


# ------------------------------------------------------------------------------------------------ errors


def test_unprepared_dataset_error_names_dataset_dir_and_command(tmp_path):
    cfg = data.default_data_config("cifar10")
    cfg.data_dir = str(tmp_path)
    with pytest.raises(data.DatasetNotPreparedError) as err:
        data.get_dataset_info(cfg)
    message = str(err.value)
    assert "'cifar10'" in message and str(tmp_path) in message
    assert f"python -m layerscale_jax.data.prepare --name=cifar10 --data_dir={tmp_path}" in message


def test_unprepared_imagenet_error_says_where_the_manual_files_go(tmp_path):
    cfg = data.default_data_config("imagenet2012")
    cfg.data_dir = str(tmp_path)
    with pytest.raises(data.DatasetNotPreparedError) as err:
        data.make_train_iterator(cfg, global_batch_size=8, seed=0, process_index=0, process_count=1)
    message = str(err.value)
    assert str(tmp_path / "downloads" / "manual") in message and "ILSVRC2012_img_train.tar" in message


@pytest.fixture
def toy_source_with_bad_records(monkeypatch):
    """20 PNG records of 8x8x1; record 3 is not an image, record 7 has label 12 (10 classes)."""
    rng = np.random.default_rng(0)
    images = [png(rng.integers(0, 256, (8, 8, 1), dtype=np.uint8)) for _ in range(20)]
    labels = [i % 10 for i in range(20)]
    images[3], labels[7] = b"not an image", 12
    source = sources.InMemorySource(images, labels, name="toy")
    monkeypatch.setattr(sources, "open_sources", lambda settings: (source, source, 10, 1))
    return source


@pytest.mark.parametrize("cache", [False, True])
def test_bad_record_raises_naming_the_record(toy_source_with_bad_records, cache):
    cfg = data.default_data_config("digits")
    cfg.cache = cache
    with pytest.raises(data.BadRecordError, match=r"record (3|7) of 'toy'"):
        it = data.make_train_iterator(cfg, global_batch_size=20, seed=0, process_index=0, process_count=1)
        next(it)
    with pytest.raises(data.BadRecordError, match=r"record (3|7) of 'toy'"):
        list(data.make_eval_iterator(cfg, global_batch_size=4, process_index=0, process_count=1))


def test_skipped_bad_records_are_counted_and_batches_stay_full(toy_source_with_bad_records):
    cfg = data.default_data_config("digits")
    cfg.cache, cfg.skip_bad_records = False, True
    it = data.make_train_iterator(cfg, global_batch_size=6, seed=0, process_index=0, process_count=1)
    batches = [next(it) for _ in range(10)]  # 60 good records = 60 / 18 > 3 epochs of 20 records
    assert all(len(b["label"]) == 6 for b in batches)
    assert all(b["label"].max() < 10 for b in batches)
    assert it.bad_records >= 6  # 2 bad records per epoch
    it.close()
    cfg.cache = True
    it = data.make_train_iterator(cfg, global_batch_size=6, seed=0, process_index=0, process_count=1)
    assert it.bad_records == 2 and it.get_state()["num_records"] == 18
    it.close()
    ev = data.make_eval_iterator(cfg, global_batch_size=8, process_index=0, process_count=1)
    masked = sum(int(b["mask"].sum()) for b in ev)
    assert (masked, ev.bad_records) == (18, 2)


def states_and_batches(cfg, n, **iterator_args):
    """``(states, batches, step)``: the first ``n`` train batches with the state before each, and the index of the
    first state in the middle of a refilled batch (``offset > 0``)."""
    it = data.make_train_iterator(cfg, **iterator_args)
    states, batches = [], []
    for _ in range(n):
        states.append(it.get_state())
        batches.append(next(it))
    it.close()
    return states, batches, next(i for i, s in enumerate(states) if s["offset"] > 0)


def test_resume_inside_a_refilled_batch_is_exact(toy_source_with_bad_records):
    cfg = data.default_data_config("digits")
    cfg.cache, cfg.skip_bad_records = False, True
    states, batches, step = states_and_batches(cfg, 16, global_batch_size=4, seed=1, process_index=0,
                                               process_count=1)
    resumed = data.make_train_iterator(cfg, global_batch_size=4, seed=1, process_index=0, process_count=1)
    resumed.set_state(json.loads(json.dumps(states[step])))
    assert_same_batches(take(resumed, 16 - step), batches[step:])


# ------------------------------------------------------------------------------------------------ multi-device


def test_to_global_batch_shards_the_leading_dim_over_the_batch_axes():
    n = len(jax.devices())
    mesh = jax.make_mesh((n,), ("data",))
    batch = {"image": np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3), "label": np.arange(2 * n)}
    out = data.to_global_batch(batch, mesh)
    assert out["image"].shape == (2 * n, 3)
    assert out["label"].sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, jax.P("data")), 1)
    np.testing.assert_array_equal(np.asarray(out["image"]), batch["image"])
    with pytest.raises(ValueError, match="batch_axes"):
        data.to_global_batch(batch, mesh, batch_axes=("model",))


def test_measure_pipeline_reports_throughput_and_workers():
    result = data.measure_pipeline(synthetic_config(), global_batch_size=8, num_batches=3)
    assert result["images_per_s"] > 0 and result["num_workers"] == 0
