"""The command line of the benchmarks, ``python -m layerscale_jax.bench SUBCOMMAND``: one subcommand per entry of
``entries.ENTRIES`` (``python -m layerscale_jax.bench -h`` lists them)."""
from __future__ import annotations

import argparse
import json
import sys

from layerscale_jax.bench.entries import DTYPES, ENTRIES, remat_policies, call, display

# The StepSpec flags an entry may take (``Entry.spec`` names them and gives their defaults).
SPEC_FLAGS = {
    "model": ("--model", {}),
    "batch": ("--batch", {"type": int}),
    "dtype": ("--dtype", {"choices": DTYPES}),
    "scan": ("--scan", {"action": "store_true", "help": "scan over stacked layers (scan_layers=True)"}),
    "remat": ("--remat", {"choices": remat_policies()}),
    "set": ("--set", {"action": "append", "metavar": "KEY=VALUE",
                      "help": "model override, repeatable (e.g. --set depth=6 --set embed_dim=64)"}),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m layerscale_jax.bench",
                                     description="layerscale-jax benchmarks (benchmarks/README.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, e in ENTRIES.items():
        p = sub.add_parser(name, **({} if e.hidden else {"help": e.help}), description=e.run.__doc__)
        for field, default in e.spec.items():
            flag, kwargs = SPEC_FLAGS[field]
            p.add_argument(flag, default=default, **kwargs)
        for flag, kwargs in e.args:
            p.add_argument(flag, **kwargs)
        if name != "report":
            p.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = call(args.command, vars(args))
    if getattr(args, "json", False):
        print(json.dumps(result, default=float))
    else:
        display(args.command, result)
    sys.stdout.flush()
    return 0
