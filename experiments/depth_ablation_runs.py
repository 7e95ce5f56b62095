"""The depth ablation's columns and runs: the branch-scaling schemes, the run sizes, the data splits of each
protocol stage, one run's config and training, and the resumable sweep over runs.

A column is a scheme (a branch scaling and how its ε is chosen) with warm-up on or off; a run is a column at one
depth, seed and learning rate (``RunSpec``), trained by ``classifier_run.train_classifier`` on the digits recipe
(``configs/digits_layerscale.py``) with every hyper-parameter identical across columns except the one varied.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os

import classifier_run  # one run: training, evaluations, diagnostics, divergence
import sweep  # records, resume, shards, ETA, statistics, tables, plots
import validation_protocol as vp  # split discipline, rate bracketing, convergence, CI and Welch tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "digits_layerscale.py")
DEPTHS = (6, 12, 24, 48, 96)


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A column of the ablation: a branch scaling and how its ε is chosen ("auto": the CaiT rule)."""
    name: str
    branch_scaling: str
    init_values: float | str = "auto"


SCHEMES = (
    Scheme("none", "none"),
    Scheme("layerscale", "layerscale", "auto"),          # CaiT's ε rule
    Scheme("layerscale_eps0.1", "layerscale", 0.1),      # ε = 0.1 at every depth
    Scheme("scalar", "scalar", "auto"),                  # one α per branch, the same ε rule
    Scheme("rezero", "rezero"),                          # one α per block, α = 0, no LayerNorm
    Scheme("skipinit", "skipinit"),                      # one α per branch, α = 0, no normalisation
    Scheme("scalar_zero", "scalar_zero"),                # one α per branch, α = 0, LayerNorm kept (not in default)
)
SCHEMES_BY_NAME = {s.name: s for s in SCHEMES}
DEFAULT_SCHEMES = ("none", "layerscale", "layerscale_eps0.1", "scalar", "rezero", "skipinit")


@dataclasses.dataclass(frozen=True)
class Sizing:
    """How big each run is: the one place to re-tune the sweep's cost (see ``--measure``)."""
    embed_dim: int
    num_heads: int
    batch_size: int
    steps: int
    evals: int               # evaluations (with diagnostics) per run, evenly spaced; plus the diagnostics at step 0
    log_every: int


# Shared optimisation recipe (configs/digits_layerscale.py's, except the learning rate, which `--lr_sweep` chose,
# and the warm-up, scaled to the shorter run).
RECIPE = dict(learning_rate=1e-2, warmup_fraction=0.1, drop_path_rate=0.05)

# The splits of each stage (train, evaluated): the selection stages hold 285 stratified training images out as
# validation; final runs and the early grid train on all 1,442 training images and report test.
SELECTION_SPLITS = ("train_without_validation", "validation")
FINAL_SPLITS = ("train", "test")
PROTOCOL_SPLITS = {"early": FINAL_SPLITS, "budget": SELECTION_SPLITS, "rates": SELECTION_SPLITS,
                   "final": FINAL_SPLITS}
# The protocol's runs; each stage sets the step count (the budget stage's candidates, then the chosen budget).
PROTOCOL_SIZING = Sizing(embed_dim=32, num_heads=2, batch_size=64, steps=0, evals=5, log_every=10)
# Columns: (scheme, warm-up). ReZero and SkipInit also without warm-up: CaiT's variant (b) (Table 1).
COLUMNS = tuple((s, True) for s in DEFAULT_SCHEMES) + (("rezero", False), ("skipinit", False))
REFERENCE = ("layerscale", True)   # the column the comparisons test every other column against


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run. ``protocol`` fixes the splits (``PROTOCOL_SPLITS``): ``early`` is the committed 200-step grid,
    ``budget`` and ``rates`` select on validation, ``final`` reports test; ``steps`` 0 means the sizing's."""
    depth: int
    scheme: str
    warmup: bool
    seed: int
    learning_rate: float
    protocol: str = "early"
    steps: int = 0

    @property
    def run_id(self) -> str:
        base = (f"depth{self.depth}_{self.scheme}_warmup{'on' if self.warmup else 'off'}_lr{self.learning_rate:g}"
                f"_seed{self.seed}")
        return base if self.protocol == "early" else f"{self.protocol}_{base}_steps{self.steps}"


def column_label(scheme: str, warmup: bool) -> str:
    return scheme if warmup else f"{scheme} (no warm-up)"


def load_digits_config(arg: str):
    spec = importlib.util.spec_from_file_location("digits_layerscale", CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def make_config(spec: RunSpec, sizing: Sizing, dataset: str = "digits", data_dir: str | None = None):
    """The full experiment config of one run: the digits recipe, the sizing, the scheme, and the dataset."""
    from layerscale_jax.data.config import default_data_config
    from layerscale_jax.train.config import model_section

    scheme = SCHEMES_BY_NAME[spec.scheme]
    steps = spec.steps or sizing.steps
    config = load_digits_config(f"seed={spec.seed}")
    if dataset != "digits":
        config.data = default_data_config(dataset)
        if data_dir:
            config.data.data_dir = data_dir
    if dataset == "digits":                      # other datasets: their own train and test (or validation) splits
        config.data.train_split, config.data.eval_split = PROTOCOL_SPLITS[spec.protocol]
    from layerscale_jax.data import get_dataset_info
    info = get_dataset_info(config.data)
    patch = 2 if info.image_size <= 8 else max(info.image_size // 8, 1)
    config.model = model_section(
        "deit3_small_patch16_224", img_size=info.image_size, patch_size=patch, in_chans=info.channels,
        num_classes=info.num_classes, embed_dim=sizing.embed_dim, num_heads=sizing.num_heads, depth=spec.depth,
        branch_scaling=scheme.branch_scaling, init_values=scheme.init_values,
        drop_path_rate=RECIPE["drop_path_rate"], global_pool="avg", scan_layers=True)
    config.optim.learning_rate = spec.learning_rate
    config.optim.warmup_steps = int(round(RECIPE["warmup_fraction"] * steps)) if spec.warmup else 0
    config.train.steps = steps
    config.train.batch_size = sizing.batch_size
    config.train.seed = spec.seed
    config.train.log_every = sizing.log_every
    config.train.eval_every = max(steps // sizing.evals, 1)
    config.train.checkpoint_every = 0
    config.train.nonfinite = "skip"            # a non-finite step is an outcome (diverged), never an exception
    return config


def train_run(spec: RunSpec, sizing: Sizing, dataset: str = "digits", data_dir: str | None = None,
              overrides: dict | None = None) -> dict:
    """Train one run and return its record: the spec's fields, then ``classifier_run.train_classifier``'s (scalars,
    the train-loss curve, evaluations with diagnostics; a non-finite step ends the run as ``diverged``).

    ``overrides`` (``{"optim.learning_rate": 1e30, ...}``) are applied to the config last (tests, what-ifs).
    """
    config = make_config(spec, sizing, dataset, data_dir)
    for dotted, value in (overrides or {}).items():
        section, field = dotted.split(".", 1)
        config[section][field] = value
    result = classifier_run.train_classifier(config)
    return {
        "run_id": spec.run_id, "protocol": spec.protocol, "depth": spec.depth, "scheme": spec.scheme,
        "branch_scaling": SCHEMES_BY_NAME[spec.scheme].branch_scaling,
        "epsilon": _epsilon(spec), "warmup": spec.warmup, "warmup_steps": config.optim.warmup_steps,
        "seed": spec.seed, "learning_rate": config.optim.learning_rate, "dataset": config.data.name,
        "embed_dim": sizing.embed_dim, "batch_size": sizing.batch_size, **result,
    }


def _epsilon(spec: RunSpec) -> float | None:
    from layerscale_jax.layers.scaling import resolve_init_value
    scheme = SCHEMES_BY_NAME[spec.scheme]
    if scheme.branch_scaling == "none":
        return None
    return resolve_init_value(scheme.branch_scaling, scheme.init_values, spec.depth)


def record_path(out: str, spec: RunSpec) -> str:
    return sweep.record_path(out, spec.run_id)


def load_records(out: str) -> list[dict]:
    return sweep.load_records(out)


def run_sweep(specs: list[RunSpec], sizing: Sizing, out: str, dataset: str = "digits", data_dir: str | None = None,
              overrides: dict | None = None, log=print) -> list[dict]:
    """Train every spec without a record in ``out`` (``sweep.run``: finished runs are skipped, a diverged run is
    recorded as such), printing progress and an ETA that assumes a run's cost grows linearly in depth (measured:
    ``--measure``)."""
    sweep.enable_compilation_cache()
    return sweep.run(specs, lambda spec: train_run(spec, sizing, dataset, data_dir, overrides), out,
                     cost=lambda spec: spec.depth, log=log,
                     outcome=lambda r: f"{r.get('eval_split', 'test')} acc {vp.accuracy(r):.4f}")
