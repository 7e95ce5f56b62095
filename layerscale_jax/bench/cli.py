"""Command line of the benchmark suite (``python -m layerscale_jax.bench``)."""
from __future__ import annotations

import argparse
import ast
import json
import sys

from layerscale_jax.bench import timing

DTYPES = ("float32", "bfloat16")


def parse_overrides(items: list[str] | None) -> dict:
    """``["depth=6", "embed_dim=64", "branch_scaling=none"]`` → ``{"depth": 6, ...}`` (Python literals or strings)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. --set depth=6")
        key, value = item.split("=", 1)
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def _fmt_bytes(n) -> str:
    return "n/a" if n is None else f"{n / 2 ** 20:,.0f} MiB"


def _fmt_flops(x) -> str:
    return "n/a" if x is None else f"{x / 1e9:,.1f} G"


def print_train_step(r: dict) -> None:
    print(f"{r['model']} batch {r['batch']} {r['dtype']} scan={r['scan']} remat={r['remat']} "
          f"overrides={r['overrides']} ({r['num_params']:,} params)")
    print(f"  step time        {r['step_time_s'] * 1e3:9.1f} ms   ({r['step_time']['repeats']} repeats of "
          f"{r['step_time']['calls_per_repeat']} steps; min {r['step_time']['min_s'] * 1e3:.1f}, "
          f"max {r['step_time']['max_s'] * 1e3:.1f})")
    print(f"  throughput       {r['img_per_s']:9.2f} img/s")
    ratio = r.get("flops_xla_over_analytic")
    print(f"  FLOPs / step     {_fmt_flops(r['flops_per_step'])} ({r['flops_per_step_source']}); analytic "
          f"{_fmt_flops(r['flops_analytic'])}; xla/analytic "
          f"{'n/a' if ratio is None else f'{ratio:.3f}'}")
    mfu = r.get("mfu")
    peak = r.get("matmul_peak_flop_per_s")
    print(f"  achieved         {r['achieved_flop_per_s'] / 1e9:9.1f} GFLOP/s (model FLOPs); matmul peak "
          f"{'n/a' if peak is None else f'{peak / 1e9:.1f} GFLOP/s'}; MFU "
          f"{'n/a' if mfu is None else f'{100 * mfu:.1f}%'}")
    print(f"  peak memory      {_fmt_bytes(r['peak_memory_bytes'])} ({r['peak_memory_source']}); XLA plan "
          f"{_fmt_bytes(r['xla_memory'].get('peak_bytes'))}")
    print(f"  compile          {r['compile_s']:9.2f} s (trace+lower {r['lower_s']:.2f} s)")
    if "ratio_vs_timm" in r:
        if r.get("timm_img_per_s") is None:
            print(f"  timm             skipped: {r.get('timm_skipped')}")
        else:
            tm = r.get("timm_mfu")
            print(f"  timm             {r['timm_img_per_s']:9.2f} img/s ({r['timm_step_time_s'] * 1e3:.1f} ms, "
                  f"torch {r['torch_version']}, {r['timm_threads']} threads, MFU "
                  f"{'n/a' if tm is None else f'{100 * tm:.1f}%'} of torch's "
                  f"{r['timm_matmul_peak_flop_per_s'] / 1e9:.1f} GFLOP/s)")
            print(f"  ours / timm      {r['ratio_vs_timm']:9.3f}x")
    print(f"  load average     {timing.load_average()}")


def cmd_train_step(args) -> dict:
    if args.config:
        from layerscale_jax.bench.trainer import measure_trainer_step
        return measure_trainer_step(args.config, repeats=args.repeats, min_repeat_s=args.min_repeat_s)
    from layerscale_jax.bench.step import StepSpec, measure_train_step
    spec = StepSpec(model=args.model, batch=args.batch, dtype=args.dtype, scan=args.scan, remat=args.remat,
                    overrides=parse_overrides(args.set))
    timm_kwargs = {"adamw": args.timm_adamw}
    r = measure_train_step(spec, vs_timm=args.vs_timm, repeats=args.repeats, min_repeat_s=args.min_repeat_s,
                           timm_kwargs=timm_kwargs)
    r["machine"] = timing.machine_info()
    return r


def _print_train_step(r: dict) -> None:
    if r.get("benchmark") == "trainer_step":
        from layerscale_jax.bench.trainer import print_trainer_step
        print_trainer_step(r)
    else:
        print_train_step(r)


def cmd_optimizer(args) -> dict:
    from layerscale_jax.bench.trainer import bench_optimizer
    return bench_optimizer(args.config, args.depths, tuple(args.layouts.split(",")), args.layer_decays,
                           repeats=args.repeats)


def _print_optimizer(r: dict) -> None:
    from layerscale_jax.bench.trainer import print_optimizer
    print_optimizer(r)


def cmd_matmul(args) -> dict:
    out = {"machine": timing.machine_info(), "jax": {}, "torch": {}}
    for dt in DTYPES:
        out["jax"][dt] = timing.matmul_peak(dt, n=args.n)
    try:
        import torch  # noqa: F401
        for dt in DTYPES:
            out["torch"][dt] = timing.torch_matmul_peak(dt, n=args.n or 2048)
    except ImportError:
        out["torch"] = "torch not importable"
    return out


def print_matmul(r: dict) -> None:
    for side in ("jax", "torch"):
        if isinstance(r[side], str):
            print(f"{side:6s} {r[side]}")
            continue
        for dt, v in r[side].items():
            print(f"{side:6s} {dt:9s} n={v['n']}: {v['flop_per_s'] / 1e9:8.1f} GFLOP/s")


def build_parser() -> argparse.ArgumentParser:
    from layerscale_jax.bench import suite
    from layerscale_jax.models.stack import REMAT_POLICIES

    parser = argparse.ArgumentParser(prog="python -m layerscale_jax.bench",
                                     description="layerscale-jax benchmarks (issue 7)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train_step", help="one training step, optionally against timm")
    p.add_argument("--config", default=None, metavar="configs/X.py[:ARGS]",
                   help="time the trainer's own step (create_trainer) for this config against the model-only "
                        "step and its optimizer against plain AdamW (the model options below are then ignored)")
    p.add_argument("--model", default="deit3_small_patch16_224")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--scan", action="store_true", help="scan over stacked layers (scan_layers=True)")
    p.add_argument("--remat", choices=tuple(REMAT_POLICIES), default="none")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="model override, repeatable (e.g. --set depth=6 --set embed_dim=64)")
    p.add_argument("--vs-timm", action="store_true", help="time timm's model of the same name side by side")
    p.add_argument("--timm-adamw", choices=("default", "fused", "foreach"), default="default",
                   help="torch AdamW implementation for the timm side")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-repeat-s", type=float, default=0.5)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=cmd_train_step, show=_print_train_step)

    p = sub.add_parser("optimizer", help="the trainer's optimizer update vs plain AdamW, against depth")
    p.add_argument("--config", default="configs/digits_layerscale.py", metavar="configs/X.py[:ARGS]")
    p.add_argument("--depths", type=lambda s: tuple(int(x) for x in s.split(",")), default=(12, 24, 48, 96))
    p.add_argument("--layouts", default="unrolled,scan")
    p.add_argument("--layer-decays", type=lambda s: tuple(float(x) for x in s.split(",")), default=(0.75, 1.0))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_optimizer, show=_print_optimizer)

    p = sub.add_parser("matmul", help="matmul peak of jax (and torch) on this device")
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_matmul, show=print_matmul)

    p = sub.add_parser("profile", help="where the train step's time goes, per XLA operation")
    p.add_argument("--model", default="deit3_small_patch16_224")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="model override, repeatable")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_profile, show=_print_profile)

    p = sub.add_parser("timm_worker", help=argparse.SUPPRESS)
    p.add_argument("request")
    p.set_defaults(run=lambda a: _timm_worker(a.request), show=lambda r: None)

    suite.add_subcommands(sub)
    return parser


def _timm_worker(request: str) -> None:
    from layerscale_jax.bench.timm_side import worker_main
    worker_main(request)


def cmd_profile(args) -> dict:
    from layerscale_jax.bench.profile import profile_step
    from layerscale_jax.bench.step import StepSpec
    spec = StepSpec(model=args.model, batch=args.batch, dtype=args.dtype, overrides=parse_overrides(args.set))
    return profile_step(spec, steps=args.steps, top=args.top)


def _print_profile(r: dict) -> None:
    from layerscale_jax.bench.profile import print_profile
    print_profile(r)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = args.run(args)
    if getattr(args, "json", False):
        print(json.dumps(result, default=float))
    elif result is not None:
        args.show(result)
    sys.stdout.flush()
    return 0
