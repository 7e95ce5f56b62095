"""Input pipeline: TFDS datasets (array_record) read with grain, the offline `digits` default, `synthetic` data,
DeiT III augmentation, mixup / CutMix, exact resume, and global batches for a mesh.

    info = get_dataset_info(config.data)
    train = make_train_iterator(config.data, global_batch_size=256, seed=0)
    batch = to_global_batch(next(train), mesh)           # {"image", "label"} as sharded jax.Arrays
    images, targets = mixup_cutmix(rng, batch["image"], batch["label"], num_classes=info.num_classes, ...)
    state = train.get_state(); ...; train.set_state(state)  # exact resume

Importing this package never imports TensorFlow (nor tensorflow_datasets / grain until a dataset is opened).
Fields of `config.data` are documented in `layerscale_jax.data.config`; preparing a TFDS dataset:
`python -m layerscale_jax.data.prepare --name=NAME --data_dir=DIR`.
"""

from layerscale_jax.data.config import default_data_config, validate_data_config
from layerscale_jax.data.dataset_info import DatasetInfo, get_dataset_info
from layerscale_jax.data.mixup import mixup_cutmix
from layerscale_jax.data.pipeline import EvalIterator, TrainIterator, make_eval_iterator, make_train_iterator
from layerscale_jax.data.sharding import to_global_batch
from layerscale_jax.data.sources import BadRecordError, DatasetNotPreparedError
from layerscale_jax.data.throughput import measure_pipeline

__all__ = [
    "BadRecordError",
    "DatasetInfo",
    "DatasetNotPreparedError",
    "EvalIterator",
    "TrainIterator",
    "default_data_config",
    "get_dataset_info",
    "make_eval_iterator",
    "make_train_iterator",
    "measure_pipeline",
    "mixup_cutmix",
    "to_global_batch",
    "validate_data_config",
]
