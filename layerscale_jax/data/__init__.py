"""Input pipeline: TFDS datasets (array_record) read with grain, the offline `digits` default, `synthetic` data,
DeiT III augmentation, mixup / CutMix, exact resume, and global batches for a mesh.

    info = get_dataset_info(config.data)
    train = make_train_iterator(config.data, global_batch_size=256, seed=0)
    batch = to_global_batch(next(train), mesh)           # {"image", "label"} as sharded jax.Arrays
    images, targets = mixup_cutmix(rng, batch["image"], batch["label"], num_classes=info.num_classes, ...)
    state = train.get_state(); ...; train.set_state(state)  # exact resume

Importing this package imports nothing heavy: the names below load on first use (``data.config``, the fields and
their checks, needs no jax), and TensorFlow, tensorflow_datasets and grain load only when a dataset is opened.
Fields of `config.data` are documented in `layerscale_jax.data.config`; preparing a TFDS dataset:
`python -m layerscale_jax.data.prepare --name=NAME --data_dir=DIR`.
"""
from layerscale_jax.lazy import lazy_names

_SOURCES = {
    "BadRecordError": ".sources", "DatasetInfo": ".dataset_info", "DatasetNotPreparedError": ".sources",
    "EvalIterator": ".pipeline", "TrainIterator": ".pipeline", "default_data_config": ".config",
    "get_dataset_info": ".dataset_info", "make_eval_iterator": ".pipeline", "make_train_iterator": ".pipeline",
    "measure_pipeline": ".throughput", "mixup_cutmix": ".mixup", "to_global_batch": ".sharding",
    "validate_data_config": ".config",
}
__all__ = sorted(_SOURCES)

__getattr__, __dir__ = lazy_names(__name__, globals(), _SOURCES)
