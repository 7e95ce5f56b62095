"""`mnist1d`: Greydanus & Kobak's MNIST-1D (*Scaling Down Deep Learning with MNIST-1D*, ICML 2024), generated
offline by the `mnist1d` package and stored once per generator setting.

Each example is a 1-D signal of ``final_seq_length`` (40) samples of one of 10 classes: a digit's 12-point
template, padded, dilated, scaled, translated, shear-warped, with correlated and i.i.d. noise added, then resampled
(``mnist1d.transform.transform``). The package's ``make_dataset(args)`` draws ``num_samples`` signals class by class
(``num_samples // 10`` each) from numpy's global generator seeded with ``args.seed``, shuffles them, standardises
the whole set to mean 0 and standard deviation 1 (one mean and one SD over every signal, as the package does), and
cuts it at ``train_split``. Here ``num_samples = num_train + num_validation + num_test`` and the shuffled,
standardised signals are cut in that order:

    train       = signals[0 : num_train]
    validation  = signals[num_train : num_train + num_validation]
    test        = signals[num_train + num_validation :]

so with ``train_split = (num_train + num_validation) / num_samples`` the package's own ``x_test`` is this test
split, element for element (``tests/test_mnist1d.py``). Published reference points on the package's default
4,000 / 1,000 split: logistic regression 32%, MLP 68%, CNN 94% test accuracy.

The package seeds numpy's and Python's global random generators (``mnist1d.utils.set_seed``); ``generate``
restores both afterwards, so a caller's random state is unchanged. Signals are stored as float32 in
``<data_dir>/mnist1d/<key>.npz`` (``key``: a digest of every generator argument and split size), written once,
atomically, and read by every later run: "prepared on first use", offline.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random

import numpy as np

NAME = "mnist1d"
NUM_CLASSES = 10
SPLITS = ("train", "validation", "test")
FORMAT_VERSION = 1          # of the stored file; part of its key


@dataclasses.dataclass(frozen=True)
class Mnist1dSettings:
    """The generator's arguments (``mnist1d.data.get_dataset_args``'s names and defaults) and the split sizes."""
    num_train: int = 4000
    num_validation: int = 1000
    num_test: int = 1000
    seed: int = 42
    template_len: int = 12
    padding: tuple = (36, 60)
    scale_coeff: float = 0.4
    max_translation: int = 48
    corr_noise_scale: float = 0.25
    iid_noise_scale: float = 2e-2
    shear_scale: float = 0.75
    final_seq_length: int = 40

    @property
    def num_samples(self) -> int:
        return self.num_train + self.num_validation + self.num_test

    def split_sizes(self) -> dict[str, int]:
        return {"train": self.num_train, "validation": self.num_validation, "test": self.num_test}

    def package_args(self, train_split: float = 1.0) -> dict:
        """``mnist1d.data.get_dataset_args(as_dict=True)`` with these settings (no sequence shuffling)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("num_train", "num_validation", "num_test")}
        return {**fields, "padding": list(self.padding), "num_samples": self.num_samples,
                "train_split": train_split, "shuffle_seq": False}

    def key(self) -> str:
        """The stored file's name: a digest of every setting and the storage format."""
        text = json.dumps({**dataclasses.asdict(self), "padding": list(self.padding), "format": FORMAT_VERSION},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _global_random_state_kept():
    """Run a block that seeds numpy's and Python's global generators; both are as before afterwards."""
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)


def generate(settings: Mnist1dSettings) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{split: (signals float32 [n, final_seq_length], labels int32 [n])}`` from the package's generator."""
    from mnist1d.data import make_dataset
    from mnist1d.utils import ObjectView

    with _global_random_state_kept():
        data = make_dataset(ObjectView(settings.package_args()))
    signals, labels = data["x"].astype(np.float32), data["y"].astype(np.int32)
    out, start = {}, 0
    for split, n in settings.split_sizes().items():
        out[split] = (signals[start:start + n], labels[start:start + n])
        start += n
    return out


def _stored_path(data_dir: str, settings: Mnist1dSettings) -> str:
    return os.path.join(data_dir, NAME, f"{settings.key()}.npz")


def load(data_dir: str, settings: Mnist1dSettings) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The splits of ``settings``: read from ``data_dir`` when stored, else generated and stored first (once; a
    concurrent writer's file replaces an identical one)."""
    path = _stored_path(data_dir, settings)
    if not os.path.exists(path):
        splits = generate(settings)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        np.savez(tmp, settings=json.dumps(dataclasses.asdict(settings)),
                 **{f"{s}_{part}": arr for s, (x, y) in splits.items() for part, arr in (("x", x), ("y", y))})
        os.replace(tmp, path)
        return splits
    with np.load(path) as stored:
        return {s: (stored[f"{s}_x"], stored[f"{s}_y"]) for s in SPLITS}
