"""``python -m layerscale_jax.bench SUBCOMMAND``: one subcommand per entry, its flags read off the function.

A parameter ``name: T = default`` becomes ``--name`` (``bool``: a switch; ``tuple[T, ...]``: comma-separated; no
default: positional); ``spec`` becomes ``--model --batch --dtype --scan --remat --set KEY=VALUE``.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import sys

from layerscale_jax.bench.entries import ENTRIES, display
from layerscale_jax.bench.step import StepSpec
from layerscale_jax.errors import ConfigError

TYPES = {"int": int, "float": float, "str": str}
HELP = {"vs_timm": "time timm's model of the same name alternately with ours",
        "vs_peer": "time big_vision's ViT architecture (re-implemented in the bench with flax linen; ViT models "
                   "only) alternately with ours",
        "timm_python": "the Python that runs timm's worker (one with torch and timm; default: this one)",
        "set": "model override, repeatable (e.g. --set depth=6 --set embed_dim=64)"}


def parse_overrides(items: list[str] | None) -> dict:
    """``["depth=6", "branch_scaling=none"]`` → ``{"depth": 6, "branch_scaling": "none"}`` (literals or strings)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set depth=6")
        key, value = item.split("=", 1)
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def add_flags(p: argparse.ArgumentParser, fn) -> None:
    for name, param in inspect.signature(fn).parameters.items():
        flag, default, kind = "--" + name.replace("_", "-"), param.default, str(param.annotation)
        if name == "spec":
            for field in dataclasses.fields(StepSpec)[:5]:
                p.add_argument(f"--{field.name}", default=getattr(default, field.name),
                               **({"action": "store_true"} if field.type == "bool" else {"type": TYPES[field.type]}))
            p.add_argument("--set", action="append", metavar="KEY=VALUE", help=HELP["set"])
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            p.add_argument(name, nargs="+")
        elif default is inspect.Parameter.empty:
            p.add_argument(name)
        elif kind == "bool":
            p.add_argument(flag, action="store_true", help=HELP.get(name))
        elif element := re.match(r"tuple\[(\w+)", kind):
            p.add_argument(flag, default=default, metavar="A,B,...", help=HELP.get(name), type=lambda s, t=TYPES[
                element.group(1)]: tuple(t(x) for x in s.split(",")))
        elif kind.split(" |")[0] in TYPES:
            p.add_argument(flag, default=default, type=TYPES[kind.split(" |")[0]], help=HELP.get(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m layerscale_jax.bench",
                                     description="layerscale-jax benchmarks (benchmarks/README.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (fn, _, hidden) in ENTRIES.items():
        summary = " ".join(re.split(r"[.:;](?:\s|$)", fn.__doc__)[0].split())          # the docstring's first clause
        p = sub.add_parser(name, description=fn.__doc__, **({} if hidden else {"help": summary}))
        add_flags(p, fn)
        p.add_argument("--json", action="store_true", help="print one JSON object")
    args = vars(parser.parse_args(argv))
    fn = ENTRIES[args["command"]][0]
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in args.items() if k in params}
    if "model" in args:
        kwargs["spec"] = StepSpec(**{k: args[k] for k in ("model", "batch", "dtype", "scan", "remat")},
                                  overrides=parse_overrides(args["set"]))
    varargs = [k for k, prm in params.items() if prm.kind is inspect.Parameter.VAR_POSITIONAL]
    result = fn(*kwargs.pop(varargs[0]), **kwargs) if varargs else fn(**kwargs)
    print(json.dumps(result, default=float)) if args["json"] else display(args["command"], result)
    sys.stdout.flush()
    return 0
