"""The default main job: a LayerScale ViT trained on `digits` (offline, 8×8 grayscale) on a CPU in minutes.

    python -m layerscale_jax.train --config configs/digits_layerscale.py --workdir /tmp/digits

The argument selects ablation variants, e.g. ``configs/digits_layerscale.py:depth=24,branch_scaling=none``
(keys: depth, embed_dim, num_heads, branch_scaling, init_values, scan_layers, steps, seed, lr, global_pool).

Recipe (tuned for ≥ 97% test accuracy in well under 5 minutes on a 2-core CPU): depth 4, width 64, patch 2,
average pooling, 1000 AdamW steps of batch 64 (~44 epochs) at a high peak lr (2e-2, 30 warmup steps, cosine),
label smoothing 0.1, drop path 0.05, no random translation. Deeper ablations may want a lower ``lr=``.
"""
import ml_collections

from layerscale_jax.config_defaults import (default_data_config, default_optim_config, default_train_config,
                                            model_section, parse_config_arg)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = parse_config_arg(arg, {"depth": 4, "embed_dim": 64, "num_heads": 4, "branch_scaling": "layerscale",
                                  "init_values": "auto", "scan_layers": False, "steps": 1000, "seed": 0, "lr": 2e-2,
                                  "global_pool": "avg"})
    init_values = args["init_values"] if args["init_values"] == "auto" else float(args["init_values"])
    config = ml_collections.ConfigDict()
    config.model = model_section(
        "deit3_small_patch16_224", img_size=8, patch_size=2, in_chans=1, num_classes=10,
        embed_dim=args["embed_dim"], depth=args["depth"], num_heads=args["num_heads"],
        branch_scaling=args["branch_scaling"], init_values=init_values, drop_path_rate=0.05,
        global_pool=args["global_pool"], scan_layers=args["scan_layers"])

    config.data = default_data_config("digits")
    config.data.label_smoothing = 0.1
    # No random translation: a 1-px shift of an 8×8 digit moves it by half a 2×2 patch and slowed learning ~3×
    # (300 steps: 48% with it, 82% without); the short, high-lr run below needs every step to count.
    config.data.augment.crop_padding = 0

    config.optim = default_optim_config()
    config.optim.name = "adamw"
    config.optim.learning_rate = args["lr"]
    config.optim.warmup_steps = 30
    config.optim.schedule = "cosine"
    config.optim.weight_decay = 0.05
    config.optim.grad_clip_norm = 1.0

    config.train = default_train_config()
    config.train.steps = args["steps"]
    config.train.batch_size = 64
    config.train.eval_batch_size = 360
    config.train.seed = args["seed"]
    config.train.log_every = 100
    config.train.eval_every = 250
    config.train.checkpoint_every = 500
    return config
