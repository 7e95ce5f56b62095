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

import dataclasses

import jax
from flax import nnx

from layerscale_jax import lora as lora_lib
from layerscale_jax.lora_config import LoraSettings
from layerscale_jax.optim.config import OptimSettings

LORA_INIT_STREAM = 2          # adapters are initialised from fold_in(key(train.seed), LORA_INIT_STREAM)


def add_adapters(lora: LoraSettings | None, model: nnx.Module, seed: int) -> nnx.Module:
    """``model`` with the LoRA adapters of ``lora`` (in place; ``Experiment.lora``: set when
    ``train.finetune='lora'``)."""
    if lora is not None:
        key = jax.random.fold_in(jax.random.key(seed), LORA_INIT_STREAM)
        lora_lib.apply_config(model, lora, rngs=nnx.Rngs(params=key))
    return model


def frozen(mode: str, lora: LoraSettings | None, model: nnx.Module) -> tuple[str, ...]:
    """The ``optim.freeze`` regexes of the fine-tuning mode ``train.finetune`` (before the user's own)."""
    if mode == "lora":
        return lora_lib.frozen_patterns(model, train_head=lora.train_head, train_norms=lora.train_norms,
                                        train_layerscale=lora.train_layerscale)
    if mode == "linear_probe":
        return lora_lib.linear_probe_patterns()
    return ()


def optim_settings(experiment, model: nnx.Module) -> OptimSettings:
    """The experiment's optimizer section with the fine-tuning mode's frozen parameters added to ``optim.freeze``."""
    extra = frozen(experiment.train.finetune, experiment.lora, model)
    optim = experiment.optim
    return dataclasses.replace(optim, freeze=optim.freeze + tuple(extra)) if extra else optim


def describe(mode: str, model: nnx.Module, optim: OptimSettings) -> str:
    """One line for the log: the mode and trainable vs total parameters."""
    return f"fine-tuning mode {mode}: " + lora_lib.summary(model, optim.freeze)
