"""Mixup (Zhang et al., 2018) and CutMix (Yun et al., 2019) with label smoothing, batched, for the jitted step.

Batch mode, as timm's `Mixup(mode='batch')`: one lambda for the whole batch; each image is mixed with the image at
the mirrored batch position (the batch reversed along axis 0).
  * both alphas > 0: CutMix with probability `switch_prob`, else mixup; only one > 0: that one; both 0: no mixing.
  * mixup:  x = lam x + (1 - lam) x_rev,            lam ~ Beta(mixup_alpha, mixup_alpha)
  * CutMix: a box with side ratio sqrt(1 - lam), lam ~ Beta(cutmix_alpha, cutmix_alpha), centred uniformly in the
            image and clipped to it, is pasted from x_rev; lam is then corrected to 1 - box area / image area.
  * targets: lam y + (1 - lam) y_rev with y the smoothed one-hot (off = eps / K, on = 1 - eps + off).
"""

import jax
import jax.numpy as jnp

from layerscale_jax.errors import ConfigError


def smoothed_one_hot(labels, num_classes, label_smoothing):
    off = label_smoothing / num_classes
    on = 1.0 - label_smoothing + off
    return jnp.where(jax.nn.one_hot(labels, num_classes, dtype=jnp.bool_), on, off).astype(jnp.float32)


def _cutmix_box_mask(rng, lam, height, width):
    """bool [H, W] mask of the pasted box, and the corrected lam."""
    ratio = jnp.sqrt(1.0 - lam)
    cut_h = jnp.floor(height * ratio).astype(jnp.int32)
    cut_w = jnp.floor(width * ratio).astype(jnp.int32)
    ky, kx = jax.random.split(rng)
    cy = jax.random.randint(ky, (), 0, height)
    cx = jax.random.randint(kx, (), 0, width)
    y0, y1 = jnp.clip(cy - cut_h // 2, 0, height), jnp.clip(cy + cut_h // 2, 0, height)
    x0, x1 = jnp.clip(cx - cut_w // 2, 0, width), jnp.clip(cx + cut_w // 2, 0, width)
    rows = jnp.arange(height)[:, None]
    cols = jnp.arange(width)[None, :]
    mask = (rows >= y0) & (rows < y1) & (cols >= x0) & (cols < x1)
    lam = 1.0 - ((y1 - y0) * (x1 - x0)).astype(jnp.float32) / (height * width)
    return mask, lam


def mixup_cutmix(rng, images, labels, *, num_classes, mixup_alpha, cutmix_alpha, switch_prob=0.5, label_smoothing):
    """images [b, H, W, C], labels int [b] -> (mixed images, soft targets float32 [b, num_classes]).

    The alphas, `switch_prob`, `num_classes` and `label_smoothing` are Python numbers (static under jit).
    """
    for name, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ConfigError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    targets = smoothed_one_hot(labels, num_classes, label_smoothing)
    if mixup_alpha == 0 and cutmix_alpha == 0:
        return images, targets
    k_switch, k_mix, k_cut, k_box = jax.random.split(rng, 4)
    height, width = images.shape[1], images.shape[2]
    flipped = images[::-1]
    out, lam = images, jnp.float32(1.0)
    if mixup_alpha > 0:
        lam_mix = jax.random.beta(k_mix, mixup_alpha, mixup_alpha).astype(jnp.float32)
        mixed = (images * lam_mix + flipped * (1.0 - lam_mix)).astype(images.dtype)
    if cutmix_alpha > 0:
        lam_cut = jax.random.beta(k_cut, cutmix_alpha, cutmix_alpha).astype(jnp.float32)
        mask, lam_cut = _cutmix_box_mask(k_box, lam_cut, height, width)
        cut = jnp.where(mask[None, :, :, None], flipped, images)
    if mixup_alpha > 0 and cutmix_alpha > 0:
        use_cutmix = jax.random.uniform(k_switch) < switch_prob
        out = jnp.where(use_cutmix, cut, mixed)
        lam = jnp.where(use_cutmix, lam_cut, lam_mix)
    elif mixup_alpha > 0:
        out, lam = mixed, lam_mix
    else:
        out, lam = cut, lam_cut
    return out, lam * targets + (1.0 - lam) * targets[::-1]
