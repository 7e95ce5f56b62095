"""A seconds-long training run on synthetic data for the train-loop tests (and a quick smoke run)."""
import ml_collections

from layerscale_jax.config_defaults import (default_data_config, default_optim_config, default_train_config,
                                            model_section, parse_config_arg)


def get_config(arg=None):
    args = parse_config_arg(arg, {"scan_layers": False, "steps": 6})
    config = ml_collections.ConfigDict()
    config.model = model_section("deit3_small_patch16_224", img_size=8, patch_size=4, in_chans=3, num_classes=4,
                                 embed_dim=16, depth=2, num_heads=2, drop_path_rate=0.1, init_values=0.1,
                                 scan_layers=args["scan_layers"])
    config.data = default_data_config("synthetic")
    config.data.image_size = 8
    config.data.num_classes = 4
    config.data.num_train = 256
    config.data.num_test = 40
    config.data.prefetch = 0
    config.data.mixup_alpha = 0.8
    config.data.cutmix_alpha = 1.0
    config.optim = default_optim_config()
    config.optim.learning_rate = 1e-3
    config.optim.warmup_steps = 2
    config.train = default_train_config()
    config.train.steps = args["steps"]
    config.train.batch_size = 16
    config.train.eval_batch_size = 16
    config.train.log_every = 1
    config.train.eval_every = 0
    config.train.checkpoint_every = 2
    config.train.compilation_cache_dir = ""      # tests keep the session's cache (tests/conftest.py)
    return config
