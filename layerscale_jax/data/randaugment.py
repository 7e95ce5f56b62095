"""RandAugment (Cubuk et al., 2020) with timm's op set and magnitude mapping, on PIL images.

Per image: `num_ops` ops drawn uniformly with replacement from the 15 ops below, each applied with p = 0.5 at
magnitude m in [0, 10] (with `mstd` > 0, m ~ N(m, mstd) clipped to [0, 10], drawn per op). `inc1` selects the
"increasing" variants, whose strength grows with m (Posterize, Solarize, Color, Contrast, Brightness, Sharpness).
Signed ops (rotate, shear, translate, the enhancement offsets) flip their sign with p = 0.5.
Mapping from m (level = m / 10): rotate 30 deg * level; shear 0.3 * level; translate 0.45 * level of the side;
posterize bits 4 - int(4 level) (inc) or 4 + int(4 level); solarize threshold 256 - int(256 level) (inc) or
int(256 level); solarize-add +int(110 level) to pixels < 128; enhance factor 1 +- 0.9 level (inc) or 0.1 + 1.8 level.
Geometric ops fill with the dataset mean colour and use bilinear resampling (timm draws bilinear or bicubic).
"""

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from layerscale_jax.errors import ConfigError

OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
APPLY_PROB = 0.5
MAX_LEVEL = 10.0


def _signed(value, rng):
    return -value if rng.random() < 0.5 else value


def _affine(img, matrix, fill):
    return img.transform(img.size, Image.AFFINE, matrix, resample=Image.BILINEAR, fillcolor=fill)


def _enhance(cls, img, level, increasing, rng):
    factor = 1.0 + _signed(0.9 * level, rng) if increasing else 0.1 + 1.8 * level
    return cls(img).enhance(max(factor, 0.0))


def apply_op(name, img, level, increasing, rng, fill):
    """Applies op `name` at `level` in [0, 1] to a PIL image ('L' or 'RGB')."""
    w, h = img.size
    if name == "AutoContrast":
        return ImageOps.autocontrast(img)
    if name == "Equalize":
        return ImageOps.equalize(img)
    if name == "Invert":
        return ImageOps.invert(img)
    if name == "Rotate":
        return img.rotate(_signed(30.0 * level, rng), resample=Image.BILINEAR, fillcolor=fill)
    if name == "Posterize":
        bits = 4 - int(4 * level) if increasing else 4 + int(4 * level)
        return img if bits >= 8 else ImageOps.posterize(img, max(bits, 0))
    if name == "Solarize":
        return ImageOps.solarize(img, 256 - int(256 * level) if increasing else int(256 * level))
    if name == "SolarizeAdd":
        add = int(110 * level)
        lut = [min(255, i + add) if i < 128 else i for i in range(256)]
        return img.point(lut * len(img.getbands()))
    if name == "Color":
        return _enhance(ImageEnhance.Color, img, level, increasing, rng)
    if name == "Contrast":
        return _enhance(ImageEnhance.Contrast, img, level, increasing, rng)
    if name == "Brightness":
        return _enhance(ImageEnhance.Brightness, img, level, increasing, rng)
    if name == "Sharpness":
        return _enhance(ImageEnhance.Sharpness, img, level, increasing, rng)
    if name == "ShearX":
        return _affine(img, (1, _signed(0.3 * level, rng), 0, 0, 1, 0), fill)
    if name == "ShearY":
        return _affine(img, (1, 0, 0, _signed(0.3 * level, rng), 1, 0), fill)
    if name == "TranslateXRel":
        return _affine(img, (1, 0, _signed(0.45 * level, rng) * w, 0, 1, 0), fill)
    if name == "TranslateYRel":
        return _affine(img, (1, 0, 0, 0, 1, _signed(0.45 * level, rng) * h), fill)
    raise ConfigError(f"unknown RandAugment op {name!r}")


def rand_augment(img, spec, rng, fill):
    """RandAugment per `spec` (config.RandAugmentSpec) on one PIL image, randomness from numpy Generator `rng`."""
    for name in rng.choice(OPS, size=spec.num_ops, replace=True):
        if rng.random() >= APPLY_PROB:
            continue
        m = spec.magnitude
        if spec.magnitude_std > 0:
            m = float(np.clip(rng.normal(m, spec.magnitude_std), 0.0, MAX_LEVEL))
        img = apply_op(str(name), img, m / MAX_LEVEL, spec.increasing, rng, fill)
    return img
