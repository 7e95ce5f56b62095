"""The optimizer config: every field, its default and its meaning, in one place; and its validation.

Fields (``default_config()``; override any of them from the command line, e.g. ``--config.optim.layer_decay=0.65``):

    name                    'adamw' | 'lamb' | 'sgd'. AdamW and LAMB use decoupled weight decay scaled by the
                            parameter's learning rate (torch AdamW: ``w ← w − lr·s·(m̂/(√v̂+eps) + wd·w)``);
                            LAMB applies the per-tensor trust ratio ‖w‖/‖u‖ (per layer for stacked params) to
                            the tensors with weight decay, as timm's Lamb does when weight_decay > 0 (with
                            weight_decay = 0 timm adapts nothing; we still adapt the kernels); SGD is torch's SGD
                            (L2 ``wd·w`` added to the gradient, then heavy-ball momentum, no dampening/Nesterov).
    learning_rate           peak learning rate (after warmup), > 0 and finite (every number here must be finite).
    schedule                'cosine' | 'linear' | 'constant': the shape after warmup, per optimizer step.
    warmup_steps            linear warmup from 0 to ``learning_rate`` over this many steps (0 = none; with
                            warmup the first step has lr 0, as optax / big_vision / MAE).
    end_learning_rate       the rate the cosine / linear decay reaches at ``total_steps`` (absolute, ≥ 0).
    b1, b2, eps             Adam moments (AdamW, LAMB).
    momentum                SGD momentum (0 = plain SGD).
    weight_decay            decoupled weight decay (AdamW, LAMB) or L2 (SGD); never on biases, norms, LayerScale
                            λ / scalar gates, position embeddings or class tokens (see ``weight_decay_mask``).
    grad_clip_norm          clip the global gradient norm of the trainable params to this (0 = off).
    layer_decay             layer-wise LR decay: group i trains at ``lr · layer_decay ** (L_max − i)`` (1.0 = off).
    layer_decay_convention  'mae' (final norm and head at 1.0) | 'timm' (final norm joins the last block).
    layer_decay_min_scale   floor on the layer-decay multiplier (0 = none).
    freeze                  regexes, each ``re.fullmatch``ed against '/'-joined unrolled param paths such as
                            'blocks/3/attn/qkv/kernel' (the same names in the scanned layout); matching params
                            get zero updates and, unless only some layers of a stacked param match, no optimizer
                            state. Empty = train everything. Linear probe: ``('(?!head/).*',)``.
    sam_rho                 SAM neighbourhood radius (0 = off); used by the train step via ``sam_gradients``.
    sam_adaptive            ASAM: scale the perturbation elementwise by T_w = |w| + sam_eta (needs sam_rho > 0).
    sam_eta                 ASAM's η ≥ 0 in T_w = |w| + η, applied to kernels and LayerNorm scales (0.01: the
                            default of the paper's official code, SamsungLabs/ASAM); without it a weight that is
                            exactly zero is never perturbed.
    accum_steps             micro-batches per optimizer step (1 = off); used by the train step via
                            ``accumulate_gradients``; must divide the per-step batch. With SAM, each micro-batch
                            is perturbed by its own ε (SAM's m-sharpness with m = batch / accum_steps; Foret et al.
                            §4.1), not by one ε from the accumulated gradient.
    ema_decay               EMA of the parameters for evaluation, ``ema ← d·ema + (1−d)·w`` (0 = off).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from layerscale_jax.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    import ml_collections

OPTIMIZERS = ("adamw", "lamb", "sgd")
SCHEDULES = ("cosine", "linear", "constant")
CONVENTIONS = ("mae", "timm")


def default_config() -> ml_collections.ConfigDict:
    """The optimizer defaults (AdamW, cosine, wd 0.05, clip 1.0, everything optional off); see the module doc."""
    import ml_collections  # imported here: the optimizer code runs without it (e.g. on a bare GPU machine)
    return ml_collections.ConfigDict(dict(
        name="adamw",
        learning_rate=1e-3,
        schedule="cosine",
        warmup_steps=0,
        end_learning_rate=0.0,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        momentum=0.9,
        weight_decay=0.05,
        grad_clip_norm=1.0,
        layer_decay=1.0,
        layer_decay_convention="mae",
        layer_decay_min_scale=0.0,
        freeze=(),
        sam_rho=0.0,
        sam_adaptive=False,
        sam_eta=0.01,
        accum_steps=1,
        ema_decay=0.0,
    ))


def freeze_patterns(config) -> tuple[str, ...]:
    """``config.freeze`` as a tuple of regexes (a single string is one regex)."""
    freeze = config.freeze
    if isinstance(freeze, str):
        return (freeze,) if freeze else ()
    return tuple(freeze or ())


def _number(config, field: str, low: float, high: float, *, low_open=False, high_open=False) -> float:
    value = getattr(config, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"optim.{field}={value!r} must be a number")
    if not math.isfinite(value):
        raise ConfigError(f"optim.{field}={value!r} must be a finite number")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ConfigError(f"optim.{field}={value!r} must lie in {interval}")
    return float(value)


def validate_config(config, total_steps: int | None = None) -> None:
    """Raise ``ValueError`` naming the field for anything wrong in an optimizer config (``default_config()``'s
    fields; unknown fields are rejected so a typo never silently falls back to a default)."""
    known = set(default_config().keys())
    unknown = sorted(set(config.keys()) - known)
    if unknown:
        listed = ", ".join(f"optim.{key}{did_you_mean(key, known)}" for key in unknown)
        raise ConfigError(f"unknown optim option(s) {listed}; valid options: {sorted(known)}")
    missing = sorted(known - set(config.keys()))
    if missing:
        raise ConfigError(f"optim config lacks option(s) {missing}; start from optim.default_config()")
    if config.name not in OPTIMIZERS:
        raise ConfigError(f"optim.name={config.name!r} is not one of {OPTIMIZERS}")
    if config.schedule not in SCHEDULES:
        raise ConfigError(f"optim.schedule={config.schedule!r} is not one of {SCHEDULES}")
    if config.layer_decay_convention not in CONVENTIONS:
        raise ConfigError(f"optim.layer_decay_convention={config.layer_decay_convention!r} is not one of "
                          f"{CONVENTIONS}")
    inf = float("inf")
    lr = _number(config, "learning_rate", 0.0, inf, low_open=True)
    end = _number(config, "end_learning_rate", 0.0, inf)
    if end > lr:
        raise ConfigError(f"optim.end_learning_rate={end!r} exceeds optim.learning_rate={lr!r}")
    _number(config, "b1", 0.0, 1.0, high_open=True)
    _number(config, "b2", 0.0, 1.0, high_open=True)
    _number(config, "eps", 0.0, inf)
    _number(config, "momentum", 0.0, 1.0, high_open=True)
    _number(config, "weight_decay", 0.0, inf)
    _number(config, "grad_clip_norm", 0.0, inf)
    _number(config, "layer_decay", 0.0, 1.0, low_open=True)
    _number(config, "layer_decay_min_scale", 0.0, 1.0)
    _number(config, "sam_rho", 0.0, inf)
    _number(config, "sam_eta", 0.0, inf)
    _number(config, "ema_decay", 0.0, 1.0, high_open=True)
    if not isinstance(config.sam_adaptive, bool):
        raise ConfigError(f"optim.sam_adaptive={config.sam_adaptive!r} must be a bool")
    if config.sam_adaptive and config.sam_rho == 0:
        raise ConfigError("optim.sam_adaptive=True needs optim.sam_rho > 0")
    for field in ("warmup_steps", "accum_steps"):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"optim.{field}={value!r} must be an integer")
    if config.warmup_steps < 0:
        raise ConfigError(f"optim.warmup_steps={config.warmup_steps!r} must be ≥ 0")
    if config.accum_steps < 1:
        raise ConfigError(f"optim.accum_steps={config.accum_steps!r} must be ≥ 1")
    for pattern in freeze_patterns(config):
        if not isinstance(pattern, str):
            raise ConfigError(f"optim.freeze entry {pattern!r} must be a regex string")
    if total_steps is not None:
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ConfigError(f"total_steps={total_steps!r} must be a positive integer")
        decays = config.schedule != "constant"
        if config.warmup_steps > total_steps or (decays and config.warmup_steps == total_steps):
            raise ConfigError(f"optim.warmup_steps={config.warmup_steps} leaves no room for the "
                              f"{config.schedule!r} schedule in total_steps={total_steps}")
