"""What a config file (``configs/*.py``) imports besides ``ml_collections``: each section's defaults, and the
parser of the file's argument. Nothing here imports jax, so loading a config (and the command line's checks of it)
takes a fraction of a second and a mistake is reported before jax starts.

    config.model = model_section("deit3_small_patch16_224", depth=24)     # the registry name, every field
    config.data = default_data_config("digits")                            # layerscale_jax.data.config
    config.optim = default_optim_config()                                  # layerscale_jax.optim.config
    config.train = default_train_config()                                  # layerscale_jax.train.config
    config.lora = default_lora_config()                                    # layerscale_jax.lora_config
    args = parse_config_arg(arg, {"depth": 4, "lr": 2e-2})                 # 'file.py:depth=8,lr=1e-3'

Every field, its default and its meaning is documented in the module named beside it.
"""
from layerscale_jax.data.config import default_data_config, use_sharded_input
from layerscale_jax.optim.config import default_config as default_optim_config
from layerscale_jax.lora_config import default_lora_config
from layerscale_jax.train.config import default_train_config, model_section, parse_config_arg

__all__ = ["default_data_config", "default_lora_config", "default_optim_config", "default_train_config",
           "model_section", "parse_config_arg", "use_sharded_input"]
