"""One config path: config files and the checks of a config import no jax, and a config is validated once, where it
enters, into the architecture config the trainer builds."""
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import ml_collections
import pytest

from layerscale_jax import arch as arch_lib
from layerscale_jax.models import create_model
from layerscale_jax.models.registry import create_from_config
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train.config import Experiment, validate_experiment_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "configs", "tiny_synthetic.py")
HEAVY = ["jax", "jaxlib", "flax", "optax", "orbax", "tensorflow", "grain"]
# A config file's module-level table of choices → the argument key that picks one.
CHOICE_TABLES = {"MODES": "mode", "VARIANTS": "variant", "DATASETS": "dataset"}


def config_specs() -> list[str]:
    """Every config file, without an argument and with each choice of its choice-valued argument."""
    specs = []
    for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if not name.endswith(".py"):
            continue
        path = os.path.join(ROOT, "configs", name)
        spec = importlib.util.spec_from_file_location(f"config_{name[:-3]}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        specs.append(path)
        for table, key in CHOICE_TABLES.items():
            specs += [f"{path}:{key}={choice}" for choice in getattr(module, table, {})]
    return specs


def run_without_jax(code: str, *args: str) -> dict:
    """Run ``code`` (it sets ``result``, a dict) in a fresh Python with ``args`` and return ``result`` with
    ``"heavy"``: the modules of ``HEAVY`` imported by then."""
    script = code + f"""
import json, sys
result["heavy"] = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
print(json.dumps(result))
"""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_config_file_loads_and_validates_without_jax():
    specs = config_specs()
    assert len(specs) >= 7 + 4 + 3 + 7 + 4 + 3
    result = run_without_jax("""
import sys
from layerscale_jax.train.config import load_config, validate_experiment_config
result = {"families": {spec: type(validate_experiment_config(load_config(spec)).model).__name__
                       for spec in sys.argv[1:]}}
""", *specs)
    assert result["heavy"] == []
    assert set(result["families"]) == set(specs)
    assert set(result["families"].values()) == {"ViTConfig", "CaiTConfig", "MAEConfig"}


def test_a_command_line_mistake_is_found_before_jax_is_imported():
    result = run_without_jax(f"""
from layerscale_jax.errors import ConfigError
from layerscale_jax.train.__main__ import parse_job
try:
    parse_job(["--config", "{TINY}", "--config.model.num_heads=5", "--workdir", "unused"])
except ConfigError as err:
    result = {{"error": str(err)}}
""")
    assert result["heavy"] == []
    assert "num_heads=5" in result["error"]


def test_the_experiment_holds_the_model_section_as_its_architecture_config():
    from layerscale_jax.train.config import load_config
    config = load_config(TINY)
    config.model.depth, config.model.mlp_ratio = 3, 2.5
    experiment = validate_experiment_config(config)
    assert isinstance(experiment, Experiment) and experiment.config is config
    assert experiment.model == arch_lib.model_config(**config.model.to_dict())
    assert (experiment.model.depth, experiment.model.mlp_ratio) == (3, 2.5)


def test_dtypes_are_names_and_dtype_objects_are_accepted():
    import jax.numpy as jnp
    cfg = arch_lib.model_config("deit3_small_patch16_224", dtype=jnp.bfloat16, param_dtype="float32")
    assert (cfg.dtype, cfg.param_dtype) == ("bfloat16", "float32")
    with pytest.raises(ValueError, match="dtype='float64' is not one of"):
        arch_lib.model_config("deit3_small_patch16_224", dtype="float64")


def test_the_remat_names_are_the_policies():
    from layerscale_jax.models.stack import REMAT_POLICIES
    assert tuple(REMAT_POLICIES) == arch_lib.REMAT_NAMES


class CountedConstructions:
    """Counts the validated objects made while installed: architecture configs (each validated as it is made) and
    data settings (``data.config.validate_data_config``'s result)."""

    def __init__(self, monkeypatch):
        from layerscale_jax.data.config import DataSettings
        self.made = []
        post_init, data_init = arch_lib.ArchConfig.__post_init__, DataSettings.__init__

        def counted_arch(cfg):
            self.made.append(type(cfg).__name__)
            post_init(cfg)

        def counted_data(settings, *args, **kwargs):
            self.made.append(type(settings).__name__)
            data_init(settings, *args, **kwargs)

        monkeypatch.setattr(arch_lib.ArchConfig, "__post_init__", counted_arch)
        monkeypatch.setattr(DataSettings, "__init__", counted_data)


def tiny_config(steps: int) -> ml_collections.ConfigDict:
    from layerscale_jax.train.config import load_config
    config = load_config(f"{TINY}:steps={steps}")
    config.train.eval_every = 0
    return config


@pytest.mark.slow
def test_the_model_and_data_sections_are_validated_once_in_a_run(monkeypatch, tmp_path):
    config = tiny_config(4)
    counted = CountedConstructions(monkeypatch)
    results = loop_lib.train_and_evaluate(validate_experiment_config(config), str(tmp_path / "run"))
    assert results["steps"] == 4
    assert counted.made == ["ViTConfig", "DataSettings"]     # where the config entered; the run uses those objects


@pytest.mark.slow
def test_a_validated_experiment_is_not_checked_again(monkeypatch, tmp_path):
    experiment = validate_experiment_config(tiny_config(4))
    counted = CountedConstructions(monkeypatch)
    assert loop_lib.train_and_record(experiment)["steps"] == 4
    assert counted.made == []


@pytest.mark.parametrize("entry", ["train_and_evaluate", "train_and_record", "create_trainer", "compile_for"])
def test_the_library_takes_the_validated_experiment_and_refuses_a_config_in_one_line(entry, tmp_path):
    """The config is validated where it enters (the command line, ``api``, a script's own call); the library's
    functions take the ``Experiment`` only, so nothing checks a section twice and nothing runs unchecked."""
    from layerscale_jax.plan import compile_for as plan_lib
    call = {"train_and_evaluate": lambda c: loop_lib.train_and_evaluate(c, str(tmp_path / "run")),
            "train_and_record": loop_lib.train_and_record,
            "create_trainer": lambda c: loop_lib.create_trainer(c, mesh=None),
            "compile_for": lambda c: plan_lib.compile_for(c, "v5e-4")}[entry]
    with pytest.raises(TypeError) as refused:
        call(tiny_config(4))
    assert str(refused.value) == (f"{entry} takes an Experiment, not a "
                                  "ConfigDict: validate the config once where it enters, "
                                  "experiment = validate_experiment_config(config)")
    assert not (tmp_path / "run").exists()


def test_create_model_is_the_model_of_its_config():
    import jax
    from flax import nnx
    cfg = arch_lib.model_config("cait_xxs24_224", depth=2, img_size=32, dtype="bfloat16")
    by_name = nnx.eval_shape(lambda: create_model("cait_xxs24_224", depth=2, img_size=32, dtype="bfloat16"))
    by_config = nnx.eval_shape(lambda: create_from_config(cfg))
    assert by_name.cfg == by_config.cfg == cfg and dataclasses.asdict(cfg)["dtype"] == "bfloat16"

    def layout(model):
        return jax.tree.map(lambda x: (x.shape, str(x.dtype)), nnx.to_pure_dict(nnx.state(model, nnx.Param)))

    assert layout(by_name) == layout(by_config)
