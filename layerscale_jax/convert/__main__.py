r"""Convert pretrained weights.

    # timm / official checkpoint → our orbax checkpoint (for --config.train.init_from)
    python -m layerscale_jax.convert --model deit3_small_patch16_224 --source deit3_small.safetensors \
        --out runs/deit3_small_in1k [--num-classes 100] [--img-size 384] [--scan-layers]

    # a training workdir (its newest checkpoint; the model comes from the config stored with it), our
    # save_pretrained directory or a timm file → a timm safetensors file (and/or --out DIR)
    python -m layerscale_jax.convert --source runs/digits --export-timm digits.safetensors [--step N] [--no-ema]
    python -m layerscale_jax.convert --source runs/finetuned --export-timm finetuned.safetensors

Nothing is overwritten without ``--overwrite`` (an earlier ``--out`` conversion, an ``--export-timm`` file), and a
training workdir is never written into; both outputs are checked before anything is read.

A bad input (a missing or unreadable file, a file that is not what its name says, mismatched keys, an unknown
model, an output that exists or cannot be written) is reported in one line, ``error: ...``, with exit status 2;
``--debug`` adds the traceback.
"""
from __future__ import annotations

import argparse
import ast
import logging
import sys
import tempfile
from pathlib import Path

from layerscale_jax.cli import run_cli
from layerscale_jax.convert.files import write_state_dict
from layerscale_jax.convert.pretrained import from_timm, load_model, load_workdir, save_pretrained, to_timm
from layerscale_jax.convert.sources import MODEL_JSON, PARAMS_DIR, read_model_json
from layerscale_jax.convert.workdir import is_training_workdir
from layerscale_jax.errors import UserError

log = logging.getLogger("layerscale_jax.convert")

# A directory holding any of these is (or was) a training workdir, whatever else it holds.
TRAINING_WORKDIR_FILES = ("checkpoints", "metrics.jsonl", "results.json", "config.json", "lock.json")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m layerscale_jax.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="registered model name (e.g. deit3_small_patch16_224); optional when "
                                        "--source is a save_pretrained directory (its model.json is used) or a "
                                        "training workdir (the config stored with its checkpoint is used)")
    parser.add_argument("--source", required=True,
                        help=".safetensors / .npz / .pth file (timm or official naming), a save_pretrained dir "
                             "or a training workdir")
    parser.add_argument("--step", type=int, help="training workdir: this checkpoint step (default: the newest)")
    parser.add_argument("--ema", action=argparse.BooleanOptionalAction, default=None,
                        help="training workdir: the EMA of the parameters (--ema) or the parameters (--no-ema); "
                             "default: the EMA when the run kept one, as its evaluation used")
    parser.add_argument("--out", help="write an orbax param checkpoint + model.json here")
    parser.add_argument("--export-timm", metavar="FILE", help="write a timm state dict (.safetensors or .npz)")
    parser.add_argument("--num-classes", type=int, help="re-initialise the head for this many classes")
    parser.add_argument("--img-size", type=int, help="target image size (pos_embed is resampled bicubically)")
    parser.add_argument("--scan-layers", action="store_true", default=None,
                        help="build the model with scan_layers=True (blocks stacked on a leading axis)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="any other create_model override, e.g. --set global_pool=avg (repeatable)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out checkpoint or --export-timm file")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error as well "
                                                             "(or set LAYERSCALE_JAX_DEBUG=1)")
    args = parser.parse_args(argv)
    if not args.out and not args.export_timm:
        parser.error("nothing to write: pass --out DIR and/or --export-timm FILE")
    source = Path(args.source)
    if not source.exists():
        raise FileNotFoundError(f"--source {args.source!r} does not exist")
    workdir = is_training_workdir(source)
    if args.model is None and not (source / MODEL_JSON).is_file() and not workdir:
        parser.error(f"--model is required unless --source is a save_pretrained directory or a training workdir "
                     f"(got {args.source!r})")
    if args.model is not None and workdir:
        parser.error(f"--source {args.source!r} is a training workdir: its stored config names the model "
                     f"(leave out --model; change fields with --set FIELD=VALUE)")
    if (args.step is not None or args.ema is not None) and not workdir:
        parser.error(f"--step and --ema apply to a training workdir; {args.source!r} is not one")
    check_outputs(args)
    return args


def check_outputs(args: argparse.Namespace) -> None:
    """Before anything is read: ``--out`` and ``--export-timm`` can be written, and nothing is overwritten
    without ``--overwrite`` — never a training workdir. Raises ``UserError`` naming the flag and the path."""
    if args.out:
        out = Path(args.out).expanduser()
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {args.out!r} is a file, not a directory; name a new directory")
        if out.is_dir() and any((out / name).exists() for name in TRAINING_WORKDIR_FILES):
            raise UserError(f"--out {args.out!r} is a training workdir; convert never writes into one: name a new "
                            "directory")
        if (out / PARAMS_DIR).exists() and not args.overwrite:
            raise UserError(f"--out {args.out!r} holds a converted checkpoint already; pass --overwrite to "
                            "replace it, or name a new directory")
        _check_writable("--out", args.out, out)
    if args.export_timm:
        path = Path(args.export_timm).expanduser()
        if path.is_dir():
            raise UserError(f"--export-timm {args.export_timm!r} is a directory; name a .safetensors or .npz file")
        if path.exists() and not args.overwrite:
            raise UserError(f"--export-timm {args.export_timm!r} exists; pass --overwrite to replace it")
        _check_writable("--export-timm", args.export_timm, path.parent)


def _check_writable(flag: str, given: str, directory: Path) -> None:
    """A file can be created in ``directory`` (or in its nearest existing parent, where it would be created)."""
    existing = directory.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {given!r} cannot be written ({existing} is a file); choose another place")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
        return
    except OSError as err:
        problem = err.strerror or str(err)
    raise UserError(f"{flag} {given!r} cannot be written ({problem}: {existing}); choose another place")


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text                                        # a bare string such as avg


def parse_overrides(args: argparse.Namespace) -> dict:
    overrides = {}
    for item in args.overrides:
        field, sep, value = item.partition("=")
        if not sep or not field:
            raise UserError(f"--set expects FIELD=VALUE, got {item!r}")
        overrides[field.strip()] = _literal(value.strip())
    overrides.update({k: v for k, v in (("num_classes", args.num_classes), ("img_size", args.img_size),
                                        ("scan_layers", args.scan_layers)) if v is not None})
    return overrides


def main(argv=None) -> int:
    args = parse_args(argv)
    overrides = parse_overrides(args)
    if args.model is None and is_training_workdir(args.source):
        model, name = load_workdir(args.source, step=args.step, ema=args.ema, **overrides)
    elif args.model is None:
        name = read_model_json(args.source)["model"]
        model = load_model(args.source, **overrides)
    else:
        name = args.model
        model = from_timm(name, args.source, **overrides)
    if args.out:
        out = save_pretrained(model, args.out, name=name, overwrite=args.overwrite)
        log.info("wrote %s (orbax params + model.json)", out)
    if args.export_timm:
        path = write_state_dict(to_timm(model), args.export_timm)
        log.info("wrote %s (timm naming)", path)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)    # orbax logs every step of a save at INFO
    logging.getLogger("jax").setLevel(logging.WARNING)
    sys.exit(run_cli(main))
