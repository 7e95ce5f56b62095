"""Image preprocessing on numpy / PIL (no TensorFlow at read time).

Two stages, so that everything that can be vectorised over a batch is:

* per image (PIL, images differ in size): `decode_image`; train `random_resized_crop` or `resize_center_crop`;
  eval `resize_center_crop` with `crop_pct` (timm: resize the shorter side to floor(size / crop_pct), bicubic,
  then centre-crop `size`; crop_pct = 0.875 at 224 px).
* per batch (uint8 [b, S, S, C], per-image random parameters): `translate` (reflect-pad and random crop, DeiT
  III's "simple random crop") and `hflip` vectorised in numpy; RandAugment, DeiT III's 3-Augment and colour jitter
  per image with PIL (as torchvision on PIL images, which DeiT III uses; also ~6x faster than float numpy on 224 px
  images here); `normalize` vectorised.

DeiT III train order (Touvron et al., "DeiT III: Revenge of the ViT", 2022): crop -> flip -> 3-Augment (one of
grayscale, solarize(threshold 128), gaussian blur(sigma ~ U[0.1, 2])) -> ColorJitter(s, s, s) -> normalise. RandAugment,
when configured, runs after the flip and before 3-Augment (DeiT I used RandAugment in that slot instead).
"""

import io
import math

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)  # torchvision / timm RandomResizedCrop aspect-ratio range.
RRC_ATTEMPTS = 10


def decode_image(raw, channels):
    """Encoded bytes (PNG/JPEG/...) or a uint8 array -> uint8 [H, W, channels]. Raises ValueError if it cannot."""
    if isinstance(raw, np.ndarray) and raw.dtype != object:
        arr = raw[..., None] if raw.ndim == 2 else raw
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[-1] != channels or 0 in arr.shape:
            raise ValueError(f"expected a uint8 [H, W, {channels}] image, got {arr.dtype} {arr.shape}")
        return arr
    if isinstance(raw, np.ndarray):
        raw = raw.item()
    if not isinstance(raw, (bytes, bytearray)):
        raise ValueError(f"expected encoded image bytes or a uint8 array, got {type(raw).__name__}")
    try:
        with Image.open(io.BytesIO(raw)) as img:
            img = img.convert("RGB" if channels == 3 else "L")  # convert() forces the full decode.
    except Exception as e:  # PIL raises UnidentifiedImageError, OSError (truncated), SyntaxError, ...
        raise ValueError(f"cannot decode image ({len(raw)} bytes): {type(e).__name__}: {e}") from None
    arr = np.asarray(img)
    return arr[..., None] if arr.ndim == 2 else arr


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


def random_resized_crop(arr, size, scale, rng):
    top, left, ch, cw = random_resized_crop_box(arr.shape[0], arr.shape[1], scale, rng)
    img = to_pil(arr).resize((size, size), Image.BICUBIC, box=(left, top, left + cw, top + ch))
    return from_pil(img)


# ----------------------------------------------------------------------------------------------- batch stage


def translate(x, offsets_y, offsets_x, pad):
    """Reflect-pad each image of uint8 [b, S, S, C] by `pad` and crop S x S at (offsets_y, offsets_x) in [0, 2 pad]."""
    b, h, w, _ = x.shape
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect")
    rows = (offsets_y[:, None] + np.arange(h))[:, :, None]
    cols = (offsets_x[:, None] + np.arange(w))[:, None, :]
    return padded[np.arange(b)[:, None, None], rows, cols]


def hflip(x, flip):
    """Mirror the images of [b, H, W, C] where `flip` [b] is True (returns a new array)."""
    x = x.copy()
    x[flip] = x[flip][:, :, ::-1]
    return x


def three_augment(img, choice, sigma):
    """DeiT III 3-Augment on a PIL image: choice 0 grayscale, 1 solarize(threshold 128), 2 gaussian blur(sigma)."""
    if choice == 0:
        return img if img.mode == "L" else img.convert("L").convert("RGB")
    if choice == 1:
        return ImageOps.solarize(img, threshold=128)
    return img.filter(ImageFilter.GaussianBlur(radius=float(sigma)))


_JITTER_OPS = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)


def color_jitter(img, factors, order):
    """torchvision ColorJitter(s, s, s) on a PIL image (its PIL path: uint8 after each op).

    factors: brightness, contrast, saturation factors; order: the permutation of (0, 1, 2) to apply them in
    (torchvision draws a random order per image). Brightness blends with black, contrast with the mean luma,
    saturation with the luma image (a no-op on grayscale images).
    """
    for op in order:
        img = _JITTER_OPS[op](img).enhance(float(factors[op]))
    return img


def normalize(x, mean, std):
    """uint8/float [.., C] in [0, 255] -> float32 (x / 255 - mean) / std."""
    mean = np.asarray(mean, np.float32)
    std = np.asarray(std, np.float32)
    y = x.astype(np.float32)  # a copy, even when x is float32: callers' arrays are never modified.
    y *= 1.0 / (255.0 * std)
    y -= mean / std
    return y
