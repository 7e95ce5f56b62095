"""`data.augment.interpolation`: the random-resized crop's resize filter.

'bicubic' (default) is PIL's antialiased bicubic, unchanged (tests/test_input_speed.py holds it bit-identical to the
path before). 'bilinear' is big_vision's inception-crop resize: bilinear with half-pixel centres, no antialiasing,
clamped at the crop's edges, truncated to uint8 (`tf.image.resize(crop, method="bilinear", antialias=False)` then
big_vision's cast). Checked against a hand computation, a float64 numpy reference written here, and, where
TensorFlow is installed, tf.image.resize itself.
"""

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
    integer in exact arithmetic may come out just below it)."""
    return (ours == np.floor(value + eps)) | (ours == np.floor(value - eps))


def bilinear_box(image, box, size):
    return np.asarray(transforms.resize_box(Image.fromarray(image), box, size, "bilinear"))


def test_bilinear_by_hand_interpolates_half_pixel_centres_clamps_and_truncates():
    row = np.array([[0, 10]], np.uint8)
    # Enlarging 2 -> 4: u = -0.25, 0.25, 0.75, 1.25 -> 0 (clamped), 2.5, 7.5, 10 (clamped); truncated.
    np.testing.assert_array_equal(bilinear_box(row, (0, 0, 2, 1), 4)[0], [0, 2, 7, 10])
    row = np.array([[0, 40, 80, 120, 160, 200, 240, 250]], np.uint8)
    # Shrinking 8 -> 2: u = 1.5, 5.5 -> the means of pixels 1, 2 and 5, 6; no antialiasing (an antialiased filter
    # would also weigh pixels 0, 3 and 4, 7).
    np.testing.assert_array_equal(bilinear_box(row, (0, 0, 8, 1), 2)[0], [60, 220])
    # A box inside the row: u relative to the box's left edge (pixels 2..5 -> 2 px: u = 0.5, 2.5).
    np.testing.assert_array_equal(bilinear_box(row, (2, 0, 6, 1), 2)[0], [100, 180])


def test_bilinear_crops_are_the_float64_reference_truncated():
    image = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    kinds = set()
    for i in range(100):
        top, left, ch, cw = transforms.random_resized_crop_box(60, 80, SCALE, np.random.default_rng(i))
        kinds.add((ch < 24, cw < 24))
        ours = bilinear_box(image, (left, top, left + cw, top + ch), 24)
        expected = half_pixel_bilinear(image[top : top + ch, left : left + cw], 24)
        assert truncates(ours, expected, 1e-6).all()
    assert {(False, False), (True, True)} <= kinds  # shrunk and enlarged crops both checked


def test_bilinear_crop_equals_tf_image_resize_without_antialias_cast_to_uint8():
    tf = pytest.importorskip("tensorflow")
    raw = sources.SyntheticSource("train", 1, 8, 3, 10, (120, 160))._make_jpeg_pool()[0]
    image = transforms.decode_image(raw, 3)
    for i in range(40):
        ours = transforms.decode_random_resized_crop(raw, 3, 48, SCALE, np.random.default_rng([4, i]), "bilinear")
        top, left, ch, cw = transforms.random_resized_crop_box(120, 160, SCALE, np.random.default_rng([4, i]))
        crop = image[top : top + ch, left : left + cw]
        resized = tf.image.resize(crop, [48, 48], method="bilinear", antialias=False).numpy().astype(np.float64)
        assert truncates(ours, np.clip(resized, 0, 255), 1e-3).all()


def test_bilinear_decodes_at_full_scale_even_where_bicubic_would_scale_the_dct():
    raw = sources.SyntheticSource("train", 1, 8, 3, 10, (256, 320))._make_jpeg_pool()[0]
    image = transforms.decode_image(raw, 3)
    scaled = 0
    for i in range(30):
        top, left, ch, cw = transforms.random_resized_crop_box(256, 320, SCALE, np.random.default_rng([5, i]))
        scaled += transforms.dct_scale(ch, cw, 32) > 1
        ours = transforms.decode_random_resized_crop(raw, 3, 32, SCALE, np.random.default_rng([5, i]), "bilinear")
        assert truncates(ours, half_pixel_bilinear(image[top : top + ch, left : left + cw], 32), 1e-6).all()
    assert scaled > 10  # most of these crops would have been DCT-scaled with bicubic


def test_train_iterator_with_bilinear_crops_each_image_bilinearly():
    cfg = data.default_data_config("synthetic")
    cfg.image_size, cfg.num_train, cfg.synthetic_jpeg_shape, cfg.prefetch = 24, 16, (40, 56), 0
    cfg.augment.random_resized_crop, cfg.augment.interpolation = True, "bilinear"
    it = data.make_train_iterator(cfg, global_batch_size=8, seed=3, process_index=0, process_count=1)
    batch, fn, normalize = next(it), it._fn, it._normalize
    it.close()
    positions = fn.g.positions(0)
    for i, ((raw, _), q) in enumerate(zip(fn.records.source.read(fn.order.keys(positions)), positions)):
        rng = np.random.default_rng([3, 2, int(q)])
        expected = transforms.random_resized_crop(transforms.decode_image(raw, 3), 24, SCALE, rng, "bilinear")
        np.testing.assert_array_equal(batch["image"][i], normalize({"image": expected})["image"])


def test_interpolation_defaults_to_bicubic_and_a_bad_value_is_one_error_naming_field_and_value():
    assert data.validate_data_config(data.default_data_config("imagenet2012")).augment.interpolation == "bicubic"
    cfg = data.default_data_config("imagenet2012")
    cfg.augment.interpolation = "lanczos"
    with pytest.raises(ValueError, match=r"^data\.augment\.interpolation must be 'bicubic' or 'bilinear', "
                                         r"got 'lanczos'$"):
        data.validate_data_config(cfg)
