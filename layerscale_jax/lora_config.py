"""The ``config.lora`` section of an experiment config (``train.finetune='lora'``; ``layerscale_jax.lora`` adds the
adapters): its fields, defaults and checks. No jax: config files and the command line's checks read it first.
"""
from __future__ import annotations

import dataclasses
import math
import re

from layerscale_jax.errors import ConfigError
from layerscale_jax.settings import Section, boolean, integer, number, patterns

LORA_DEFAULT_TARGETS = (r"blocks/\d+/attn/(qkv|proj)/kernel", r"blocks/\d+/mlp/(fc1|fc2)/kernel")


@dataclasses.dataclass(frozen=True)
class LoraSettings(Section):
    """``config.lora`` (used when ``train.finetune='lora'``), checked when it is made:

    rank              r ≥ 1, at most min(d_in, d_out) of every adapted layer.
    alpha             α > 0; the update is scaled by α / r.
    dropout           dropout rate on the adapter's input, in [0, 1) (train mode only).
    targets           regexes ``re.fullmatch``ed against kernel paths such as 'blocks/3/attn/qkv/kernel'; each
                      must match at least one dense layer.
    train_head        also train the classifier head (a new head needs it).
    train_norms       also train every LayerNorm (scale and bias).
    train_layerscale  also train LayerScale's λ (and scalar gates).
    """
    PREFIX = "lora"
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_DEFAULT_TARGETS
    train_head: bool = True
    train_norms: bool = False
    train_layerscale: bool = False

    def __post_init__(self):
        integer("lora.rank", self.rank, 1)
        self._set("alpha", number("lora.alpha", self.alpha, 0.0, math.inf, low_open=True))
        self._set("dropout", number("lora.dropout", self.dropout, 0.0, 1.0, high_open=True))
        self._set("targets", patterns("lora.targets", self.targets))
        if not self.targets:
            raise ConfigError("lora.targets is empty: give at least one regex over kernel paths")
        for pattern in self.targets:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ConfigError(f"lora.targets regex {pattern!r} does not compile: {err}") from None
        for field in ("train_head", "train_norms", "train_layerscale"):
            boolean(f"lora.{field}", getattr(self, field))


def default_lora_config():
    """``config.lora``'s defaults as the ``ConfigDict`` a config file starts from (fields: ``LoraSettings``)."""
    return LoraSettings().to_config()


def validate_lora_config(config) -> LoraSettings:
    """``config.lora`` (a ``ConfigDict``, a mapping or ``LoraSettings``) as ``LoraSettings``; raises
    ``ConfigError`` naming the field and value for anything wrong."""
    return LoraSettings.of(config)
