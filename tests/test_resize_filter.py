"""`data.augment.interpolation`: the random-resized crop's resize filter.

'bicubic' (default) is PIL's antialiased bicubic, unchanged (tests/test_input_speed.py holds it bit-identical to the
path before). 'bilinear' is big_vision's inception crop after its window is drawn, run with TensorFlow's own ops:
`decode_and_crop_jpeg` of the window, `tf.image.resize(crop, method="bilinear", antialias=False)` (half-pixel
centres, clamped at the crop's edges), cast back to uint8 (truncated). Checked against a hand computation, a float64
numpy reference written here, and big_vision's ops run one by one on the same window; a truncated JPEG stays a bad
record even when the window lies above the cut, where `decode_and_crop_jpeg` alone accepts it.

Every test that runs TensorFlow is marked slow (pytest.ini): importing it takes about 5 s of CPU.
"""

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from layerscale_jax import data
from layerscale_jax.data import sources, transforms

SCALE = (0.08, 1.0)


def half_pixel_bilinear(crop, size):
    """Textbook half-pixel bilinear resize of `crop` [h, w, C] to size x size in float64, clamped at the edges:
    output pixel i samples u = (i + 0.5) n / size - 0.5 between pixels floor(u) and floor(u) + 1."""
    crop = crop.astype(np.float64)

    def taps(n):
        u = (np.arange(size) + 0.5) * n / size - 0.5
        lower = np.floor(u)
        return np.clip(lower, 0, n - 1).astype(int), np.clip(lower + 1, 0, n - 1).astype(int), u - lower

    y0, y1, wy = taps(crop.shape[0])
    x0, x1, wx = taps(crop.shape[1])
    rows = crop[y0] + (crop[y1] - crop[y0]) * wy[:, None, None]
    return rows[:, x0] + (rows[:, x1] - rows[:, x0]) * wx[None, :, None]


def truncates(ours, value, eps):
    """`ours` is floor(value), up to `eps` of rounding in the sample position or arithmetic (a value that is an
    integer in exact arithmetic may come out just below it in float32)."""
    return (ours == np.floor(value + eps)) | (ours == np.floor(value - eps))


def big_vision_crop(raw, window, size, channels=3):
    """big_vision's `decode_jpeg_and_inception_crop` for a given window, its ops run one by one (eagerly)."""
    import tensorflow as tf
    crop = tf.image.decode_and_crop_jpeg(raw, window, channels=channels)
    return tf.cast(tf.image.resize(crop, [size, size], method="bilinear", antialias=False), tf.uint8).numpy()


def jpeg(shape, quality=90, channels=3):
    image = np.random.default_rng(shape).integers(0, 256, (*shape, channels), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image[..., 0] if channels == 1 else image).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


@pytest.mark.slow
def test_bilinear_by_hand_interpolates_half_pixel_centres_clamps_and_truncates():
    row = np.array([[[0], [10]]], np.uint8)
    # Enlarging 2 -> 4: u = -0.25, 0.25, 0.75, 1.25 -> 0 (clamped), 2.5, 7.5, 10 (clamped); truncated.
    np.testing.assert_array_equal(transforms.bilinear_crop(row, (0, 0, 1, 2), 4)[0, :, 0], [0, 2, 7, 10])
    row = np.array([[0, 40, 80, 120, 160, 200, 240, 250]], np.uint8)[..., None]
    # Shrinking 8 -> 2: u = 1.5, 5.5 -> the means of pixels 1, 2 and 5, 6; no antialiasing (an antialiased filter
    # would also weigh pixels 0, 3 and 4, 7).
    np.testing.assert_array_equal(transforms.bilinear_crop(row, (0, 0, 1, 8), 2)[0, :, 0], [60, 220])
    # A window inside the row: u relative to the window's left edge (pixels 2..5 -> 2 px: u = 0.5, 2.5).
    np.testing.assert_array_equal(transforms.bilinear_crop(row, (0, 2, 1, 4), 2)[0, :, 0], [100, 180])


@pytest.mark.slow
def test_bilinear_crops_of_arrays_are_the_float64_reference_truncated():
    image = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    kinds = set()
    for i in range(100):
        ours = transforms.random_resized_crop(image, 24, SCALE, np.random.default_rng(i), "bilinear")
        top, left, ch, cw = transforms.random_resized_crop_box(60, 80, SCALE, np.random.default_rng(i))
        kinds.add((ch < 24, cw < 24))
        assert truncates(ours, half_pixel_bilinear(image[top : top + ch, left : left + cw], 24), 1e-3).all()
    assert {(False, False), (True, True)} <= kinds  # shrunk and enlarged crops both checked


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(120, 160), (256, 360)])
def test_bilinear_jpeg_crops_are_big_visions_ops_on_the_same_window(shape):
    raw = sources.SyntheticSource("train", 1, 8, 3, 10, shape)._make_jpeg_pool()[0]
    scaled = 0
    for i in range(30):
        ours = transforms.decode_random_resized_crop(raw, 3, 32, SCALE, np.random.default_rng([4, i]), "bilinear")
        window = transforms.random_resized_crop_box(*shape, SCALE, np.random.default_rng([4, i]))
        scaled += transforms.dct_scale(window[2], window[3], 32) > 1
        np.testing.assert_array_equal(ours, big_vision_crop(raw, window, 32))
    assert scaled > 10  # crops bicubic would decode at 1/2 scale or less: bilinear decodes every window in full


@pytest.mark.slow
def test_bilinear_greyscale_and_png_records():
    grey = jpeg((40, 56), channels=1)
    ours = transforms.decode_random_resized_crop(grey, 1, 24, SCALE, np.random.default_rng(1), "bilinear")
    window = transforms.random_resized_crop_box(40, 56, SCALE, np.random.default_rng(1))
    assert ours.shape == (24, 24, 1)
    np.testing.assert_array_equal(ours, big_vision_crop(grey, window, 24, channels=1))
    image = np.random.default_rng(2).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    ours = transforms.decode_random_resized_crop(buf.getvalue(), 3, 24, SCALE, np.random.default_rng(3), "bilinear")
    np.testing.assert_array_equal(ours, transforms.random_resized_crop(image, 24, SCALE, np.random.default_rng(3),
                                                                       "bilinear"))


@pytest.mark.slow
def test_a_truncated_jpeg_is_a_bad_record_even_when_its_window_lies_above_the_cut():
    raw = jpeg((300, 100))
    cut = raw[: len(raw) * 6 // 10]
    windows = [(i, transforms.random_resized_crop_box(300, 100, SCALE, np.random.default_rng(i))) for i in range(200)]
    above = [(i, w) for i, w in windows if w[0] + w[2] < 120]  # rows 0-119 of 300: within the first 60% of bytes
    assert len(above) >= 3
    for i, window in above[:3]:
        big_vision_crop(cut, window, 24)  # decode_and_crop_jpeg alone accepts the cut record for this window
        with pytest.raises(ValueError, match=rf"^cannot decode image \({len(cut)} bytes\): OSError: image file is "
                                             r"truncated"):
            transforms.decode_random_resized_crop(cut, 3, 24, SCALE, np.random.default_rng(i), "bilinear")


@pytest.mark.slow
def test_a_jpeg_tensorflow_cannot_decode_is_one_value_error():
    raw = jpeg((40, 56))
    sos = raw.index(b"\xff\xda")
    broken = raw[:sos] + b"\xff\xd9"  # the header PIL opens, no scan: complete as far as the end marker says
    with pytest.raises(ValueError, match=rf"^cannot decode image \({len(broken)} bytes\): "):
        transforms.decode_random_resized_crop(broken, 3, 24, SCALE, np.random.default_rng(0), "bilinear")


@pytest.mark.slow
def test_train_iterator_with_bilinear_crops_each_image_with_big_visions_ops():
    cfg = data.default_data_config("synthetic")
    cfg.image_size, cfg.num_train, cfg.synthetic_jpeg_shape, cfg.prefetch = 24, 16, (40, 56), 0
    cfg.augment.random_resized_crop, cfg.augment.interpolation = True, "bilinear"
    it = data.make_train_iterator(cfg, global_batch_size=8, seed=3, process_index=0, process_count=1)
    batch, fn, normalize = next(it), it._fn, it._normalize
    it.close()
    positions = fn.g.positions(0)
    for i, ((raw, _), q) in enumerate(zip(fn.records.source.read(fn.order.keys(positions)), positions)):
        window = transforms.random_resized_crop_box(40, 56, SCALE, np.random.default_rng([3, 2, int(q)]))
        expected = big_vision_crop(raw.item() if isinstance(raw, np.ndarray) else raw, window, 24)
        np.testing.assert_array_equal(batch["image"][i], normalize({"image": expected})["image"])
    cfg.prefetch = 2  # built by two threads: the same batch
    with data.make_train_iterator(cfg, global_batch_size=8, seed=3, process_index=0, process_count=1) as it:
        np.testing.assert_array_equal(next(it)["image"], batch["image"])


def bilinear_iterator_over(monkeypatch, images, skip_bad, batch=4):
    source = sources.InMemorySource(images, [i % 10 for i in range(len(images))], name="jpegs")
    monkeypatch.setattr(sources, "open_sources", lambda settings: (source, source, 10, 3))
    cfg = data.default_data_config("synthetic")
    cfg.image_size, cfg.prefetch, cfg.skip_bad_records = 24, 0, skip_bad
    cfg.augment.random_resized_crop, cfg.augment.interpolation, cfg.augment.hflip = True, "bilinear", False
    return data.make_train_iterator(cfg, global_batch_size=batch, seed=0, process_index=0, process_count=1)


def bad_jpegs():
    """8 JPEG records; record 2 is cut short (PIL's full decode finds it), record 5 has a header but no scan data and
    ends in the end-of-image marker (TensorFlow finds it, in the batch's graph call)."""
    images = [jpeg((40 + i, 56)) for i in range(8)]
    images[2] = images[2][: len(images[2]) // 2]
    images[5] = images[5][: images[5].index(b"\xff\xda")] + b"\xff\xd9"
    return images


@pytest.mark.slow
def test_a_bilinear_batch_with_a_record_tensorflow_cannot_decode_raises_naming_it(monkeypatch):
    images = bad_jpegs()
    images[2] = jpeg((42, 56))  # only record 5 is bad: the batch's graph call fails, then each window alone
    with pytest.raises(data.BadRecordError, match=r"^bad record 5 of 'jpegs' split 'train': cannot decode image "
                                                  r"\(\d+ bytes\): jpeg::Uncompress failed\. Invalid JPEG data "
                                                  r"or crop window\. Set data\.skip_bad_records"):
        it = bilinear_iterator_over(monkeypatch, images, False, batch=8)
        next(it)


@pytest.mark.slow
def test_bad_records_in_a_bilinear_batch_are_skipped_counted_and_the_rest_decoded_as_alone(monkeypatch):
    images = bad_jpegs()
    it = bilinear_iterator_over(monkeypatch, images, True)
    batches = [next(it) for _ in range(6)]  # 24 good records = 4 epochs of 6
    it.close()
    assert all(b["image"].shape == (4, 24, 24, 3) for b in batches) and it.bad_records >= 6
    fn = it._fn
    batch, positions = fn(1), fn.g.positions(1)  # one batch as built, before the iterator refills it
    keys = fn.order.keys(positions)
    np.testing.assert_array_equal(batch["_valid"], ~np.isin(keys, (2, 5)))
    for i in np.flatnonzero(batch["_valid"]):
        rng = np.random.default_rng([0, 2, int(positions[i])])
        alone = transforms.decode_random_resized_crop(images[keys[i]], 3, 24, SCALE, rng, "bilinear")
        np.testing.assert_array_equal(batch["image"][i], alone)


def test_interpolation_defaults_to_bicubic_and_a_bad_value_is_one_error_naming_field_and_value():
    assert data.validate_data_config(data.default_data_config("imagenet2012")).augment.interpolation == "bicubic"
    cfg = data.default_data_config("imagenet2012")
    cfg.augment.interpolation = "lanczos"
    with pytest.raises(ValueError, match=r"^data\.augment\.interpolation must be 'bicubic' or 'bilinear', "
                                         r"got 'lanczos'$"):
        data.validate_data_config(cfg)


@pytest.mark.slow
def test_a_bilinear_crop_keeps_a_fresh_tensorflow_off_gpus_and_each_op_on_one_thread():
    script = (
        "import numpy as np, tensorflow as tf\n"
        "from layerscale_jax.data import transforms\n"
        "transforms.bilinear_crop(np.zeros((8, 8, 3), np.uint8), (0, 0, 8, 8), 4)\n"
        "print(tf.config.threading.get_intra_op_parallelism_threads(),"
        " tf.config.threading.get_inter_op_parallelism_threads(), tf.config.get_visible_devices('GPU'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "1 0 []"  # one thread per op; inter-op pool at its default (0: per core)
