"""Fine-tune a pre-trained DeiT III-S/16 (converted from timm) with layer-wise learning-rate decay.

    python -m layerscale_jax.convert --model deit3_small_patch16_224 --source deit3_small.safetensors \
        --out /tmp/deit3_s_converted
    python -m layerscale_jax.train --config configs/finetune_deit3_small.py:dataset=cifar10 \
        --workdir /tmp/ft --config.train.init_from=/tmp/deit3_s_converted

Recipe (MAE / BEiT fine-tuning practice): AdamW, lr 5e-4 × batch/256 (ViT-B; S uses the same), layer decay 0.65
(MAE convention: final norm and head at scale 1), weight decay 0.05, drop path 0.1, Mixup 0.8, CutMix 1.0, label
smoothing 0.1, cosine decay with 5 % warm-up. The head is re-initialised when the class count differs.
"""
import ml_collections

from layerscale_jax.config_defaults import (default_data_config, default_optim_config, default_train_config,
                                            model_section, parse_config_arg)

DATASETS = {"cifar10": (10, 32), "cifar100": (100, 32), "imagenet2012": (1000, 224)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = parse_config_arg(arg, {"dataset": "cifar10", "steps": 10000, "batch_size": 256, "img_size": 224,
                                  "layer_decay": 0.65, "convention": "mae"})
    if args["dataset"] not in DATASETS:
        raise ValueError(f"dataset={args['dataset']!r} is not one of {sorted(DATASETS)}")
    num_classes, _ = DATASETS[args["dataset"]]
    config = ml_collections.ConfigDict()
    config.model = model_section("deit3_small_patch16_224", num_classes=num_classes, img_size=args["img_size"],
                                 drop_path_rate=0.1)

    config.data = default_data_config(args["dataset"])
    config.data.image_size = args["img_size"]
    config.data.augment.random_resized_crop = True
    config.data.augment.hflip = True
    config.data.augment.randaugment = "rand-m9-mstd0.5-inc1"
    config.data.mixup_alpha = 0.8
    config.data.cutmix_alpha = 1.0
    config.data.label_smoothing = 0.1

    batch = args["batch_size"]
    config.optim = default_optim_config()
    config.optim.name = "adamw"
    config.optim.learning_rate = 5e-4 * batch / 256
    config.optim.schedule = "cosine"
    config.optim.warmup_steps = args["steps"] // 20
    config.optim.weight_decay = 0.05
    config.optim.layer_decay = args["layer_decay"]
    config.optim.layer_decay_convention = args["convention"]

    config.train = default_train_config()
    config.train.steps = args["steps"]
    config.train.batch_size = batch
    config.train.eval_batch_size = 500
    config.train.log_every = 50
    config.train.eval_every = 1000
    config.train.checkpoint_every = 1000
    return config
