"""Every experiment config builds its model and optimizer abstractly; command-line overrides parse."""
import glob
import importlib.util
import os

import pytest
from flax import nnx

from layerscale_jax import optim
from layerscale_jax.models import create_model
from layerscale_jax.train.__main__ import parse_command_line
from layerscale_jax.train.config import model_overrides, parse_config_arg, validate_experiment_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))
VARIANTS = {
    "imagenet_deit3.py": ["variant=S", "variant=B", "variant=L", "variant=H"],
    "imagenet_cait.py": ["variant=xxs24", "variant=s36", "variant=m48"],
    "finetune_deit3_small.py": ["dataset=cifar10", "dataset=imagenet2012,convention=timm"],
    "digits_layerscale.py": [None, "depth=24,branch_scaling=none,scan_layers=true"],
    "digits_mae.py": [None, "mask_ratio=0.5,scan_layers=true"],
    "digits_finetune.py": ["mode=full", "mode=lora,rank=8", "mode=linear_probe", "mode=scratch"],
    "imagenet_mae.py": ["variant=B", "variant=H,epochs=1600"],
    "mnist1d_layerscale.py": [None, "depth=48,branch_scaling=none,num_train=2000"],
}


def load(path, arg):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


CASES = [(path, arg) for path in CONFIG_FILES for arg in VARIANTS.get(os.path.basename(path), [None])]


@pytest.mark.slow
@pytest.mark.parametrize("path,arg", CASES, ids=[f"{os.path.basename(p)}:{a}" for p, a in CASES])
def test_config_builds_model_and_optimizer_abstractly(path, arg):
    config = load(path, arg)
    validate_experiment_config(config)
    model = nnx.eval_shape(lambda: create_model(config.model.name, rngs=nnx.Rngs(0),
                                                **model_overrides(config.model)))
    bundle = optim.build(config.optim, model, total_steps=config.train.steps)
    assert callable(bundle.schedule)
    for section in ("model", "data", "optim", "train"):
        assert section in config


def test_every_config_file_is_covered():
    assert {os.path.basename(p) for p in CONFIG_FILES} <= set(VARIANTS)


def _parse(argv):
    """Parse ``argv`` (with the program name) as ``python -m layerscale_jax.train`` does."""
    return parse_command_line(argv[1:] + ["--workdir", "unused"])


def test_command_line_overrides_reach_the_config():
    path = os.path.join(ROOT, "configs", "digits_layerscale.py")
    flag_values = _parse([
        "prog", f"--config={path}:depth=3", "--config.train.steps=70", "--config.optim.learning_rate=0.01",
        "--config.model.branch_scaling=rezero"])
    config = flag_values.config
    assert (config.model.depth, config.train.steps, config.optim.learning_rate) == (3, 70, 0.01)
    assert config.model.branch_scaling == "rezero"


def test_unknown_override_field_is_rejected():
    path = os.path.join(ROOT, "configs", "digits_layerscale.py")
    with pytest.raises(Exception, match="no_such_field"):
        _parse(["prog", f"--config={path}", "--config.train.no_such_field=1"])


def test_config_argument_names_the_bad_key():
    with pytest.raises(ValueError, match=r"config argument key 'detph'"):
        parse_config_arg("detph=3", {"depth": 6})
