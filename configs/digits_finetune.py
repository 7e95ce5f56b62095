"""Fine-tune the digits LayerScale ViT from a pre-trained encoder (e.g. an MAE run of ``configs/digits_mae.py``).

    python -m layerscale_jax.train --config configs/digits_mae.py --workdir /tmp/digits_mae
    python -m layerscale_jax.train --config configs/digits_finetune.py:mode=lora \
        --workdir /tmp/digits_lora --config.train.init_from=/tmp/digits_mae

``mode``: ``full`` (every parameter, layer decay ``layer_decay``; 1.0 = none), ``lora`` (rank ``rank`` adapters on
qkv, proj, fc1, fc2, α = 2·rank, new head trained, the rest frozen), ``linear_probe`` (only the head) or ``scratch``
(full training from a random initialisation: set no ``init_from``). The classifier is the main job's
(``configs/digits_layerscale.py``: depth 4, width 64, patch 2, average pooling); its new head and ``fc_norm`` are
initialised fresh, everything else comes from ``train.init_from``. Peak lr per mode: full 2e-3, lora 1e-2,
linear_probe 2e-2, scratch 2e-2 (the main job's); AdamW, cosine, 5% warm-up, weight decay 0.05 (0 for the probe),
drop path 0.05, label smoothing 0.1, batch 64. Argument keys: mode, steps, seed, lr (0 = the mode's default),
layer_decay, rank.
"""
import ml_collections

from layerscale_jax.config_defaults import (default_data_config, default_lora_config, default_optim_config,
                                            default_train_config, model_section, parse_config_arg)

MODES = {          # train.finetune, default peak lr
    "full": ("full", 2e-3),
    "lora": ("lora", 1e-2),
    "linear_probe": ("linear_probe", 2e-2),
    "scratch": ("full", 2e-2),        # the main job's lr for training from a random initialisation
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = parse_config_arg(arg, {"mode": "full", "steps": 600, "seed": 0, "lr": 0.0, "layer_decay": 0.75,
                                  "rank": 4})
    if args["mode"] not in MODES:
        raise ValueError(f"mode={args['mode']!r} is not one of {sorted(MODES)}")
    finetune, default_lr = MODES[args["mode"]]
    config = ml_collections.ConfigDict()
    config.model = model_section(
        "deit3_small_patch16_224", img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, depth=4,
        num_heads=4, init_values="auto", drop_path_rate=0.05, global_pool="avg")

    config.data = default_data_config("digits")
    config.data.label_smoothing = 0.1
    config.data.augment.crop_padding = 0

    config.optim = default_optim_config()
    config.optim.name = "adamw"
    config.optim.learning_rate = args["lr"] or default_lr
    config.optim.warmup_steps = max(1, args["steps"] // 20)
    config.optim.schedule = "cosine"
    config.optim.weight_decay = 0.0 if finetune == "linear_probe" else 0.05
    config.optim.grad_clip_norm = 1.0
    config.optim.layer_decay = args["layer_decay"] if args["mode"] == "full" else 1.0

    config.train = default_train_config()
    config.train.steps = args["steps"]
    config.train.batch_size = 64
    config.train.eval_batch_size = 360
    config.train.seed = args["seed"]
    config.train.log_every = 100
    config.train.eval_every = 0
    config.train.checkpoint_every = 0
    config.train.finetune = finetune
    if finetune == "lora":
        config.lora = default_lora_config()
        config.lora.rank = args["rank"]
        config.lora.alpha = 2.0 * args["rank"]
    return config
