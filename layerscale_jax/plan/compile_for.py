"""Compile a run's train and eval steps for a pod without the pod: ``compile_for(experiment, "v5e-256")``
(``lsj.compile_for(config, "v5e-256")`` from a config).

The steps are exactly those ``train_and_evaluate`` would jit (``loop.create_trainer``: the same mesh, shardings,
dtype, remat, scan, optimizer, Mixup, EMA, LoRA), lowered with abstract inputs (``jax.ShapeDtypeStruct``s carrying
their shardings; nothing is allocated, no data read) over device descriptions of the target
(``plan.targets``), and compiled by the target's own compiler (libtpu's for TPU) on this machine. The report:

    memory per chip     ``compiled.memory_analysis()``: arguments + outputs − aliased (donated state) + temporaries
                        + generated code, against what the compiler allows a program (``targets.compiler_hbm_bytes``
                        on TPU: 15.75 GiB of a v5e chip's 16; JAX's share of a GPU's memory)
    FLOPs per step      the analytic model FLOPs (``bench.flops``), what MFU counts
    collectives         per kind, per chip and step (loop bodies × their trip counts), from the compiled HLO
                        (``plan.hlo``)
    step time           a range from the compiled train step's own HLO (``plan.step_time``): compute, memory and
                        communication per link; lower bound = the largest (perfect overlap), upper bound = their
                        sum (serialized); the MFU range that follows and the term that dominates
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import time
from typing import Any

import jax
import jax.numpy as jnp

from layerscale_jax.data.sharding import batch_sharding
from layerscale_jax.errors import UserError
from layerscale_jax.plan import hlo as hlo_lib
from layerscale_jax.plan import step_time as step_time_lib
from layerscale_jax.train import sharding as shard_lib
from layerscale_jax.plan import targets as targets_lib
from layerscale_jax.train.config import require_experiment, validate_experiment_config
from layerscale_jax.train.config import with_overrides as _with

GiB = targets_lib.GiB
# libtpu's out-of-memory at compile time, e.g. "... HLO temporaries (16.96G) exceeds available HBM (15.75G)".
_TPU_OOM = re.compile(r"\(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)")
_UNITS = targets_lib.UNITS


@dataclasses.dataclass
class StepMemory:
    """Bytes per chip of one compiled step (``memory_analysis()``); ``total`` is what must fit in HBM at once."""
    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    code: int

    @property
    def total(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

    @classmethod
    def of(cls, compiled) -> "StepMemory":
        m = compiled.memory_analysis()
        return cls(m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes, m.temp_size_in_bytes,
                   m.generated_code_size_in_bytes)


@dataclasses.dataclass
class CompileReport:
    """What ``compile_for`` found; ``format()`` is the one-screen text, ``to_json()`` the same as one object."""
    target: str
    topology: str
    chip: str
    chip_source: str
    num_chips: int
    mesh: dict[str, int]
    model: str                    # registry name, depth, width, parameters
    global_batch: int
    per_chip_batch: int
    accum_steps: int
    hbm_per_chip: int
    train_memory: StepMemory
    eval_memory: StepMemory | None      # None: the eval step was not compiled
    flops_per_step: int
    collectives: dict[str, dict[str, float]]
    compile_seconds: dict[str, float]
    peak_flop_per_s: float
    hbm_bytes_per_s: float
    step: step_time_lib.StepTime        # the train step's terms
    link_bytes_per_s: dict[str, float]  # the bandwidth per chip of each link the step crosses
    programs: dict[str, str]            # program_sha256 of each compiled step: which programs this reports on
    memory_note: str = ""               # where hbm_per_chip comes from

    @property
    def peak_bytes(self) -> int:
        return max(m.total for m in (self.train_memory, self.eval_memory) if m is not None)

    @property
    def headroom(self) -> int:
        return self.hbm_per_chip - self.peak_bytes

    @property
    def fits(self) -> bool:
        return self.headroom >= 0

    @property
    def compute_seconds(self) -> float:
        return self.step.seconds["compute"]

    @property
    def memory_seconds(self) -> float:
        return self.step.seconds["memory"]

    @property
    def bound_seconds(self) -> float:
        """The lower bound of the step time: its largest term."""
        return self.step.lower

    @property
    def upper_seconds(self) -> float:
        return self.step.upper

    def mfu(self, seconds: float) -> float:
        return self.flops_per_step / (self.num_chips * self.peak_flop_per_s * seconds)

    @property
    def mfu_ceiling(self) -> float:
        return self.mfu(self.bound_seconds)

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON-able dict, with the derived figures."""
        out = dataclasses.asdict(self)
        for step in ("train_memory", "eval_memory"):
            if out[step] is not None:
                out[step]["total"] = getattr(self, step).total
        out.update(fits=self.fits, peak_bytes_per_chip=self.peak_bytes, headroom_bytes=self.headroom,
                   compute_bound_s=self.compute_seconds, memory_bound_s=self.memory_seconds,
                   step_time_lower_bound_s=self.bound_seconds, step_time_upper_bound_s=self.upper_seconds,
                   dominant_term=self.step.dominant, mfu_ceiling=self.mfu_ceiling,
                   mfu_floor=self.mfu(self.upper_seconds),
                   images_per_s_upper_bound=self.global_batch / self.bound_seconds,
                   images_per_s_lower_bound=self.global_batch / self.upper_seconds)
        return out

    def format(self) -> str:
        def gib(n):
            return f"{n / GiB:.2f} GiB"

        def ms(seconds):
            return f"{seconds * 1e3:.1f} ms"

        t, e, step = self.train_memory, self.eval_memory, self.step
        micro = f" (micro-batch {self.per_chip_batch // self.accum_steps} × {self.accum_steps})" \
            if self.accum_steps > 1 else ""
        terms = [f"compute {ms(self.compute_seconds)} ({step.flops_per_chip:.3g} FLOP at "
                 f"{self.peak_flop_per_s / 1e12:.0f} TFLOP/s bf16)",
                 f"memory {ms(self.memory_seconds)} ({step.hbm_bytes_per_chip / 1e9:.3g} GB at "
                 f"{self.hbm_bytes_per_s / 1e9:,.0f} GB/s)"]
        terms += [f"{link} {ms(step.seconds[link])} ({step.link_bytes_per_chip[link] / 1e9:.3g} GB at "
                  f"{self.link_bytes_per_s[link] / 1e9:,.1f} GB/s)" for link in step.seconds
                  if link not in ("compute", "memory")]
        lines = [
            f"target      {self.target}: {self.topology}, {self.num_chips} × {self.chip}",
            f"mesh        {' × '.join(f'{k}={v}' for k, v in self.mesh.items())}",
            f"model       {self.model}; global batch {self.global_batch}, {self.per_chip_batch} per chip{micro}",
            f"memory/chip {'':11s}{'arguments':>11s}{'outputs':>11s}{'aliased':>11s}{'temporaries':>13s}{'total':>11s}",
            *(f"  {name:20s}{gib(m.arguments):>11s}{gib(m.outputs):>11s}{gib(m.aliased):>11s}"
              f"{gib(m.temporaries):>13s}{gib(m.total):>11s}"
              for name, m in (("train step", t), ("eval step", e)) if m is not None),
            f"  HBM {gib(self.hbm_per_chip)} per chip{f' ({self.memory_note})' if self.memory_note else ''}: "
            f"peak {gib(self.peak_bytes)}, headroom {gib(self.headroom)} "
            f"({'fits' if self.fits else 'DOES NOT FIT'})",
            f"FLOPs/step  {self.flops_per_step:.3e} (analytic model FLOPs)",
            "collectives " + ("; ".join(f"{k} ×{v['count']:,.0f} {v['bytes'] / 2 ** 20:,.1f} MiB"
                                        for k, v in self.collectives.items()) or "none")
            + " (per chip and train step, loops × trip counts)",
            "compile     " + ", ".join(f"{k} {v:.1f} s" for k, v in self.compile_seconds.items()),
            f"step time   {ms(self.bound_seconds)} to {ms(self.upper_seconds)} per train step, {step.dominant} "
            f"dominates: ≤ {self.global_batch / self.bound_seconds:,.0f} img/s, MFU "
            f"{self.mfu(self.upper_seconds):.2f} to {self.mfu_ceiling:.2f}",
            "  per chip  " + "; ".join(terms),
            *(f"  note      {n}" for n in step.notes),
            f"chip data   {self.chip_source}",
        ]
        return "\n".join(lines)


def declared_dataset_info(experiment):
    """The ``DatasetInfo`` the steps need, from the validated config alone (the dataset is not opened)."""
    from layerscale_jax.data import DatasetInfo
    settings, arch = experiment.data, experiment.model
    return DatasetInfo(name=settings.name, num_classes=arch.num_classes, image_size=settings.image_size,
                       channels=arch.in_chans, num_train=0, num_test=0, mean=(0.0,), std=(1.0,),
                       train_split=settings.train_split, eval_split=settings.eval_split or "test")


def batch_specs(experiment, mesh, size: int, with_mask: bool) -> dict:
    """Abstract global batches as the loop feeds them: float32 images, int32 labels (and the eval mask)."""
    sharding = batch_sharding(mesh)
    arch = experiment.model
    shape = (size,) + (experiment.data.image_size,) * getattr(arch, "patch_dims", 2) + (arch.in_chans,)
    spec = {"image": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding),
            "label": jax.ShapeDtypeStruct((size,), jnp.int32, sharding=sharding)}
    if with_mask:
        spec["mask"] = jax.ShapeDtypeStruct((size,), jnp.bool_, sharding=sharding)
    return spec


def describe_model(steps) -> str:
    arch = steps.trainer.arch
    count = sum(math.prod(p.shape) for p in jax.tree.leaves(steps.trainer.abstract_state["params"]))
    return (f"{steps.experiment.config.model.name} (depth {arch.depth}, width {arch.embed_dim}, {count:,} "
            f"parameters, {arch.dtype}, remat {arch.remat})")


def analytic_flops(trainer) -> int:
    """Model FLOPs of one train step on the global batch (``bench.flops``)."""
    from layerscale_jax.bench.flops import train_step_flops
    return train_step_flops(trainer.arch, trainer.train.batch_size)


class DoesNotFit(UserError):
    """The run needs more memory per chip than the target's chips have (one line with the numbers)."""


def _out_of_memory(err: Exception, target, config, per_chip: int, floor: float = 0.0) -> UserError | None:
    """libtpu's compile-time out-of-memory as one line with the numbers, or None for another error."""
    match = _TPU_OOM.search(str(err))
    if "RESOURCE_EXHAUSTED" not in str(err) or not match:
        return None
    needed = float(match.group(1)) * _UNITS[match.group(2)]
    available = float(match.group(3)) * _UNITS[match.group(4)]
    return DoesNotFit(does_not_fit(config, target, needed, available, "of temporaries, the compiler's count",
                                   per_chip, needed, available, floor))


def state_floor(abstract_state: dict) -> float:
    """Bytes per chip that no per-chip batch changes: the train state (parameters, optimizer state, EMA) as it is
    sharded, and one gradient per parameter."""
    def per_chip(tree) -> int:
        return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
                   for leaf in jax.tree.leaves(tree) if getattr(leaf, "sharding", None) is not None)
    return float(per_chip(abstract_state) + per_chip(abstract_state["params"]))


def does_not_fit(config, target, needed: float, available: float, what: str, per_chip: int, temporaries: float,
                 room: float, floor: float = 0.0) -> str:
    """The one line for a run that does not fit: needed vs HBM per chip, and what would fit — the per-chip
    micro-batch whose temporaries would fit in ``room`` bytes if they shrink with the batch (an estimate; ``--fit``
    compiles to find out), as the ``optim.accum_steps`` that gives it with the global batch unchanged. When what no
    batch changes (``floor``: ``state_floor``) is more than the chip has, it says that no per-chip batch fits (it
    suggested accum_steps=64 for a model that fits nowhere)."""
    head = (f"{config.model.name} (global batch {config.train.batch_size}, {per_chip} per chip) does not fit "
            f"{target.name}: it needs {needed / GiB:.2f} GiB per chip ({what}) but a {target.chip.name} chip has "
            f"{available / GiB:.2f} GiB{f' ({target.memory_note})' if target.memory_note else ''}; ")
    if floor >= available:
        return head + (f"the train state and its gradients alone take {floor / GiB:.2f} GiB per chip, so no per-chip "
                       "batch, accumulation or remat fits: shard them over more chips (more fsdp, a larger target) "
                       "or train a smaller model")
    accum = config.optim.accum_steps
    micro = per_chip // accum
    fitting = int(micro * max(room, 0.0) / temporaries) if temporaries > 0 else 0
    steps = [k for k in (accum * 2 ** i for i in range(1, 16)) if per_chip % k == 0 and per_chip // k <= fitting]
    if steps:
        hint = (f"about {fitting} images per chip would fit (temporaries shrink with the batch): "
                f"--config.optim.accum_steps={steps[0]} keeps the global batch, ")
    else:
        hint = "not even one image per chip would fit as it is: "
    return head + hint + "or --config.model.remat=full, or more fsdp; --fit compiles to find the fastest that fits"


@dataclasses.dataclass
class CompiledSteps:
    """A config's steps compiled for a target: what ``compile_for`` reports on (and the design-card tests read)."""
    target: targets_lib.Target
    mesh: Any
    trainer: Any                    # loop.Trainer
    experiment: Any                 # train.config.Experiment: what was compiled
    compiled: dict[str, Any]        # "train" (and "eval"): jax.stages.Compiled
    seconds: dict[str, float]       # compile time of each
    programs: dict[str, str]        # program_sha256 of each: what was compiled


def program_sha256(lowered) -> str:
    """What a compile is of: the SHA-256 of a step's lowered StableHLO text (``Lowered.as_text()``, without debug
    locations). Any change to the model, optimizer, shardings, mesh or jax's lowering changes it; the same program
    gives the same digest in any checkout or process."""
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()


def _steps_to_lower(experiment, target: str, eval_step: bool):
    """``experiment``'s train (and eval) step for ``target``, built by ``loop.create_trainer`` exactly as the run
    builds them, each with the abstract sharded inputs it is lowered with."""
    from layerscale_jax.train import loop as loop_lib

    require_experiment(experiment, "compile_for")
    parsed = targets_lib.parse_target(target)
    tc = experiment.train
    mesh = shard_lib.make_mesh(tc.mesh, targets_lib.target_devices(parsed))
    trainer = loop_lib.create_trainer(experiment, mesh, info=declared_dataset_info(experiment))
    steps = {"train": (trainer.train_step, (trainer.abstract_state,
                                            batch_specs(experiment, mesh, tc.batch_size, False)))}
    if eval_step:
        steps["eval"] = (trainer.eval_step, (trainer.abstract_state["params"],
                                             batch_specs(experiment, mesh, tc.eval_batch_size, True)))
    return parsed, mesh, trainer, steps


def train_step_sha256(experiment, target: str) -> str:
    """``program_sha256`` of ``experiment``'s train step for ``target``, lowered as ``compile_steps`` lowers it and not
    compiled (seconds, where libtpu's compile takes minutes): a committed compile record
    (``benchmarks/compile_recipes.py``) is of today's program exactly when its digest is this."""
    *_, steps = _steps_to_lower(experiment, target, eval_step=False)
    step, args = steps["train"]
    return program_sha256(step.lower(*args))


def compile_steps(experiment, target: str, *, eval_step: bool = True) -> CompiledSteps:
    """``experiment``'s train (and eval) step, built by ``loop.create_trainer`` exactly as the run builds them, lowered
    with abstract sharded inputs over ``target``'s devices and compiled by its compiler. libtpu's out-of-memory
    raises ``DoesNotFit``."""
    cache = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)    # cross-compiled entries cannot be read back
    try:
        parsed, mesh, trainer, steps = _steps_to_lower(experiment, target, eval_step)
        seconds, compiled, programs = {}, {}, {}
        for name, (step, args) in steps.items():
            start = time.perf_counter()
            lowered = step.lower(*args)
            programs[name] = program_sha256(lowered)
            try:
                compiled[name] = lowered.compile()
            except Exception as err:        # noqa: BLE001 - an out-of-memory becomes one line; others propagate
                tc = experiment.train
                per_chip = tc.batch_size // (mesh.shape["data"] * mesh.shape["fsdp"])
                oom = _out_of_memory(err, parsed, experiment.config, per_chip, state_floor(trainer.abstract_state))
                if oom is None:
                    raise
                raise oom from err
            seconds[name] = time.perf_counter() - start
    finally:
        jax.config.update("jax_enable_compilation_cache", cache)
    return CompiledSteps(parsed, mesh, trainer, experiment, compiled, seconds, programs)


def compile_for(experiment, target: str, *, check_fit: bool = True, eval_step: bool = True) -> CompileReport:
    """Compile ``experiment``'s (``validate_experiment_config``'s) train and eval steps for ``target`` (a name of
    ``plan.targets``) and report per-chip memory, FLOPs, collectives and the step-time range. ``check_fit``: a run
    that does not fit the chip's HBM raises ``DoesNotFit`` (a ``UserError``: one line with the numbers) instead of
    returning its report. ``eval_step=False`` compiles the train step only."""
    steps = compile_steps(experiment, target, eval_step=eval_step)
    parsed, mesh, compiled, tc = steps.target, steps.mesh, steps.compiled, steps.trainer.train
    batch_devices = mesh.shape["data"] * mesh.shape["fsdp"]
    text = compiled["train"].as_text()
    step = step_time_lib.step_time(text, parsed.chip, [d.process_index for d in mesh.devices.flat],
                                   parsed.num_slices)
    report = CompileReport(
        target=parsed.name, topology=parsed.describe(), chip=parsed.chip.name, chip_source=parsed.chip.source,
        num_chips=parsed.num_chips, mesh={k: int(v) for k, v in mesh.shape.items()},
        model=describe_model(steps),
        global_batch=tc.batch_size, per_chip_batch=tc.batch_size // batch_devices,
        accum_steps=steps.trainer.optim.accum_steps, hbm_per_chip=parsed.memory_per_chip,
        memory_note=parsed.memory_note,
        train_memory=StepMemory.of(compiled["train"]),
        eval_memory=StepMemory.of(compiled["eval"]) if eval_step else None,
        flops_per_step=analytic_flops(steps.trainer),
        collectives=hlo_lib.collectives_by_kind(hlo_lib.collectives(text)),
        compile_seconds=steps.seconds, peak_flop_per_s=parsed.chip.peak_bf16_flop_per_s,
        hbm_bytes_per_s=parsed.chip.hbm_bytes_per_s, step=step, link_bytes_per_s={
            parsed.chip.link: parsed.chip.link_bytes_per_s, parsed.chip.network: parsed.chip.network_bytes_per_s},
        programs=steps.programs)
    if check_fit and not report.fits:
        fixed = report.train_memory.total - report.train_memory.temporaries
        raise DoesNotFit(does_not_fit(steps.experiment.config, parsed, report.peak_bytes, report.hbm_per_chip,
                                      "arguments, outputs and temporaries", report.per_chip_batch,
                                      report.train_memory.temporaries, report.hbm_per_chip - fixed,
                                      state_floor(steps.trainer.abstract_state)))
    return report


# -- --fit: the configs that compile within HBM, fastest first ----------------------------------------------

REMAT_ORDER = ("dots_saveable", "dots_with_no_batch_dims_saveable", "full")   # least recomputation first


def _accum_choices(config, mesh_batch_devices: int) -> list[int]:
    """Gradient-accumulation steps that halve the per-chip micro-batch down to one example (global batch kept)."""
    per_chip = config.train.batch_size // mesh_batch_devices
    base = config.optim.accum_steps
    return [k for k in (base * 2 ** i for i in range(1, 16)) if per_chip % k == 0]


def _batch_devices(config, target) -> int:
    mesh = shard_lib.make_mesh(config.train.mesh, targets_lib.target_devices(targets_lib.parse_target(target)))
    return mesh.shape["data"] * mesh.shape["fsdp"]


def _layouts(config, target: str) -> list[dict]:
    """More FSDP: the data axis folded into fsdp within a slice, then across slices; each only where it changes
    the mesh on ``target``'s chips (``data=-1`` that comes to 1 there is the ``fsdp=-1`` mesh already: compiling it
    again took half of a --fit search)."""
    mesh = config.train.mesh
    found = []
    if mesh.get("data", 1) != 1:
        found.append({"train.mesh.data": 1, "train.mesh.fsdp": -1})
    if mesh.get("dcn_data", 1) > 1:
        found.append({**(found[-1] if found else {}), "train.mesh.dcn_fsdp": mesh.get("dcn_data") *
                      mesh.get("dcn_fsdp", 1), "train.mesh.dcn_data": 1})
    seen = {_mesh_sizes(config, target)}
    distinct = []
    for layout in found:
        sizes = _mesh_sizes(_with(config, layout), target)
        if sizes not in seen:
            seen.add(sizes)
            distinct.append(layout)
    return distinct


def _mesh_sizes(config, target: str) -> tuple:
    """The mesh's axis sizes within a granule (slice or host) and across granules on ``target``'s chips, its -1
    filled in (as ``train.sharding.mesh_devices`` does, without the devices)."""
    mesh = config.train.mesh
    dcn = tuple(mesh.get(f"dcn_{axis}", 1) for axis in ("data", "fsdp", "tensor"))
    ici = [mesh.get(axis, 1) for axis in ("data", "fsdp", "tensor")]
    per_granule = targets_lib.parse_target(target).num_chips // math.prod(dcn)
    known = math.prod(v for v in ici if v != -1)
    return tuple(per_granule // known if v == -1 else v for v in ici), dcn


@dataclasses.dataclass
class FitResult:
    """What ``--fit`` found: the fastest config that fits (by the step time's lower bound), its full report and
    overrides, and every candidate that fit, fastest first (``candidates``: ``(overrides, train-step report)``)."""
    report: CompileReport
    overrides: dict
    candidates: list[tuple[dict, CompileReport]]

    def table(self) -> str:
        """The candidates that fit, one line each: memory, step-time range and MFU."""
        lines = [f"  {'candidate':58s}{'GiB/chip':>9s}{'step (ms)':>15s}{'MFU':>11s}"]
        for overrides, r in self.candidates:
            lines.append(f"  {' '.join(f'{k}={v}' for k, v in overrides.items()) or 'as given':58s}"
                         f"{r.peak_bytes / GiB:9.2f}{f'{r.bound_seconds * 1e3:.1f}–{r.upper_seconds * 1e3:.1f}':>15s}"
                         f"{f'{r.mfu(r.upper_seconds):.2f}–{r.mfu_ceiling:.2f}':>11s}")
        return "\n".join(lines)


def fit_search(config, target: str, log=print) -> FitResult:
    """The configs that compile within what the target's compiler allows per chip, ranked by the lower bound of
    their step time. Searched: per layout (the mesh as given, then more FSDP: ``_layouts``, only while nothing
    fits: it adds communication), per remat policy from the least recomputation (``REMAT_ORDER``; a heavier one only
    while none has fit at the recipe's own micro-batch), scanned and unrolled layers (``model.scan_layers``: scan
    compiles one block and keeps every layer's activations in stacked buffers, unrolled lets XLA schedule and free
    them layer by layer), each with its largest per-chip micro-batch that fits (``optim.accum_steps`` doubled: the
    global batch, the optimizer and the FLOPs stay the recipe's). Raises ``DoesNotFit`` when nothing fits."""
    def attempt(overrides: dict) -> CompileReport | None:
        candidate = _with(config, overrides)
        described = " ".join(f"{k}={v}" for k, v in overrides.items()) or "the config as given"
        try:
            report = compile_for(validate_experiment_config(candidate), target, check_fit=False, eval_step=False)
        except DoesNotFit as err:
            log(f"  {described}: does not fit ({str(err).split(': it needs ')[-1].split(';')[0]})")
            return None
        log(f"  {described}: {report.peak_bytes / GiB:.2f} GiB of {report.hbm_per_chip / GiB:.2f} GiB per chip"
            + (f", step {report.bound_seconds * 1e3:.1f} to {report.upper_seconds * 1e3:.1f} ms" if report.fits
               else ", does not fit"))
        return report if report.fits else None

    def smallest_accum(overrides: dict) -> tuple[dict, CompileReport] | None:
        """The least accumulation (largest micro-batch) that fits, by bisection (memory falls as it grows)."""
        report = attempt(overrides)
        if report is not None:
            return overrides, report
        choices = _accum_choices(_with(config, overrides), _batch_devices(_with(config, overrides), target))
        best, lo, hi = None, 0, len(choices) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            trial = {**overrides, "optim.accum_steps": choices[mid]}
            report = attempt(trial)
            if report is not None:
                best, hi = (trial, report), mid - 1
            else:
                lo = mid + 1
        return best

    log(f"--fit: searching {target} (per-chip batch, scan or not, remat, then fsdp), ranking by the step time")
    scanned = bool(config.model.get("scan_layers", False))
    remats = [r for r in REMAT_ORDER if r != config.model.get("remat", "none")]
    fitting: list[tuple[dict, CompileReport]] = []
    for layout in [{}] + _layouts(config, target):
        for remat in [None] + remats:
            at_recipe_batch = False
            for scan in (scanned, not scanned):
                found = smallest_accum({**layout, **({"model.remat": remat} if remat else {}),
                                        **({"model.scan_layers": scan} if scan != scanned else {})})
                if found is not None:
                    fitting.append(found)
                    at_recipe_batch |= "optim.accum_steps" not in found[0]
            if at_recipe_batch:
                break
        if fitting:
            break
    if not fitting:
        raise DoesNotFit(f"{config.model.name} does not fit {target} with any per-chip batch, remat policy or fsdp "
                         f"layout tried: it needs more chips (or more HBM per chip)")
    fitting.sort(key=lambda found: found[1].bound_seconds)
    overrides = fitting[0][0]
    return FitResult(compile_for(validate_experiment_config(_with(config, overrides)), target), overrides, fitting)


def command_line_overrides(overrides: dict) -> str:
    return " ".join(f"--config.{k}={v}" for k, v in overrides.items())


def compile_command(experiment, target: str, *, fit: bool = False, as_json: bool = False) -> int:
    """``python -m layerscale_jax.train --config ... --compile_for TARGET [--fit] [--json]``: the report on stdout
    (its JSON as the last line with ``--json``); a run that does not fit is one ``error:`` line (``DoesNotFit``).
    ``experiment``: the command line's, validated."""
    overrides: dict = {}
    found = None
    if fit:
        found = fit_search(experiment.config, target)
        report, overrides = found.report, found.overrides
    else:
        report = compile_for(experiment, target)
    print(report.format())
    if found is not None:
        print("candidates that fit, fastest (lower bound) first:\n" + found.table())
        print("fastest as given" if not overrides else f"fastest with: {command_line_overrides(overrides)}")
    if as_json:
        extra = {"fit_overrides": overrides} if found is None else {"fit_overrides": overrides, "fit_candidates": [
            {"overrides": o, "peak_bytes_per_chip": r.peak_bytes, "step_time_lower_bound_s": r.bound_seconds,
             "step_time_upper_bound_s": r.upper_seconds} for o, r in found.candidates]}
        print(json.dumps({**report.to_json(), **extra}, sort_keys=True))
    return 0
