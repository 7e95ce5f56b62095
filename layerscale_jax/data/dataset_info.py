"""What the model and the train loop know of a dataset (``DatasetInfo``), and its normalisation constants."""

import dataclasses

import numpy as np

from layerscale_jax.data import sources
from layerscale_jax.data.config import DIGITS, MNIST1D, SYNTHETIC, validate_data_config

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Per-dataset normalisation constants (mean, std of pixel values / 255 over the train split).
NORMALIZATION = {
    DIGITS: ((0.3048,), (0.3756,)),  # computed on the 1,442 digits train images (0..255 scaling).
    SYNTHETIC: (None, None),  # uniform noise: 0.5 and 1/sqrt(12) per channel, filled in by `normalization`.
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagenet2012": (IMAGENET_MEAN, IMAGENET_STD),
    "imagenet_v2": (IMAGENET_MEAN, IMAGENET_STD),
    "imagenette": (IMAGENET_MEAN, IMAGENET_STD),
}


def normalization(name, channels):
    """(mean, std) tuples for dataset `name`; unknown names: ImageNet's (3 channels) or 0.5 / 0.5 (1 channel)."""
    base = name.split("/")[0].split(":")[0]
    if base == MNIST1D:
        return (0.0,) * channels, (1.0,) * channels   # standardised by the generator (data.mnist1d); not rescaled
    if base == SYNTHETIC:
        return (0.5,) * channels, (float(1 / np.sqrt(12)),) * channels
    if base in NORMALIZATION:
        mean, std = NORMALIZATION[base]
        if len(mean) == channels:
            return mean, std
    return (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,) * channels, (0.5,) * channels)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What the model and the train loop need to know about a dataset."""

    name: str
    num_classes: int
    image_size: int  # square side the model sees
    channels: int
    num_train: int
    num_test: int  # examples of the evaluated split (`eval_split`)
    mean: tuple  # per channel, of pixel / 255
    std: tuple
    train_split: str = "train"
    eval_split: str = "test"
    input_dims: int = 2  # 2: images (H, W, C); 1: signals (length, C), whose length is `image_size`


def _info(settings, train_src, eval_src, num_classes, channels):
    mean, std = normalization(settings.name, channels)
    return DatasetInfo(
        train_split=train_src.split,
        eval_split=eval_src.split,
        name=settings.name,
        num_classes=num_classes,
        image_size=settings.image_size,
        channels=channels,
        num_train=len(train_src),
        num_test=len(eval_src),
        mean=tuple(mean),
        std=tuple(std),
        input_dims=1 if settings.name == MNIST1D else 2,
    )


def get_dataset_info(data_config):
    """DatasetInfo for `data_config` (prepares `digits` on first use; raises if a TFDS dataset is not prepared)."""
    settings = validate_data_config(data_config)
    return _info(settings, *sources.open_sources(settings))
