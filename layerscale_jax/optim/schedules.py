"""Learning-rate schedules, per optimizer step: linear warmup from 0, then cosine / linear decay or constant.

    warmup (t < W):     lr(t) = peak · t / W
    cosine (t ≥ W):     lr(t) = end + (peak − end) · ½ (1 + cos(π · (t − W) / (T − W)))
    linear (t ≥ W):     lr(t) = peak + (end − peak) · (t − W) / (T − W)
    constant (t ≥ W):   lr(t) = peak
(T = ``total_steps``; the rate stays at ``end`` after T.)
"""
from __future__ import annotations

import optax

from layerscale_jax.optim.config import validate_config


def make_schedule(config, total_steps: int) -> optax.Schedule:
    """The schedule ``step → learning rate`` of an optimizer section (``OptimSettings``, or a config made one)."""
    config = validate_config(config, total_steps)
    peak, end, warmup = float(config.learning_rate), float(config.end_learning_rate), int(config.warmup_steps)
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total_steps, end_value=end)
    rest = total_steps - warmup
    if config.schedule == "linear":
        after = optax.linear_schedule(peak, end, rest)
    else:
        after = optax.constant_schedule(peak)
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])
