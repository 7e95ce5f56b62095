"""Depth ablation: does a pre-norm ViT stop improving or fail as depth grows while LayerScale keeps training?

The CaiT paper (Touvron et al., "Going deeper with Image Transformers", 2021, §3 and Fig. 3) compares LayerScale,

    x'  = x  + diag(λ1) · SA(LN(x))
    x'' = x' + diag(λ2) · FFN(LN(x'))        λ initialised to ε (0.1 up to depth 18, 1e-5 at 24, 1e-6 deeper)

with plain pre-norm, a per-branch scalar, ReZero and SkipInit (the last two also without warm-up: CaiT's variant b),
on the offline `digits` data, every hyper-parameter identical across columns except the one varied. The protocol
(``--protocol``, outputs under ``experiments/results/depth_ablation_converged/<stage>/``) selects on the validation
split only and reports test accuracy of final runs only:

    python experiments/depth_ablation.py --protocol budget   # step count: runs of each length (converged_budget)
    python experiments/depth_ablation.py --protocol rates    # rate per column × depth, bracketed (swept_rates)
    python experiments/depth_ablation.py --protocol final    # FINAL_SEEDS seeds at both rate choices, train → test

Each stage writes a run's record to ``<stage>/runs/<run id>.json`` when it ends and skips runs whose record exists,
so a stopped stage resumes; ``--shard I/N`` trains every N-th run from the I-th (one of N machines), and the same
command without ``--shard`` on the merged ``runs/`` folders trains what is missing and writes the outputs. A run
whose loss or gradient norm turns non-finite stops there, recorded with ``diverged=True``. Outputs: ``budget.json``
/ ``.md`` / ``budget.png``; ``rates.json`` / ``.md``; per final protocol (``per_depth``, ``one_rate``)
``table.md`` (mean and t-based 95% CI over converged runs, divergence counted apart), ``comparisons.md`` (Welch),
``claims.md`` / ``claims.png`` (CaiT's claims, verdicts by ``cait_claims``' rules), ``results.csv`` and the figures
of ``depth_ablation_plots``.

``--protocol early`` keeps the committed early-training grid reproducible (200 steps, ``SIZING``; depth ∈ {6, 12,
24, 48, 96} × ``DEFAULT_SCHEMES`` × seeds {0, 1, 2} plus warm-up off for `none` and `layerscale` at 48 and 96;
``--lr_sweep`` at depth 24 and ``--per_scheme_lr`` with rates chosen on *test* accuracy of seed 0 — superseded by
the protocol). ``--measure`` times runs and prints the protocol's estimate; ``--imagenet_commands`` prints the same
ablation at ImageNet scale. The runner and statistics are ``experiments/sweep.py``'s, the choices on validation
and the reports on test ``experiments/validation_protocol.py``'s, one run's training is
``experiments/classifier_run.py``'s (diagnostics from ``layerscale_jax.train.diagnostics`` at step 0 and every
evaluation).
"""
from __future__ import annotations

if __name__ == "__main__":   # before any allocation: a malloc keeping XLA's buffers (layerscale_jax/runtime/malloc.py)
    from layerscale_jax.runtime import reexec_with_fast_malloc
    reexec_with_fast_malloc()

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402  (records, resume, shards, ETA, statistics, tables, plots)
from depth_ablation_cost import (MACHINE_KIND_KEYS, measure, protocol_estimate, remaining_cpu_hours,  # noqa: E402
                                 this_machine_kind)
from depth_ablation_early import (LR_SWEEP_DEPTH, LR_SWEEP_RATES, QUICK_DEPTHS, QUICK_SIZING, SEEDS,  # noqa: E402
                                  SIZING, early_rates_chosen_on_test, grid, lr_sweep_grid, write_reports)
from depth_ablation_imagenet import (IMAGENET_DEPTHS, IMAGENET_EPOCHS, imagenet_commands,  # noqa: E402
                                     imagenet_device_hours, imagenet_node_hours, read_step_measurement)
from depth_ablation_protocol import (BUDGET_COLUMNS, BUDGET_DEPTHS, BUDGET_EVAL_EVERY, BUDGET_RATE,  # noqa: E402
                                     BUDGET_SEEDS, BUDGET_STEPS, CONVERGED_OUT, FINAL_SEEDS, MAX_EXTENSIONS,
                                     RATE_DEPTHS, RATE_LADDER_START, budget_sizing, budget_specs, final_specs,
                                     load_rates, run_rate_sweep, steps_from_budget, validation_images)
from depth_ablation_reports import (rates_status, write_budget_report, write_final_report,  # noqa: E402
                                    write_rates_report)
from depth_ablation_runs import (COLUMNS, DEFAULT_SCHEMES, DEPTHS, PROTOCOL_SIZING, RECIPE, ROOT,  # noqa: E402
                                 SCHEMES_BY_NAME, Sizing, column_label, load_records, record_path, run_sweep)


def run_protocol(protocol: str, out: str, *, steps: int | None = None, columns=COLUMNS, depths=None, seeds=None,
                 which_shard=None, report_only: bool = False, budget=None, budget_columns=BUDGET_COLUMNS,
                 sizing: Sizing = PROTOCOL_SIZING,
                 rate_start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS, tolerance: float | None = None,
                 command: str | None = None, log=print) -> dict[str, str]:
    """One stage of the protocol into ``out/<protocol>/`` (``budget``, ``rates``, ``final``): train what is missing
    (``which_shard``: this machine's share only, then stop), then write the stage's outputs from every finished
    record. ``budget``: ``(steps, eval_every, rate)`` of the ``budget_columns`` runs (those of them in
    ``columns``); ``tolerance``: the budget criterion's points (default: the validation resolution). Returns
    ``{what: path}`` (empty for a shard)."""
    stage = os.path.join(out, protocol)
    if protocol == "budget":
        b_steps, every, rate = budget or (BUDGET_STEPS, BUDGET_EVAL_EVERY, BUDGET_RATE)
        b_columns = [c for c in budget_columns if c in columns]
        if not b_columns:
            raise ValueError("--schemes leaves none of the budget columns "
                             f"{[column_label(*c) for c in budget_columns]}")
        specs = budget_specs(b_columns, depths or BUDGET_DEPTHS, seeds or BUDGET_SEEDS, b_steps, rate)
        if not report_only:
            for t in sorted(set(b_steps)):
                run_sweep(sweep.shard([s for s in specs if s.steps == t], which_shard),
                          budget_sizing(sizing, t, every), stage, log=log)
    elif protocol == "rates":
        steps = steps_from_budget(out, steps)
        if not report_only:
            run_rate_sweep(stage, steps, columns, depths or RATE_DEPTHS, which_shard, sizing, rate_start,
                           max_extensions, log=log)
    elif protocol == "final":
        steps = steps_from_budget(out, steps)
        rates = load_rates(out)
        specs = final_specs(rates, steps, depths or DEPTHS, seeds or FINAL_SEEDS, columns)
        if not report_only:
            run_sweep(sweep.shard(specs, which_shard), dataclasses.replace(sizing, steps=steps), stage, log=log)
    else:
        raise ValueError(f"--protocol={protocol!r} must be budget, rates or final")
    if which_shard is not None:
        log(f"shard {which_shard} finished; with every shard's {os.path.join(stage, 'runs')} copied together, run "
            "the same command without --shard (it trains what is missing and writes the outputs)")
        return {}
    if protocol == "budget":
        return write_budget_report(stage, tolerance)
    if protocol == "rates":
        return write_rates_report(stage, validation_images(), columns, depths or RATE_DEPTHS, start=rate_start,
                                  max_extensions=max_extensions)
    planned = len(columns) * len(depths or DEPTHS) * len(seeds or FINAL_SEEDS)     # per rate choice
    return write_final_report(stage, rates, depths or DEPTHS, command, planned)


def stage_status(protocol: str, out: str, columns=COLUMNS, depths=None, seeds=None, steps=None) -> str:
    """``--status``: the rate sweep's ``rates_status``; for the budget and final stages the runs finished out of
    those the stage plans, and the first few still to train."""
    stage = os.path.join(out, protocol)
    records = load_records(stage) if os.path.isdir(os.path.join(stage, "runs")) else []
    if protocol == "rates":
        return rates_status(records, columns, depths or RATE_DEPTHS)
    if protocol == "budget":
        specs = budget_specs([c for c in BUDGET_COLUMNS if c in columns], depths or BUDGET_DEPTHS,
                             seeds or BUDGET_SEEDS)
    else:
        specs = final_specs(load_rates(out), steps_from_budget(out, steps), depths or DEPTHS, seeds or FINAL_SEEDS,
                            columns)
    missing = [s for s in specs if not os.path.exists(record_path(stage, s))]
    text = f"{protocol}: {len(specs) - len(missing)} of {len(specs)} runs finished"
    if missing:
        text += f"; next: {', '.join(s.run_id for s in missing[:3])}" + (" …" if len(missing) > 3 else "")
        machine = this_machine_kind()
        estimate = remaining_cpu_hours(missing, records, machine)
        if estimate is not None:
            (hours, based_on, same_kind), cores = estimate, len(os.sched_getaffinity(0))
            kind = ", ".join(str(machine[k]) for k in MACHINE_KIND_KEYS)
            which = (f"the {based_on} finished runs on this machine's kind ({kind})" if same_kind
                     else f"all {based_on} finished runs (none on this machine's kind: {kind})")
            text += (f"\nstill to train: ≈ {hours:.1f} CPU-hours by the CPU time per depth of {which} "
                     f"(≈ {hours / cores:.1f} hours with one shard per core on this machine's {cores} cores)")
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("budget", "rates", "final", "early"),
                        help="budget → rates → final: the study (selection on validation, test for final runs "
                             "only); early: the committed 200-step grid (rates chosen on test)")
    parser.add_argument("--out", default=None, help=f"default: {os.path.relpath(CONVERGED_OUT, ROOT)} "
                                                    "(early: experiments/results/depth_ablation)")
    parser.add_argument("--depths", type=int, nargs="+", default=None)
    parser.add_argument("--schemes", nargs="+", default=None, choices=sorted(SCHEMES_BY_NAME),
                        help="only these schemes' columns (with and without warm-up)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=None,
                        help="rates/final: steps per run (default: OUT/budget/budget.json); early: override "
                             f"SIZING.steps ({SIZING.steps})")
    parser.add_argument("--budget_steps", type=int, nargs="+", default=list(BUDGET_STEPS),
                        help="candidate step counts of the budget stage, one whole run each")
    parser.add_argument("--budget_eval_every", type=int, default=BUDGET_EVAL_EVERY)
    parser.add_argument("--budget_rate", type=float, default=BUDGET_RATE)
    parser.add_argument("--report", action="store_true", help="only rewrite the outputs from finished runs")
    parser.add_argument("--status", action="store_true",
                        help="print where the stage stands (runs finished and still to train; rates: each cell's "
                             "finished rates and what it needs) and stop; nothing is trained or written")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="train only shard I of N of the stage (one machine of N); copy the shards' runs/ "
                             "folders together and rerun without --shard")
    early = parser.add_argument_group("--protocol early (the committed 200-step grid)")
    early.add_argument("--learning_rate", type=float, default=RECIPE["learning_rate"],
                       help="the rate shared by every scheme")
    early.add_argument("--per_scheme_lr", action="store_true",
                       help="each scheme at its rate from the early --lr_sweep (chosen on test accuracy)")
    early.add_argument("--dataset", default="digits", help="digits, or any prepared TFDS image dataset by name")
    early.add_argument("--data_dir", default=None)
    early.add_argument("--quick", action="store_true", help=f"tiny grid in minutes: depths {QUICK_DEPTHS}, "
                                                             f"{QUICK_SIZING.steps} steps, width "
                                                             f"{QUICK_SIZING.embed_dim}, seed 0")
    early.add_argument("--lr_sweep", action="store_true",
                       help=f"every scheme at depth {LR_SWEEP_DEPTH}, lr in {LR_SWEEP_RATES}, seed 0")
    parser.add_argument("--imagenet_commands", default=None, metavar="WORKDIR_ROOT",
                        help=f"print the ImageNet-scale ablation's commands (DeiT III-S at depths {IMAGENET_DEPTHS}, "
                             "every column, --seeds, one multi-host job each; --shard I/N: this share) and its "
                             "cost, then stop")
    parser.add_argument("--imagenet_step_json", default=None, metavar="PATH",
                        help="with --imagenet_commands: also the cost from a measured DeiT III-S/16 step (the JSON "
                             "of python -m layerscale_jax.bench train_step --json, e.g. benchmarks/gpu_check.sh's "
                             "s16_bf16.json)")
    parser.add_argument("--measure", type=int, nargs="*", default=None, metavar="DEPTH",
                        help="time one run per depth (default 6 24 96) of --steps steps (default 40) and print "
                             "the protocol's estimate for --steps final steps")
    args = parser.parse_args(argv)
    try:
        which_shard = sweep.parse_shard(args.shard) if args.shard else None
        for field in ("depths", "measure", "seeds"):
            values = getattr(args, field)
            if values is not None and any(v < 0 if field == "seeds" else v < 1 for v in values):
                raise ValueError(f"--{field}={values}: depths must be ≥ 1 and seeds ≥ 0")
        for field in ("steps", "budget_eval_every"):
            value = getattr(args, field)
            if value is not None and value < 1:
                raise ValueError(f"--{field}={value} must be ≥ 1")
        bad = [t for t in args.budget_steps if t < 1 or t % args.budget_eval_every]
        if bad:
            raise ValueError(f"--budget_steps={bad}: each must be a positive multiple of --budget_eval_every="
                             f"{args.budget_eval_every}")
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if args.protocol is None and args.measure is None and not args.imagenet_commands:
        parser.error("one of --protocol, --measure or --imagenet_commands is required")
    command = "python experiments/depth_ablation.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.measure is not None:
        return _measure_command(args)
    if args.imagenet_commands:
        columns = tuple(c for c in COLUMNS if args.schemes is None or c[0] in args.schemes)
        depths, seeds = tuple(args.depths or IMAGENET_DEPTHS), tuple(args.seeds or (0,))
        commands = imagenet_commands(args.imagenet_commands, depths, columns, seeds)
        print("\n".join(sweep.shard(commands, which_shard)))
        print(f"# {len(commands)} runs of {IMAGENET_EPOCHS} epochs: about "
              f"{imagenet_node_hours(depths, columns, seeds):,.0f} node-hours of 8 V100 (DeiT paper's training time "
              f"and throughputs, linear in depth)", file=sys.stderr)
        if args.imagenet_step_json:
            try:
                step = read_step_measurement(args.imagenet_step_json)
            except (ValueError, OSError) as err:
                raise SystemExit(f"error: {err}") from None
            print(f"# measured here ({args.imagenet_step_json}: {step.get('dtype')}, batch {step.get('batch')}, "
                  f"{step['img_per_s']:,.0f} images/s on one device): about "
                  f"{imagenet_device_hours(step, depths, columns, seeds):,.0f} device-hours (linear in depth; "
                  "model step only, per-device throughput assumed kept across devices)", file=sys.stderr)
        return
    if args.protocol == "early":
        if args.status:
            raise SystemExit("error: --status is for --protocol budget, rates or final (the early grid's records: "
                             "experiments/results/depth_ablation/runs/)")
        return _early(args, which_shard, command)
    columns = tuple(c for c in COLUMNS if args.schemes is None or c[0] in args.schemes)
    if args.status:
        try:
            print(stage_status(args.protocol, args.out or CONVERGED_OUT, columns,
                               tuple(args.depths) if args.depths else None,
                               tuple(args.seeds) if args.seeds is not None else None, args.steps))
        except (ValueError, FileNotFoundError) as err:
            raise SystemExit(f"error: {err}") from None
        return
    try:
        paths = run_protocol(args.protocol, args.out or CONVERGED_OUT, steps=args.steps, columns=columns,
                             depths=tuple(args.depths) if args.depths else None,
                             seeds=tuple(args.seeds) if args.seeds is not None else None, which_shard=which_shard,
                             report_only=args.report, command=command,
                             budget=(tuple(args.budget_steps), args.budget_eval_every, args.budget_rate))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    for what, path in paths.items():
        print(f"{what}: {path}")


def _measure_command(args) -> None:
    sweep.enable_compilation_cache()
    probe_steps = min(args.steps or 40, 40)
    costs = measure(args.measure or [6, 24, 96], PROTOCOL_SIZING, steps=probe_steps)
    final_steps = args.steps or 1000
    print("per step: " + ", ".join(f"depth {d} {1000 * c['per_step']:.0f} ms" for d, c in costs.items()))
    print(protocol_estimate(costs, final_steps))


def _early(args, which_shard, command) -> None:
    """The committed early-training grid (``--protocol early``): the shared-rate grid, ``--lr_sweep`` (rates chosen
    on test accuracy of seed 0 at depth 24) and ``--per_scheme_lr``."""
    out = args.out or os.path.join(ROOT, "experiments", "results", "depth_ablation")
    sizing = QUICK_SIZING if args.quick else SIZING
    if args.steps is not None:
        sizing = dataclasses.replace(sizing, steps=args.steps)
    rates = args.learning_rate
    if args.per_scheme_lr:
        rates = early_rates_chosen_on_test(os.path.join(out, "lr_sweep"), tuple(args.schemes or DEFAULT_SCHEMES))
        print("learning rate per scheme (from the early lr sweep, chosen on test): " + json.dumps(rates))
    if not args.report:
        schemes = tuple(args.schemes or DEFAULT_SCHEMES)
        if args.lr_sweep:
            specs = lr_sweep_grid(schemes, (args.depths or [LR_SWEEP_DEPTH])[0], LR_SWEEP_RATES)
        else:
            depths = tuple(args.depths or (QUICK_DEPTHS if args.quick else DEPTHS))
            seeds = tuple(args.seeds if args.seeds is not None else ((0,) if args.quick else SEEDS))
            specs = grid(depths, schemes, seeds, rates, sorted(depths)[-2:])
        stage = os.path.join(out, "lr_sweep") if args.lr_sweep else out
        run_sweep(sweep.shard(specs, which_shard), sizing, stage, args.dataset, args.data_dir)
        if which_shard:
            print(f"shard {args.shard} finished; with every shard's {os.path.join(stage, 'runs')} copied together, "
                  "--report writes the outputs")
            return
    report_dir = os.path.join(out, "per_scheme_lr") if args.per_scheme_lr else None
    for what, path in write_reports(out, command, lr_sweep=args.lr_sweep, rates=rates,
                                    report_dir=report_dir).items():
        print(f"{what}: {path}")


if __name__ == "__main__":
    from layerscale_jax.cli import run_cli
    sys.exit(run_cli(main))          # a mistake in the arguments, the dataset or a file: one error line, status 2
