"""Pretrained weights: timm / official DeiT III and CaiT checkpoints in and out, and our own orbax param
checkpoints for ``config.init_from``.

    model = from_timm("deit3_small_patch16_224", "deit3_small.safetensors", num_classes=100, scan_layers=True)
    load_pretrained(model, "runs/converted")          # in place; a timm file, a save_pretrained dir or a workdir
    model, name = load_workdir("runs/digits")          # the model of a training run, its newest checkpoint
    save_pretrained(model, "runs/converted")          # params/ (orbax) + model.json
    state_dict = to_timm(model)                       # timm names and layouts, numpy

Command line: ``python -m layerscale_jax.convert --help``.
"""
from layerscale_jax.convert.files import read_state_dict, write_state_dict
from layerscale_jax.convert.matching import resize_pos_embed
from layerscale_jax.convert.pretrained import (
                                               from_timm,
                                               load_model,
                                               load_pretrained,
                                               load_workdir,
                                               save_pretrained,
                                               to_timm,
)
from layerscale_jax.convert.sources import read_model_json, saved_config
from layerscale_jax.convert.workdir import is_training_workdir

__all__ = ["from_timm", "is_training_workdir", "load_model", "load_pretrained", "load_workdir", "read_model_json",
           "read_state_dict", "resize_pos_embed", "save_pretrained", "saved_config", "to_timm", "write_state_dict"]
