"""`digits`: the offline default dataset, a TFDS builder over scikit-learn's bundled handwritten digits.

scikit-learn ships 1,797 real 8x8 grayscale images of the digits 0-9 (the UCI "optdigits" test set, 43 writers)
inside its wheel, so this dataset needs no network. Pixel values in the source are integers 0..16; they are stored
here as uint8 PNGs scaled to 0..255 (`round(v * 255 / 16)`) so that every dataset in the pipeline is uint8 0..255.

Split (fixed, stratified, documented): for each class c, the examples of class c (in scikit-learn's order) are
permuted with `numpy.random.default_rng(SPLIT_SEED + c)` and the first `n_c // 5` of them form the test split; the
rest form the train split. With the class counts 178, 182, 177, 183, 181, 182, 181, 179, 174, 180 this gives
**1,442 train / 355 test** examples, every class 19-20 % test. Each example keeps its scikit-learn row index in the
`sklearn_index` feature, so the split can be audited.

Validation (version 1.1.0): the same rule applied once more inside the train split — for each class c, its train
examples (in scikit-learn's order) are permuted with `numpy.random.default_rng([SPLIT_SEED, VALIDATION_STREAM, c])`
and the first `n_c // 5` form `validation` (**285** examples, 28-29 per class), the rest
`train_without_validation` (**1,157**). Selection (learning rates, budgets) trains on `train_without_validation`
and evaluates on `validation`; `train` and `test` are unchanged from version 1.0.0, record for record and in the
same order.

The builder lives in a package module (TFDS locates a builder's files through its module) and is prepared with
`file_format='array_record'` so it can be read without TensorFlow. Importing this module imports
`tensorflow_datasets` (not TensorFlow); `download_and_prepare` imports TensorFlow, which is why
`layerscale_jax.data.sources` runs the preparation in a subprocess (`python -m layerscale_jax.data.prepare`).
"""

import io

import numpy as np
import tensorflow_datasets as tfds

SPLIT_SEED = 20210331  # CaiT's arXiv date; any fixed value would do, but it must never change.
NUM_CLASSES = 10
TEST_FRACTION_DENOMINATOR = 5  # n_c // 5 examples of each class go to test (and n_c // 5 of train to validation).
VALIDATION_STREAM = 1  # the validation split's permutations: default_rng([SPLIT_SEED, VALIDATION_STREAM, c]).


def _stratified_holdout(labels, rows, rng_for_class):
    """(kept, held out): for each class c, ``rng_for_class(c)`` permutes the rows of class c (in the given order)
    and its first ``n_c // TEST_FRACTION_DENOMINATOR`` are held out."""
    kept, held = [], []
    for c in range(NUM_CLASSES):
        of_class = rng_for_class(c).permutation(rows[labels[rows] == c])
        n_held = len(of_class) // TEST_FRACTION_DENOMINATOR
        held.extend(of_class[:n_held].tolist())
        kept.extend(of_class[n_held:].tolist())
    return sorted(kept), sorted(held)


def split_indices():
    """Returns (train_indices, test_indices): sorted scikit-learn row indices of each split."""
    from sklearn.datasets import load_digits

    labels = load_digits().target
    return _stratified_holdout(labels, np.arange(len(labels)), lambda c: np.random.default_rng(SPLIT_SEED + c))


def validation_indices():
    """Returns (train_without_validation_indices, validation_indices): the train split divided, sorted."""
    from sklearn.datasets import load_digits

    labels = load_digits().target
    train, _ = split_indices()
    return _stratified_holdout(labels, np.asarray(train),
                               lambda c: np.random.default_rng([SPLIT_SEED, VALIDATION_STREAM, c]))


def _png(image_u8):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image_u8[..., 0], mode="L").save(buf, format="PNG")
    return buf.getvalue()


class Digits(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's 1,797 handwritten 8x8 digits, 10 classes, stratified 1,442 / 355 split; the train split
    divided once more into 1,157 / 285 for validation."""

    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {
        "1.0.0": "Initial release: stratified split, seed 20210331, images scaled 0..16 -> 0..255.",
        "1.1.0": "Adds 'validation' (285) and 'train_without_validation' (1,157), a stratified division of 'train'; "
                 "'train' and 'test' unchanged.",
    }

    def _info(self):
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(8, 8, 1), encoding_format="png"),
                    "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
                    "sklearn_index": np.int32,
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://scikit-learn.org/stable/modules/generated/sklearn.datasets.load_digits.html",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # Nothing to download: the data ships with scikit-learn.
        train, test = split_indices()
        fit, validation = validation_indices()
        return {"train": self._generate_examples(train), "test": self._generate_examples(test),
                "validation": self._generate_examples(validation),
                "train_without_validation": self._generate_examples(fit)}

    def _generate_examples(self, rows):
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
        for row in rows:
            yield int(row), {
                "image": _png(images[row]),
                "label": int(digits.target[row]),
                "sklearn_index": np.int32(row),
            }
