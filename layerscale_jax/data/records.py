"""Reading a split's records: checked and decoded (a bad record raises ``BadRecordError`` naming it, or is
skipped and counted with ``data.skip_bad_records``), and the whole split decoded into memory (``data.cache``)."""

import dataclasses

import numpy as np

from layerscale_jax.data import transforms
from layerscale_jax.data.sources import BadRecordError
from layerscale_jax.errors import InputFileError

_READ_CHUNK = 1024  # records per read when filling the cache.


class Records:
    """Reads, checks and decodes records of a source. Bad records raise, or come back as None when skipping."""

    def __init__(self, source, channels, num_classes, skip_bad):
        self.source, self.channels, self.num_classes, self.skip_bad = source, channels, num_classes, skip_bad

    def read(self, keys):
        """The source's records of `keys`, read in increasing key order (so in file order within each shard of a
        sharded source), returned in the order of `keys`."""
        keys = np.asarray(keys)
        ascending = np.argsort(keys, kind="stable")
        records = [None] * len(keys)
        for i, record in zip(ascending, self.source.read(keys[ascending])):
            records[i] = record
        return records

    def load(self, keys, decode=None):
        """(images, labels) of `keys`; `decode(raw, i)` turns record i's stored image into the image returned
        (default: `transforms.decode_image`), its ValueError marking the record bad like a decode error."""
        images, labels = [], np.zeros(len(keys), np.int32)
        for i, (key, (raw, label)) in enumerate(zip(keys, self.read(keys))):
            try:
                label = int(label)
                if not 0 <= label < self.num_classes:
                    raise ValueError(f"label {label} is outside [0, {self.num_classes})")
                image = decode(raw, i) if decode else transforms.decode_image(raw, self.channels)
            except (ValueError, TypeError) as e:
                images.append(self.bad(key, e))
                continue
            images.append(image)
            labels[i] = label
        return images, labels

    def bad(self, key, error):
        """Record `key` is bad (`error` says why): BadRecordError naming it, or None when skipping."""
        if not self.skip_bad:
            raise BadRecordError(
                f"bad {self.source.describe(key)}: {error}. "
                "Set data.skip_bad_records=True to skip (and count) such records."
            )
        return None


@dataclasses.dataclass
class Cache:
    images: object  # uint8 [N, S, S, C] when `final`, else a list of decoded images of any size
    labels: np.ndarray
    final: bool  # images are already at the model's size (the per-image train stage is deterministic)
    skipped: int


def build_cache(records, element_fn):
    """Decodes the whole split (in chunks) into memory; `element_fn` (or None) is the deterministic image stage."""
    images, labels, skipped = [], [], 0
    n = len(records.source)
    for start in range(0, n, _READ_CHUNK):
        keys = np.arange(start, min(start + _READ_CHUNK, n))
        imgs, labs = records.load(keys)
        for img, lab in zip(imgs, labs):
            if img is None:
                skipped += 1
                continue
            images.append(element_fn(img) if element_fn else img)
            labels.append(lab)
    if not images:
        raise InputFileError(f"every record of {records.source.describe(0).split(' of ', 1)[1]} is bad")
    final = element_fn is not None
    return Cache(np.stack(images) if final else images, np.asarray(labels, np.int32), final, skipped)
