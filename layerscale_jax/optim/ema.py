"""An exponential moving average of the parameters, for evaluation (Polyak averaging).

    ema ← d · ema + (1 − d) · w        (computed in float32, stored in the EMA's dtype)

Start it as a copy of the parameters (``jax.tree.map(jnp.copy, params)``) and update it after every optimizer step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from layerscale_jax.errors import ConfigError


def ema_update(ema_params, params, decay):
    """One EMA step; ``decay`` may be a Python number in [0, 1] or a traced scalar."""
    if isinstance(decay, (int, float)) and not 0.0 <= decay <= 1.0:
        raise ConfigError(f"ema_decay={decay!r} must lie in [0, 1]")

    # Not optax.incremental_update: its (1 − d)·w + (1 − (1 − d))·e fuses into other FMAs under jit (not bit for bit)
    def update(e, w):
        new = decay * e.astype(jnp.float32) + (1.0 - decay) * w.astype(jnp.float32)
        return new.astype(e.dtype)

    return jax.tree.map(update, ema_params, params)
