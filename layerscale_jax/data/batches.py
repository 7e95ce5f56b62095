"""Batch functions: batch j of this process from its positions, records and seeds (uint8 images).

Batch j's augmentation parameters are drawn from a generator seeded by (seed, j) for all G images of
the global batch, and each process takes its rows; per-image crops use a generator seeded by (seed, q). So row i of
batch j is a pure function of (config, seed, j, i): the number of grain workers, prefetch threads or processes and
the mesh's device order change nothing. (Mixup/CutMix run later, inside the jitted step on the global batch.)
"""

import numpy as np
from PIL import Image

from layerscale_jax.data import transforms
from layerscale_jax.data.randaugment import rand_augment


class TrainBatch:
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
        per-image PIL ops; uint8 out (normalised by `Normalize`)."""
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


class EvalBatch:
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


class SignalBatch:
    """Batch j of 1-D signals held in memory (``sources.SignalSource``), used as generated (no augmentation).

    Train (``order`` given): {"image": float32 [b, L, 1], "label": int32 [b], "_valid": bool [b]}, the records of
    the positions of batch j in ``order``, as ``TrainBatch`` draws them. Eval (``order`` None): one pass in record
    order, positions past the end padding (mask False), {"image", "label", "mask", "_bad"} as ``EvalBatch``."""

    def __init__(self, source, geometry, order=None):
        self.source, self.g, self.order = source, geometry, order

    def __call__(self, j):
        positions = self.g.positions(j)
        signals, labels = self.source.signals, self.source.labels
        if self.order is not None:
            keys = self.order.keys(positions)
            return {"image": signals[keys][..., None], "label": labels[keys].astype(np.int32),
                    "_valid": np.ones(len(keys), bool)}
        mask = positions < len(labels)
        keys = np.where(mask, positions, 0)
        return {"image": np.where(mask[:, None, None], signals[keys][..., None], np.float32(0)),
                "label": np.where(mask, labels[keys], 0).astype(np.int32), "mask": mask, "_bad": np.int64(0)}
