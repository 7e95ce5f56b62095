r"""Convert pretrained weights.

    # timm / official checkpoint → our orbax checkpoint (for --config.train.init_from)
    python -m layerscale_jax.convert --model deit3_small_patch16_224 --source deit3_small.safetensors \
        --out runs/deit3_small_in1k [--num-classes 100] [--img-size 384] [--scan-layers]

    # our checkpoint (or a timm file) → a timm safetensors file
    python -m layerscale_jax.convert --source runs/finetuned --export-timm finetuned.safetensors
"""
from __future__ import annotations

import argparse
import ast
import logging
import sys
from pathlib import Path

from layerscale_jax.convert.files import write_state_dict
from layerscale_jax.convert.pretrained import (MODEL_JSON, from_timm, load_model, read_model_json, save_pretrained,
                                               to_timm)


log = logging.getLogger("layerscale_jax.convert")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m layerscale_jax.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="registered model name (e.g. deit3_small_patch16_224); optional when "
                                        "--source is a save_pretrained directory (its model.json is used)")
    parser.add_argument("--source", required=True,
                        help=".safetensors / .npz / .pth file (timm or official naming) or a save_pretrained dir")
    parser.add_argument("--out", help="write an orbax param checkpoint + model.json here")
    parser.add_argument("--export-timm", metavar="FILE", help="write a timm state dict (.safetensors or .npz)")
    parser.add_argument("--num-classes", type=int, help="re-initialise the head for this many classes")
    parser.add_argument("--img-size", type=int, help="target image size (pos_embed is resampled bicubically)")
    parser.add_argument("--scan-layers", action="store_true", default=None,
                        help="build the model with scan_layers=True (blocks stacked on a leading axis)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="any other create_model override, e.g. --set global_pool=avg (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out checkpoint")
    args = parser.parse_args(argv)
    if not args.out and not args.export_timm:
        parser.error("nothing to write: pass --out DIR and/or --export-timm FILE")
    if args.model is None and not (Path(args.source) / MODEL_JSON).is_file():
        parser.error(f"--model is required unless --source is a save_pretrained directory (got {args.source!r})")
    return args


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
            raise SystemExit(f"--set expects FIELD=VALUE, got {item!r}")
        overrides[field.strip()] = _literal(value.strip())
    overrides.update({k: v for k, v in (("num_classes", args.num_classes), ("img_size", args.img_size),
                                        ("scan_layers", args.scan_layers)) if v is not None})
    return overrides


def main(argv=None) -> int:
    args = parse_args(argv)
    overrides = parse_overrides(args)
    if args.model is None:
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
    sys.exit(main())
