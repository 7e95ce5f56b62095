"""CaiT on ImageNet-1k (Touvron et al., "Going deeper with Image Transformers", 2021).

    python -m layerscale_jax.train --config configs/imagenet_cait.py:variant=xxs24 --workdir DIR

Recipe (the paper's DeiT-based training): AdamW, lr 5e-4 × batch/512 with cosine decay and 5 warm-up epochs,
weight decay 0.05, RandAugment rand-m9-mstd0.5-inc1, random-resized crop and flip, Mixup 0.8, CutMix 1.0, label
smoothing 0.1, 400 epochs, constant stochastic depth per model (XXS 0.05, XS 0.1, S 0.1 (S24) / 0.2 (S36),
M 0.3 (M36) / 0.4 (M48)), LayerScale ε per model as the official code. Repeated augmentation and distillation are
not included.
"""
import ml_collections

from layerscale_jax.config_defaults import (default_data_config, default_optim_config, default_train_config,
                                            model_section, parse_config_arg, use_sharded_input)

VARIANTS = {  # registry name, stochastic-depth rate
    "xxs24": ("cait_xxs24_224", 0.05), "xxs36": ("cait_xxs36_224", 0.1), "xs24": ("cait_xs24_384", 0.1),
    "s24": ("cait_s24_224", 0.1), "s36": ("cait_s36_384", 0.2), "m36": ("cait_m36_384", 0.3),
    "m48": ("cait_m48_448", 0.4),
}
IMAGENET_TRAIN_EXAMPLES = 1_281_167


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    # Unrolled layers: on v4-128 the scanned S36 step needs 23.83 GiB per chip against 17.84 and its step time's
    # lower bound is 205 ms against 138 ms (`python benchmarks/compile_recipes.py`, docs/multihost.md). A scan
    # compiles in the time of one block whatever the depth: `:scan_layers=True` for a quick compile of a deep model.
    args = parse_config_arg(arg, {"variant": "xxs24", "epochs": 400, "batch_size": 1024, "scan_layers": False,
                                  "dtype": "bfloat16", "remat": "none", "workers": 8})
    if args["variant"] not in VARIANTS:
        raise ValueError(f"variant={args['variant']!r} is not one of {sorted(VARIANTS)}")
    name, drop_path = VARIANTS[args["variant"]]
    config = ml_collections.ConfigDict()
    config.model = model_section(name, drop_path_rate=drop_path, scan_layers=args["scan_layers"],
                                 dtype=args["dtype"], remat=args["remat"])

    config.data = default_data_config("imagenet2012")
    use_sharded_input(config.data, args["workers"])
    config.data.image_size = config.model.img_size
    config.data.augment.random_resized_crop = True
    config.data.augment.hflip = True
    config.data.augment.randaugment = "rand-m9-mstd0.5-inc1"
    config.data.mixup_alpha = 0.8
    config.data.cutmix_alpha = 1.0
    config.data.label_smoothing = 0.1

    batch = args["batch_size"]
    steps_per_epoch = IMAGENET_TRAIN_EXAMPLES // batch
    config.optim = default_optim_config()
    config.optim.name = "adamw"
    config.optim.learning_rate = 5e-4 * batch / 512
    config.optim.schedule = "cosine"
    config.optim.warmup_steps = 5 * steps_per_epoch
    config.optim.weight_decay = 0.05
    config.optim.grad_clip_norm = 0.0

    config.train = default_train_config()
    config.train.steps = args["epochs"] * steps_per_epoch
    config.train.batch_size = batch
    config.train.eval_batch_size = 1024
    config.train.log_every = 100
    config.train.eval_every = 10 * steps_per_epoch
    config.train.checkpoint_every = 2000
    config.train.mesh.data = 1
    config.train.mesh.fsdp = -1
    return config
