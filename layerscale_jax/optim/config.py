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

import dataclasses
import math

from layerscale_jax.errors import ConfigError
from layerscale_jax.settings import Section, boolean, choice, integer, number, patterns

OPTIMIZERS = ("adamw", "lamb", "sgd")
SCHEDULES = ("cosine", "linear", "constant")
CONVENTIONS = ("mae", "timm")

# field → the interval it lies in: (low, high, low_open, high_open)
_INTERVALS = {"learning_rate": (0.0, math.inf, True, False), "end_learning_rate": (0.0, math.inf, False, False),
              "b1": (0.0, 1.0, False, True), "b2": (0.0, 1.0, False, True), "eps": (0.0, math.inf, False, False),
              "momentum": (0.0, 1.0, False, True), "weight_decay": (0.0, math.inf, False, False),
              "grad_clip_norm": (0.0, math.inf, False, False), "layer_decay": (0.0, 1.0, True, False),
              "layer_decay_min_scale": (0.0, 1.0, False, False), "sam_rho": (0.0, math.inf, False, False),
              "sam_eta": (0.0, math.inf, False, False), "ema_decay": (0.0, 1.0, False, True)}


@dataclasses.dataclass(frozen=True)
class OptimSettings(Section):
    """The optimizer section, checked when it is made (see the module doc for every field)."""
    PREFIX = "optim"
    name: str = "adamw"
    learning_rate: float = 1e-3
    schedule: str = "cosine"
    warmup_steps: int = 0
    end_learning_rate: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    momentum: float = 0.9
    weight_decay: float = 0.05
    grad_clip_norm: float = 1.0
    layer_decay: float = 1.0
    layer_decay_convention: str = "mae"
    layer_decay_min_scale: float = 0.0
    freeze: tuple[str, ...] = ()
    sam_rho: float = 0.0
    sam_adaptive: bool = False
    sam_eta: float = 0.01
    accum_steps: int = 1
    ema_decay: float = 0.0

    def __post_init__(self):
        choice("optim.name", self.name, OPTIMIZERS)
        choice("optim.schedule", self.schedule, SCHEDULES)
        choice("optim.layer_decay_convention", self.layer_decay_convention, CONVENTIONS)
        for field, (low, high, low_open, high_open) in _INTERVALS.items():
            self._set(field, number(f"optim.{field}", getattr(self, field), low, high, low_open=low_open,
                                    high_open=high_open))
        if self.end_learning_rate > self.learning_rate:
            raise ConfigError(f"optim.end_learning_rate={self.end_learning_rate!r} exceeds "
                              f"optim.learning_rate={self.learning_rate!r}")
        if boolean("optim.sam_adaptive", self.sam_adaptive) and self.sam_rho == 0:
            raise ConfigError("optim.sam_adaptive=True needs optim.sam_rho > 0")
        integer("optim.warmup_steps", self.warmup_steps, 0)
        integer("optim.accum_steps", self.accum_steps, 1)
        self._set("freeze", patterns("optim.freeze", self.freeze))

    def check_steps(self, total_steps: int) -> OptimSettings:
        """Refuse a warm-up that leaves the decaying schedule no step of ``total_steps``; returns ``self``."""
        integer("total_steps", total_steps, 1)
        if self.warmup_steps > total_steps or (self.schedule != "constant" and self.warmup_steps == total_steps):
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps} leaves no room for the {self.schedule!r} "
                              f"schedule in total_steps={total_steps}")
        return self


def default_config():
    """The optimizer defaults (AdamW, cosine, wd 0.05, clip 1.0, everything optional off) as the ``ConfigDict`` a
    config file starts from; see the module doc."""
    return OptimSettings().to_config()


def validate_config(config, total_steps: int | None = None) -> OptimSettings:
    """The optimizer section ``config`` (a ``ConfigDict``, a mapping or ``OptimSettings``) as ``OptimSettings``,
    checked against ``total_steps`` when given; raises ``ConfigError`` (a ``ValueError``) naming the field for
    anything wrong (unknown fields are refused, so a typo never silently falls back to a default)."""
    settings = OptimSettings.of(config)
    return settings if total_steps is None else settings.check_steps(total_steps)
