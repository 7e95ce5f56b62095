"""One run of the MNIST-1D depth study (pilot and pre-registered study): its spec, config, training and record.

A run is a column (a branch-scaling scheme of ``depth_ablation_runs.SCHEMES``, always with the recipe's 10% warm-up)
at one depth, learning rate, seed and training-set size, trained by the record mode of the train loop
(``classifier_run``) on ``configs/mnist1d_layerscale.py``: a ViT over 40-sample signals in patches of 4 samples,
width 32, 2 heads, batch 64, 1,000 AdamW steps, cosine decay. It trains on ``train``, is evaluated on the 1,000
``validation`` signals every 250 steps (what selections read) and, once at the end, on the 10,000 ``test`` signals
(``final_test_accuracy``: what the pre-registered analysis reports, never what it selects on).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os

import depth_ablation_runs as da  # the schemes (branch scaling and ε rule of each column)
from layerscale_jax.train.config import validate_experiment_config

import sweep  # records, resume, shards

ROOT = da.ROOT
CONFIG = os.path.join(ROOT, "configs", "mnist1d_layerscale.py")
STEPS = 1000
EMBED_DIM = 32
NUM_HEADS = 2
EVAL_EVERY = 250
VALIDATION_SIGNALS = 1000
TEST_SIGNALS = 10000


@dataclasses.dataclass(frozen=True)
class Run:
    """One run: ``stage`` names the experiment it belongs to (its records' folder and run ids)."""
    stage: str
    depth: int
    scheme: str
    seed: int
    learning_rate: float
    num_train: int

    @property
    def run_id(self) -> str:
        return (f"{self.stage}_n{self.num_train}_depth{self.depth}_{self.scheme}_lr{self.learning_rate:g}"
                f"_seed{self.seed}")


def load_config(arg: str):
    spec = importlib.util.spec_from_file_location("mnist1d_layerscale", CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def make_config(run: Run):
    scheme = da.SCHEMES_BY_NAME[run.scheme]
    init = scheme.init_values
    config = load_config(f"depth={run.depth},embed_dim={EMBED_DIM},num_heads={NUM_HEADS},"
                         f"branch_scaling={scheme.branch_scaling},init_values={init},steps={STEPS},seed={run.seed},"
                         f"lr={run.learning_rate},num_train={run.num_train}")
    config.data.eval_split = "validation"
    config.train.eval_every = EVAL_EVERY
    config.train.checkpoint_every = 0
    config.train.nonfinite = "skip"            # a non-finite step is an outcome (diverged), never an exception
    return config


def train_run(run: Run) -> dict:
    """Train ``run`` and return its record: the spec's fields, the record mode's (validation curve, diagnostics,
    divergence, timing) and the final state's test metrics (``final_test_accuracy``, ``final_test_loss``)."""
    from layerscale_jax.train.loop import train_and_record
    config = make_config(run)
    result = train_and_record(validate_experiment_config(config), final_splits=("test",))
    scheme = da.SCHEMES_BY_NAME[run.scheme]
    return {**dataclasses.asdict(run), "run_id": run.run_id, "branch_scaling": scheme.branch_scaling,
            "epsilon": epsilon(run), "warmup_steps": config.optim.warmup_steps, "embed_dim": EMBED_DIM,
            "dataset": config.data.name, **result}


def epsilon(run: Run) -> float | None:
    from layerscale_jax.layers.scaling import resolve_init_value
    scheme = da.SCHEMES_BY_NAME[run.scheme]
    if scheme.branch_scaling == "none":
        return None
    return resolve_init_value(scheme.branch_scaling, scheme.init_values, run.depth)


def validation_correct(record: dict) -> int:
    """The validation signals the run got right (accuracy × 1,000 is an integer count)."""
    return round(record["final_val_accuracy"] * VALIDATION_SIGNALS)


def run_all(runs, out: str, log=print) -> list[dict]:
    """Train every run without a record in ``out`` (``sweep.run``: resumable; a diverged run is an outcome)."""
    sweep.enable_compilation_cache()
    return sweep.run(runs, train_run, out, cost=lambda r: r.depth, log=log,
                     outcome=lambda r: f"val {r['final_val_accuracy']:.3f}")
