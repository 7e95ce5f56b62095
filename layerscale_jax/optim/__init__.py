"""Optimizers: layer-wise LR decay in both block layouts, weight-decay and freeze masks, SAM, accumulation, EMA.

    bundle = optim.build(config.optim, model, total_steps=...)   # tx, schedule, masks, table()
    (loss, aux), grads = optim.sam_gradients(f, params, batch, key, rho=...)
    (loss, aux), grads = optim.accumulate_gradients(f, params, batch, k, key=key)
    ema = optim.ema_update(ema, params, decay)

Every config field is documented in ``layerscale_jax.optim.config``.
"""
from layerscale_jax.optim.build import GroupRow, OptimizerBundle, build
from layerscale_jax.optim.config import default_config, validate_config
from layerscale_jax.optim.ema import ema_update
from layerscale_jax.optim.gradients import accumulate_gradients, sam_gradients
from layerscale_jax.optim.param_rules import layer_decay_scales, trainable_mask, weight_decay_mask
from layerscale_jax.optim.schedules import make_schedule

__all__ = ["GroupRow", "OptimizerBundle", "build", "default_config", "validate_config", "ema_update",
           "accumulate_gradients", "sam_gradients", "layer_decay_scales", "trainable_mask", "weight_decay_mask",
           "make_schedule"]
