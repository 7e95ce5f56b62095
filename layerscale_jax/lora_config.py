"""The ``config.lora`` section of an experiment config (``train.finetune='lora'``; ``layerscale_jax.lora`` adds the
adapters): its fields, defaults and checks. No jax: config files and the command line's checks read it first.
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from layerscale_jax.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    import ml_collections

LORA_DEFAULT_TARGETS = (r"blocks/\d+/attn/(qkv|proj)/kernel", r"blocks/\d+/mlp/(fc1|fc2)/kernel")


def default_lora_config() -> ml_collections.ConfigDict:
    """``config.lora`` (used when ``train.finetune='lora'``):

    rank              r ≥ 1, at most min(d_in, d_out) of every adapted layer.
    alpha             α > 0; the update is scaled by α / r.
    dropout           dropout rate on the adapter's input, in [0, 1) (train mode only).
    targets           regexes ``re.fullmatch``ed against kernel paths such as 'blocks/3/attn/qkv/kernel'; each
                      must match at least one dense layer.
    train_head        also train the classifier head (a new head needs it).
    train_norms       also train every LayerNorm (scale and bias).
    train_layerscale  also train LayerScale's λ (and scalar gates).
    """
    import ml_collections  # imported here: the LoRA code runs without it (e.g. on a bare GPU machine)
    return ml_collections.ConfigDict(dict(rank=8, alpha=16.0, dropout=0.0, targets=LORA_DEFAULT_TARGETS,
                                          train_head=True, train_norms=False, train_layerscale=False))


def lora_targets(targets) -> tuple[str, ...]:
    """``lora.targets`` as a tuple of regexes (a single string is one regex)."""
    return (targets,) if isinstance(targets, str) else tuple(targets or ())


def validate_lora_config(config) -> None:
    """Raise ``ConfigError`` naming the field and value for anything wrong in ``config.lora``."""
    known = set(default_lora_config().keys())
    unknown = sorted(set(config.keys()) - known)
    if unknown:
        listed = ", ".join(f"lora.{key}{did_you_mean(key, known)}" for key in unknown)
        raise ConfigError(f"unknown config field(s) {listed}; valid fields of lora: {', '.join(sorted(known))}")
    rank = config.get("rank", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"lora.rank={rank!r} must be a positive integer")
    alpha = config.get("alpha", 16.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ConfigError(f"lora.alpha={alpha!r} must be a finite number > 0")
    dropout = config.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ConfigError(f"lora.dropout={dropout!r} must lie in [0, 1)")
    targets = lora_targets(config.get("targets", LORA_DEFAULT_TARGETS))
    if not targets:
        raise ConfigError("lora.targets is empty: give at least one regex over kernel paths")
    for pattern in targets:
        if not isinstance(pattern, str):
            raise ConfigError(f"lora.targets entry {pattern!r} must be a regex string")
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigError(f"lora.targets regex {pattern!r} does not compile: {err}") from None
    for field in ("train_head", "train_norms", "train_layerscale"):
        if not isinstance(config.get(field, False), bool):
            raise ConfigError(f"lora.{field}={config.get(field)!r} must be a bool")
