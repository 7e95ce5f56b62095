"""A LayerScale ViT over MNIST-1D's 1-D signals (offline, generated on first use; `layerscale_jax.data.mnist1d`).

    python -m layerscale_jax.train --config configs/mnist1d_layerscale.py --workdir /tmp/mnist1d

The argument selects variants, e.g. ``configs/mnist1d_layerscale.py:depth=48,branch_scaling=none`` (keys: depth,
embed_dim, num_heads, patch, branch_scaling, init_values, scan_layers, steps, seed, lr, num_train).

The model is the DeiT III ViT of every other config with 1-D patches (``patch_dims=1``): a 40-sample signal cut
into patches of ``patch`` samples, a class token, average pooling. Recipe: AdamW, batch 64, cosine decay after a
10% warm-up, weight decay 0.05, gradient clipping at 1, label smoothing 0.1, drop path 0.05, the signals as
generated (no augmentation). Splits: ``num_train`` signals to train on, 1,000 validation signals to select on,
10,000 test signals to report (standard error of a test accuracy ≤ 0.5 points).
"""
import ml_collections

from layerscale_jax.config_defaults import (default_data_config, default_optim_config, default_train_config,
                                            model_section, parse_config_arg)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = parse_config_arg(arg, {"depth": 6, "embed_dim": 32, "num_heads": 2, "patch": 4,
                                  "branch_scaling": "layerscale", "init_values": "auto", "scan_layers": True,
                                  "steps": 1000, "seed": 0, "lr": 5e-3, "num_train": 4000})
    init_values = args["init_values"] if args["init_values"] == "auto" else float(args["init_values"])
    config = ml_collections.ConfigDict()
    config.data = default_data_config("mnist1d")
    config.data.mnist1d.num_train = args["num_train"]
    config.data.mnist1d.num_validation = 1000
    config.data.mnist1d.num_test = 10000
    config.data.label_smoothing = 0.1

    config.model = model_section(
        "deit3_small_patch16_224", patch_dims=1, img_size=config.data.image_size, patch_size=args["patch"],
        in_chans=1, num_classes=10, embed_dim=args["embed_dim"], depth=args["depth"], num_heads=args["num_heads"],
        branch_scaling=args["branch_scaling"], init_values=init_values, drop_path_rate=0.05, global_pool="avg",
        scan_layers=args["scan_layers"])

    config.optim = default_optim_config()
    config.optim.name = "adamw"
    config.optim.learning_rate = args["lr"]
    config.optim.warmup_steps = args["steps"] // 10
    config.optim.schedule = "cosine"
    config.optim.weight_decay = 0.05
    config.optim.grad_clip_norm = 1.0

    config.train = default_train_config()
    config.train.steps = args["steps"]
    config.train.batch_size = 64
    config.train.eval_batch_size = 1000
    config.train.seed = args["seed"]
    config.train.log_every = 100
    config.train.eval_every = 250
    config.train.checkpoint_every = 500
    return config
