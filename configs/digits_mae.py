"""MAE pre-training (He et al. 2021) of the digits LayerScale ViT's encoder, on the offline `digits` dataset.

    python -m layerscale_jax.train --config configs/digits_mae.py --workdir /tmp/digits_mae

The encoder is the main job's (``configs/digits_layerscale.py``: depth 4, width 64, 4 heads, patch 2 on 8×8
images, 16 patches); MAE's decoder scaled down to width 32, 2 blocks, 4 heads (MAE: 512, 8, 16 for ViT-B). Mask
ratio 0.75 (4 of 16 patches visible), loss on per-patch normalised pixels of the masked patches (norm_pix_loss).
MAE's optimiser: AdamW β = (0.9, 0.95), weight decay 0.05, cosine with warm-up; its fixed 2-D sin-cos position
embeddings (``optim.freeze``). A PNG of reconstructions is written at each evaluation
(``WORKDIR/reconstructions.png``). Fine-tune the encoder with ``train.init_from=WORKDIR`` (see
``configs/digits_finetune.py``). Argument keys: steps, seed, lr, mask_ratio, scan_layers.
"""
import ml_collections

from layerscale_jax.config_defaults import (default_data_config, default_optim_config, default_train_config,
                                            model_section, parse_config_arg)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    args = parse_config_arg(arg, {"steps": 2000, "seed": 0, "lr": 2e-3, "mask_ratio": 0.75, "scan_layers": False})
    config = ml_collections.ConfigDict()
    config.model = model_section(
        "mae_deit3_small_patch16_224", img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, depth=4,
        num_heads=4, init_values="auto", decoder_embed_dim=32, decoder_depth=2, decoder_num_heads=4,
        mask_ratio=args["mask_ratio"], norm_pix_loss=True, scan_layers=args["scan_layers"])

    config.data = default_data_config("digits")
    config.data.augment.crop_padding = 0          # as the classifier's recipe: no translation of 8×8 digits

    config.optim = default_optim_config()
    config.optim.name = "adamw"
    config.optim.learning_rate = args["lr"]
    config.optim.b1, config.optim.b2 = 0.9, 0.95
    config.optim.weight_decay = 0.05
    config.optim.schedule = "cosine"
    config.optim.warmup_steps = args["steps"] // 20
    config.optim.grad_clip_norm = 0.0
    config.optim.freeze = ("pos_embed", "decoder_pos_embed")   # MAE's fixed sin-cos tables

    config.train = default_train_config()
    config.train.steps = args["steps"]
    config.train.batch_size = 128
    config.train.eval_batch_size = 360
    config.train.seed = args["seed"]
    config.train.log_every = 100
    config.train.eval_every = 500
    config.train.checkpoint_every = 500
    return config
