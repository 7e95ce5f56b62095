"""MAE pre-training (He et al., "Masked Autoencoders Are Scalable Vision Learners", 2021) of a DeiT III
(LayerScale) encoder on ImageNet-1k, with the paper's pre-training hyper-parameters (its Table 8 / PRETRAIN.md):

    AdamW β = (0.9, 0.95), weight decay 0.05, base lr 1.5e-4 × batch / 256 (batch 4096: 2.4e-3), cosine decay,
    40 warm-up epochs, 800 epochs (1600 for the paper's best numbers), mask ratio 0.75, norm_pix_loss,
    RandomResizedCrop (scale 0.2–1) and horizontal flip only; decoder 512 wide, 8 blocks, 16 heads; fixed 2-D
    sin-cos position embeddings (``optim.freeze``). No drop path, no gradient clipping.

    python -m layerscale_jax.train --config configs/imagenet_mae.py:variant=B --workdir gs://BUCKET/mae_b
    python -m layerscale_jax.train --config configs/finetune_deit3_small.py:dataset=imagenet2012 \
        --config.model.name=deit3_base_patch16_224 --config.train.init_from=gs://BUCKET/mae_b ...

LayerScale: ε = 1e-4, the official DeiT III training value (timm's checkpoints record 1e-6). Argument keys: variant
(B | L | H), epochs, batch_size, scan_layers, dtype.
"""
import ml_collections

from layerscale_jax.config_defaults import (default_data_config, default_optim_config, default_train_config,
                                            model_section, parse_config_arg, use_sharded_input)

VARIANTS = {"B": "mae_deit3_base_patch16_224", "L": "mae_deit3_large_patch16_224",
            "H": "mae_deit3_huge_patch14_224"}
IMAGENET_TRAIN_EXAMPLES = 1_281_167


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    # Unrolled layers: on v5p-128 the scanned B step needs 8.36 GiB per chip against 5.82 and its step time's lower
    # bound is 17.2 ms against 14.8 ms (`python benchmarks/compile_recipes.py`, docs/multihost.md).
    args = parse_config_arg(arg, {"variant": "B", "epochs": 800, "batch_size": 4096, "scan_layers": False,
                                  "dtype": "bfloat16", "workers": 8})
    if args["variant"] not in VARIANTS:
        raise ValueError(f"variant={args['variant']!r} is not one of {sorted(VARIANTS)}")
    config = ml_collections.ConfigDict()
    config.model = model_section(VARIANTS[args["variant"]], init_values=1e-4, mask_ratio=0.75, norm_pix_loss=True,
                                 decoder_embed_dim=512, decoder_depth=8, decoder_num_heads=16,
                                 scan_layers=args["scan_layers"], dtype=args["dtype"])

    config.data = default_data_config("imagenet2012")
    use_sharded_input(config.data, args["workers"])
    config.data.image_size = 224
    config.data.augment.random_resized_crop = True
    config.data.augment.crop_scale = (0.2, 1.0)
    config.data.augment.crop_padding = 0
    config.data.augment.hflip = True
    config.data.mixup_alpha = 0.0
    config.data.cutmix_alpha = 0.0
    config.data.label_smoothing = 0.0

    batch = args["batch_size"]
    steps_per_epoch = IMAGENET_TRAIN_EXAMPLES // batch
    config.optim = default_optim_config()
    config.optim.name = "adamw"
    config.optim.learning_rate = 1.5e-4 * batch / 256
    config.optim.b1, config.optim.b2 = 0.9, 0.95
    config.optim.weight_decay = 0.05
    config.optim.schedule = "cosine"
    config.optim.warmup_steps = 40 * steps_per_epoch
    config.optim.grad_clip_norm = 0.0
    config.optim.freeze = ("pos_embed", "decoder_pos_embed")

    config.train = default_train_config()
    config.train.steps = args["epochs"] * steps_per_epoch
    config.train.batch_size = batch
    config.train.eval_batch_size = 1024
    config.train.log_every = 100
    config.train.eval_every = 20 * steps_per_epoch
    config.train.checkpoint_every = 2000
    config.train.mesh.data = 1
    config.train.mesh.fsdp = -1
    return config
