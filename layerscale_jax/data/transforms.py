"""Image preprocessing on numpy / PIL (TensorFlow only for the bilinear random-resized crop, below).

Two stages, so that everything that can be vectorised over a batch is:

* per image (PIL, images differ in size): `decode_image`; train `decode_random_resized_crop` (decodes only what the
  crop needs, below) or `resize_center_crop`; eval `resize_center_crop` with `crop_pct` (timm: resize the shorter
  side to floor(size / crop_pct), bicubic, then centre-crop `size`; crop_pct = 0.875 at 224 px).
* per batch (uint8 [b, S, S, C], per-image random parameters): `translate` (reflect-pad and random crop, DeiT
  III's "simple random crop") and `hflip` vectorised in numpy; RandAugment, DeiT III's 3-Augment and colour jitter
  per image with PIL (as torchvision on PIL images, which DeiT III uses; also faster than float numpy), the flip
  then done there too; `normalize` vectorised, uint8 until then.

DeiT III train order (Touvron et al., "DeiT III: Revenge of the ViT", 2022): crop -> flip -> 3-Augment (one of
grayscale, solarize(threshold 128), gaussian blur(sigma ~ U[0.1, 2])) -> ColorJitter(s, s, s) -> normalise. RandAugment,
when configured, runs after the flip and before 3-Augment (DeiT I used RandAugment in that slot instead).

Decoding only what the crop needs. The crop box is drawn from the image size in the header, before any pixel is
decoded (the same generator calls as on a decoded image, so the same box). Bicubic: when the box's shorter side is
at least s * size for s in (8, 4, 2), a JPEG is decoded at 1/s scale in the DCT domain (libjpeg's scaled IDCT, PIL's
`draft`), and the box, divided by s, is resized from there: same geometry, pixels within the bound that
tests/test_input_speed.py states against a full decode; every other crop decodes at full size, bit-identical to
decoding first and cropping after.

Resize filter of the random-resized crop (`data.augment.interpolation`): 'bicubic' (default), PIL's bicubic with
antialiasing, the DeiT III / timm recipe; 'bilinear', big_vision's `decode_jpeg_and_inception_crop` after its window
is drawn, run with TensorFlow's own ops so the pixels are big_vision's: `tf.io.decode_and_crop_jpeg(raw, window)`
(libjpeg decodes only the window's columns and stops after its last row) and `tf.image.resize(crop,
method="bilinear", antialias=False)` (half-pixel centres, clamped at the edges) cast back to uint8 (truncated, as
big_vision's `resize` op casts). Records that are not plain RGB / greyscale JPEGs, and JPEGs that do not end in
their end-of-image marker, are decoded in full by PIL first (`_load`: a truncated record stays a bad record, as
with bicubic, although the window may lie above the truncation, where `decode_and_crop_jpeg` would not notice),
then resized by the same TensorFlow op. The train pipeline defers a batch's JPEG windows (`defer=True`,
`JpegWindow`) and decodes them in one TensorFlow graph call (`bilinear_jpeg_crops`). TensorFlow (a dependency, for
preparing datasets) is imported the first time a bilinear crop is made.
"""
import functools
import io
import math
import re
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageFilter, ImageOps

from layerscale_jax.errors import ConfigError

RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)  # torchvision / timm RandomResizedCrop aspect-ratio range.
RRC_ATTEMPTS = 10


def _array(raw, channels):
    """A uint8 array record as [H, W, channels], or None when `raw` is encoded bytes."""
    if not isinstance(raw, np.ndarray) or raw.dtype == object:
        return None
    arr = raw[..., None] if raw.ndim == 2 else raw
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[-1] != channels or 0 in arr.shape:
        raise ConfigError(f"expected a uint8 [H, W, {channels}] image, got {arr.dtype} {arr.shape}")
    return arr


def _open(raw):
    """(PIL image with only its header read, the bytes) of encoded bytes; ValueError if it is not an image."""
    if isinstance(raw, np.ndarray):
        raw = raw.item()
    if not isinstance(raw, (bytes, bytearray)):
        raise ConfigError(f"expected encoded image bytes or a uint8 array, got {type(raw).__name__}")
    try:
        return Image.open(io.BytesIO(raw)), raw
    except Exception as e:  # PIL raises UnidentifiedImageError, SyntaxError, ...
        raise ConfigError(f"cannot decode image ({len(raw)} bytes): {type(e).__name__}: {e}") from None


def _load(img, raw, channels):
    """Decodes an opened image in the mode of `channels` ('RGB' or 'L'); ValueError if it cannot."""
    mode = "RGB" if channels == 3 else "L"
    try:
        img.load()
        return img if img.mode == mode else img.convert(mode)
    except Exception as e:  # OSError (truncated), ...
        raise ConfigError(f"cannot decode image ({len(raw)} bytes): {type(e).__name__}: {e}") from None


def decode_image(raw, channels):
    """Encoded bytes (PNG/JPEG/...) or a uint8 array -> uint8 [H, W, channels]. Raises ValueError if it cannot."""
    arr = _array(raw, channels)
    if arr is not None:
        return arr
    img, raw = _open(raw)
    return from_pil(_load(img, raw, channels))


def dct_scale(crop_height, crop_width, size):
    """The JPEG DCT-domain downscaling factor for a crop resized to `size`: the largest s in (8, 4, 2) with the
    crop still at least `size` pixels on each side at 1/s scale, else 1."""
    return next((s for s in (8, 4, 2) if min(crop_height, crop_width) >= s * size), 1)


def decode_random_resized_crop(raw, channels, size, scale, rng, interpolation="bicubic", defer=False):
    """Decode + `random_resized_crop` in one: the box from the header's size, then (bicubic) a JPEG decoded at 1/s
    scale (`dct_scale`) when the box allows it, or (bilinear) only the box decoded (module docstring). uint8
    [size, size, channels]; ValueError if the record cannot be decoded. Arrays: cropped and resized alike.
    `defer`: a bilinear JPEG window comes back as a `JpegWindow`, to be decoded with the rest of its batch
    (`bilinear_jpeg_crops`)."""
    arr = _array(raw, channels)
    if arr is not None:
        return random_resized_crop(arr, size, scale, rng, interpolation)
    img, raw = _open(raw)
    w, h = img.size
    top, left, ch, cw = random_resized_crop_box(h, w, scale, rng)
    if interpolation == "bilinear":
        if img.format == "JPEG" and img.mode in ("RGB", "L") and raw.endswith(_JPEG_END):
            window = JpegWindow(raw, (top, left, ch, cw))
            if defer:
                return window
            crop = _decode_window(window, size, channels)
            if isinstance(crop, ValueError):
                raise crop
            return crop
        return bilinear_crop(from_pil(_load(img, raw, channels)), (top, left, ch, cw), size)
    box = (left, top, left + cw, top + ch)
    s = dct_scale(ch, cw, size) if img.format == "JPEG" else 1
    if s > 1:
        drafted = img.draft(img.mode, (w // s, h // s))  # -> (mode, (0, 0, w / s', h / s')), s' the scale it took
        if drafted is not None and drafted[1][2] != w:
            s = w / drafted[1][2]
            box = tuple(v / s for v in box)
    return from_pil(_load(img, raw, channels).resize((size, size), Image.BICUBIC, box=box))


_JPEG_END = b"\xff\xd9"  # EOI, the marker that ends every complete JPEG


class JpegWindow(NamedTuple):
    """A complete RGB / greyscale JPEG and the window (top, left, height, width) of it to decode and resize."""

    raw: bytes
    window: tuple


def bilinear_crop(arr, window, size):
    """big_vision's bilinear resize of the window (top, left, height, width) of uint8 [H, W, C] to size x size
    (module docstring)."""
    top, left, ch, cw = window
    return _bilinear_resize(_tensorflow().constant(arr[top : top + ch, left : left + cw]), size).numpy()


def bilinear_jpeg_crops(windows, size, channels):
    """`bilinear_crop` of each `JpegWindow`, decoding only the window, as one TensorFlow graph call for all of them
    (one dispatch per batch instead of several per image; the calling thread waits without the GIL). A list
    holding each crop, uint8 [size, size, channels], or, for a JPEG TensorFlow cannot decode, its ValueError."""
    if not windows:
        return []
    tf = _tensorflow()
    try:
        raws, boxes = tf.constant([w.raw for w in windows]), tf.constant([w.window for w in windows], tf.int32)
        return list(_jpeg_window_graph(size, channels)(raws, boxes).numpy())
    except tf.errors.InvalidArgumentError:  # at least one of them: find which, one by one
        return [_decode_window(w, size, channels) for w in windows]


def _decode_window(window, size, channels):
    """`bilinear_jpeg_crops` of one window, eagerly: its crop, or its ValueError."""
    tf = _tensorflow()
    try:
        return _bilinear_resize(tf.io.decode_and_crop_jpeg(window.raw, window.window, channels=channels), size).numpy()
    except tf.errors.InvalidArgumentError as e:  # no scan data, a bad marker, ...
        message = re.sub(r"\.?\s*\[Op:\w+\]$", "", e.message.splitlines()[-1].split("}} ", 1)[-1])
        return ValueError(f"cannot decode image ({len(window.raw)} bytes): {message}")


@functools.cache
def _jpeg_window_graph(size, channels):
    tf = _tensorflow()

    def crop(record):
        raw, window = record
        return _bilinear_resize(tf.io.decode_and_crop_jpeg(raw, window, channels=channels), size)

    @tf.function(input_signature=(tf.TensorSpec([None], tf.string), tf.TensorSpec([None, 4], tf.int32)))
    def crops(raws, windows):
        return tf.map_fn(crop, (raws, windows), parallel_iterations=1,
                         fn_output_signature=tf.TensorSpec([size, size, channels], tf.uint8))

    return crops.get_concrete_function()


def _bilinear_resize(crop, size):
    """uint8 tensor [h, w, C] -> [size, size, C]: big_vision's resize op (module docstring)."""
    tf = _tensorflow()
    return tf.cast(tf.image.resize(crop, (size, size), method="bilinear", antialias=False), tf.uint8)


@functools.cache
def _tensorflow():
    """TensorFlow, imported on first use. When this is the process's first use of it, it is kept off the GPUs JAX
    trains on (as big_vision does) and to one thread per op, as tf.data runs big_vision's map
    (`max_intra_op_parallelism = 1`): the parallelism is the grain threads, whose graph calls run side by side on
    TensorFlow's inter-op pool (one thread per core). Once TensorFlow has started, neither can change; the ops
    then run as it is configured."""
    import tensorflow as tf

    for configure in (lambda: tf.config.set_visible_devices([], "GPU"),
                      lambda: tf.config.threading.set_intra_op_parallelism_threads(1)):
        try:
            configure()
        except RuntimeError:  # TensorFlow has started in this process already
            pass
    return tf


def to_pil(arr):
    return Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr)


def from_pil(img):
    arr = np.asarray(img)
    return arr[..., None] if arr.ndim == 2 else arr


def resize_center_crop(arr, size, crop_pct=1.0):
    """Resize the shorter side to floor(size / crop_pct) (bicubic, antialiased), then centre-crop size x size."""
    h, w = arr.shape[:2]
    scale_size = int(math.floor(size / crop_pct))
    if (h, w) == (size, size) and scale_size == size:
        return arr
    if h <= w:
        new_h, new_w = scale_size, max(int(scale_size * w / h), scale_size)
    else:
        new_h, new_w = max(int(scale_size * h / w), scale_size), scale_size
    img = to_pil(arr)
    if (new_h, new_w) != (h, w):
        img = img.resize((new_w, new_h), Image.BICUBIC)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return from_pil(img.crop((left, top, left + size, top + size)))


def random_resized_crop_box(h, w, scale, rng, ratio=RRC_RATIO):
    """(top, left, height, width) of an Inception-style crop (torchvision's RandomResizedCrop.get_params)."""
    area = h * w
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(RRC_ATTEMPTS):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
    # Fallback: the largest centred crop whose aspect ratio lies within `ratio`.
    in_ratio = w / h
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def random_resized_crop(arr, size, scale, rng, interpolation="bicubic"):
    top, left, ch, cw = random_resized_crop_box(arr.shape[0], arr.shape[1], scale, rng)
    if interpolation == "bilinear":
        return bilinear_crop(arr, (top, left, ch, cw), size)
    return from_pil(to_pil(arr).resize((size, size), Image.BICUBIC, box=(left, top, left + cw, top + ch)))


# ----------------------------------------------------------------------------------------------- batch stage


def translate(x, offsets_y, offsets_x, pad):
    """Reflect-pad each image of uint8 [b, S, S, C] by `pad` and crop S x S at (offsets_y, offsets_x) in [0, 2 pad]."""
    b, h, w, _ = x.shape
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect")
    rows = (offsets_y[:, None] + np.arange(h))[:, :, None]
    cols = (offsets_x[:, None] + np.arange(w))[:, None, :]
    return padded[np.arange(b)[:, None, None], rows, cols]


def hflip(x, flip):
    """Mirror the images of [b, H, W, C] where `flip` [b] is True (returns a new array). Pixels are moved as
    whole C-byte items (a void view), one move per pixel instead of one per byte."""
    x = x.copy()
    pixels = x.view(np.dtype((np.void, x.shape[-1] * x.itemsize)))[..., 0]
    for i in np.flatnonzero(flip):
        pixels[i] = pixels[i, :, ::-1]
    return x


def three_augment(img, choice, sigma):
    """DeiT III 3-Augment on a PIL image: choice 0 grayscale, 1 solarize(threshold 128), 2 gaussian blur(sigma)."""
    if choice == 0:
        return img if img.mode == "L" else img.convert("L").convert("RGB")
    if choice == 1:
        return ImageOps.solarize(img, threshold=128)
    return img.filter(ImageFilter.GaussianBlur(radius=float(sigma)))


def _brightness(img, factor):
    """`ImageEnhance.Brightness(img).enhance(factor)`: a blend with black."""
    return Image.blend(Image.new(img.mode, img.size, 0), img, factor)


def _contrast(img, factor):
    """`ImageEnhance.Contrast(img).enhance(factor)`: a blend with the rounded mean luma (from its histogram)."""
    hist = np.asarray((img if img.mode == "L" else img.convert("L")).histogram(), np.int64)
    mean = int(int(hist @ np.arange(256)) / int(hist.sum()) + 0.5)
    return Image.blend(Image.new(img.mode, img.size, (mean,) * len(img.getbands())), img, factor)


def _saturation(img, factor):
    """`ImageEnhance.Color(img).enhance(factor)`: a blend with the luma image (a no-op on grayscale images)."""
    if img.mode == "L":
        return img
    return Image.blend(img.convert("L").convert(img.mode), img, factor)


_JITTER_OPS = (_brightness, _contrast, _saturation)


def color_jitter(img, factors, order):
    """torchvision ColorJitter(s, s, s) on a PIL image (its PIL path: uint8 after each op).

    factors: brightness, contrast, saturation factors; order: the permutation of (0, 1, 2) to apply them in
    (torchvision draws a random order per image). Brightness blends with black, contrast with the mean luma,
    saturation with the luma image (a no-op on grayscale images). The same pixels as `ImageEnhance`'s Brightness,
    Contrast and Color, without building the enhancer objects (the contrast mean from one histogram).
    """
    for op in order:
        img = _JITTER_OPS[op](img, float(factors[op]))
    return img


def normalize(x, mean, std, out=None):
    """uint8/float [.., W, C] in [0, 255] -> float32 (x / 255 - mean) / std, computed as x * (1 / (255 std)) -
    mean / std in float32, into `out` (a new array if None; `x` is never modified).

    Two passes over rows of pixels, the per-channel constants tiled along a row: numpy's inner loop then runs over
    W * C values rather than over the C channels of one pixel.
    """
    mean = np.asarray(mean, np.float32)
    std = np.asarray(std, np.float32)
    width = x.shape[-2] * x.shape[-1] if x.ndim >= 2 else x.shape[-1]
    repeats = width // len(mean)
    target = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, np.float32)
    rows = target.reshape(-1, width)
    np.multiply(np.reshape(x, (-1, width)), np.tile(1.0 / (255.0 * std), repeats), out=rows, dtype=np.float32)
    np.subtract(rows, np.tile(mean / std, repeats), out=rows)
    if out is not None and target is not out:
        out[...] = target
        return out
    return target
