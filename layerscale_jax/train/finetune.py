"""Fine-tuning modes, chosen by ``config.train.finetune``:

    full          every parameter trains (with ``optim.layer_decay`` for MAE/BEiT-style fine-tuning).
    lora          LoRA adapters (``layerscale_jax.lora``, configured by the optional ``config.lora`` section,
                  defaults ``lora_config.default_lora_config()``) are added to the model; the base is frozen (zero
                  updates, no optimizer state), the adapters and, by ``lora.train_head`` / ``train_norms`` /
                  ``train_layerscale``, the head, the LayerNorms and LayerScale's λ train.
    linear_probe  only the classifier head trains.

The pre-trained weights come from ``train.init_from`` (our checkpoint or training workdir, a converted or raw timm
checkpoint, or an MAE pre-training run, whose encoder is loaded and whose decoder is dropped). The frozen set is
expressed as ``optim.freeze`` regexes added to the user's own, so layer decay (whose depth always comes from the
full model's layer groups), weight decay and the trainable mask are the optimizer's usual machinery.
"""
from __future__ import annotations

import copy

import jax
import ml_collections
from flax import nnx

from layerscale_jax import lora as lora_lib
from layerscale_jax.optim.config import freeze_patterns
from layerscale_jax.lora_config import default_lora_config

LORA_INIT_STREAM = 2          # adapters are initialised from fold_in(key(train.seed), LORA_INIT_STREAM)


def lora_section(config) -> ml_collections.ConfigDict:
    """``config.lora`` over ``lora_config.default_lora_config()`` (the section is optional)."""
    section = default_lora_config()
    if "lora" in config:
        section.update(config.lora.to_dict() if hasattr(config.lora, "to_dict") else dict(config.lora))
    return section


def add_adapters(config, model: nnx.Module, seed: int) -> nnx.Module:
    """``model`` with the LoRA adapters of ``config`` (in place) when ``train.finetune='lora'``."""
    if config.train.get("finetune", "full") == "lora":
        key = jax.random.fold_in(jax.random.key(seed), LORA_INIT_STREAM)
        lora_lib.apply_config(model, lora_section(config), rngs=nnx.Rngs(params=key))
    return model


def frozen(config, model: nnx.Module) -> tuple[str, ...]:
    """The ``optim.freeze`` regexes of the fine-tuning mode (before the user's own)."""
    mode = config.train.get("finetune", "full")
    if mode == "lora":
        section = lora_section(config)
        return lora_lib.frozen_patterns(model, train_head=section.train_head, train_norms=section.train_norms,
                                        train_layerscale=section.train_layerscale)
    if mode == "linear_probe":
        return lora_lib.linear_probe_patterns()
    return ()


def optim_config(config, model: nnx.Module) -> ml_collections.ConfigDict:
    """``config.optim`` with the fine-tuning mode's frozen parameters added to ``optim.freeze``."""
    extra = frozen(config, model)
    if not extra:
        return config.optim
    result = copy.deepcopy(config.optim)
    with result.unlocked():
        result.freeze = tuple(freeze_patterns(config.optim)) + tuple(extra)
    return result


def describe(config, model: nnx.Module, optim_cfg) -> str:
    """One line for the log: the mode and trainable vs total parameters."""
    mode = config.train.get("finetune", "full")
    return f"fine-tuning mode {mode}: " + lora_lib.summary(model, freeze_patterns(optim_cfg))
