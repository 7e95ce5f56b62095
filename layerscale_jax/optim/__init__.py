"""Optimizers: layer-wise LR decay in both block layouts, weight-decay and freeze masks, SAM, accumulation, EMA.

    bundle = optim.build(config.optim, model, total_steps=...)   # tx, schedule, masks, table()
    (loss, aux), grads = optim.sam_gradients(f, params, batch, key, rho=...)
    (loss, aux), grads = optim.accumulate_gradients(f, params, batch, k, key=key)
    ema = optim.ema_update(ema, params, decay)

Every config field is documented in ``layerscale_jax.optim.config``. The names below load on first use, so the
config module (its defaults and checks) is read without jax or optax.
"""
from layerscale_jax.lazy import lazy_names

_SOURCES = {
    "GroupRow": ".bundle", "OptimizerBundle": ".bundle", "build": ".bundle", "default_config": ".config",
    "OptimSettings": ".config",
    "validate_config": ".config", "ema_update": ".ema", "accumulate_gradients": ".gradients",
    "sam_gradients": ".gradients", "layer_decay_scales": ".param_rules", "trainable_mask": ".param_rules",
    "weight_decay_mask": ".param_rules", "make_schedule": ".schedules",
}
__all__ = list(_SOURCES)

__getattr__, __dir__ = lazy_names(__name__, globals(), _SOURCES)
