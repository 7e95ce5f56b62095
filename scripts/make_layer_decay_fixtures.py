"""Write layer-wise lr decay reference tables from timm for the JAX tests.

Run by hand, from the repository root, with a Python environment that has torch and timm
(not the project's own environment; CI never runs this):

    /work/venv-timm/bin/python scripts/make_layer_decay_fixtures.py

It writes ``tests/fixtures/layer_decay/{deit3_small_patch16_224,cait_xxs24_224}.json``. For the
real-size timm models (random init, num_classes=1000) and every parameter name in timm naming
the file holds:

* ``shape``;
* ``timm_scale`` / ``timm_layer_id`` / ``weight_decay``: what
  ``timm.optim.param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.65,
  no_weight_decay_list=model.no_weight_decay())`` assigns. The layer id is read from timm's own
  group names (``layer_<id>_<decay|no_decay>``, logged with ``verbose=True``) and the scale and
  weight decay from the parameter groups it returns;
* ``mae_scale`` / ``mae_layer_id``: the MAE / BEiT fine-tuning rule, written here from its
  definition (see ``mae_layer_id`` below).
"""
from __future__ import annotations

import io
import json
import logging
import math
import re
import sys
from pathlib import Path

import timm
import torch
from timm.optim import param_groups_layer_decay

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = REPO_ROOT / "tests" / "fixtures" / "layer_decay"

WEIGHT_DECAY = 0.05
LAYER_DECAY = 0.65
EXPECTED_PARAMS = {"deit3_small_patch16_224": 22_059_496, "cait_xxs24_224": 11_956_264}


def mae_layer_id(name: str, depth: int, depth_token_only: int) -> tuple[int, int]:
    """(layer_id, num_layers) under the MAE / BEiT rule.

    Plain ViT (MAE ``get_layer_id_for_vit``): num_layers = depth + 1; cls_token, pos_embed,
    patch_embed.* -> 0; blocks.i.* -> i + 1; everything else (norm, fc_norm, head) -> num_layers.
    CaiT extension (our choice; MAE only knows plain ViTs): class-attention blocks
    blocks_token_only.j -> depth + 1 + j and num_layers = depth + depth_token_only + 1, so the
    final norm and head stay at scale 1.0.
    """
    num_layers = depth + depth_token_only + 1
    if name in ("cls_token", "pos_embed") or name.startswith("patch_embed"):
        return 0, num_layers
    m = re.match(r"^blocks\.(\d+)\.", name)
    if m:
        return int(m.group(1)) + 1, num_layers
    m = re.match(r"^blocks_token_only\.(\d+)\.", name)
    if m:
        return depth + 1 + int(m.group(1)), num_layers
    return num_layers, num_layers


def timm_groups(model: torch.nn.Module) -> tuple[list[dict], dict]:
    """Run timm's param_groups_layer_decay and capture its verbose group-name dump."""
    logger = logging.getLogger("timm.optim._param_groups")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.INFO)
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        groups = param_groups_layer_decay(
            model,
            weight_decay=WEIGHT_DECAY,
            layer_decay=LAYER_DECAY,
            no_weight_decay_list=model.no_weight_decay(),
            verbose=True,
        )
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
    text = stream.getvalue()
    start = text.index("{")
    named = json.loads(text[start:])
    return groups, named


def make(model_name: str) -> Path:
    torch.manual_seed(0)
    model = timm.create_model(model_name, pretrained=False, num_classes=1000)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == EXPECTED_PARAMS[model_name], (model_name, n_params)

    depth = len(model.blocks)
    depth_token_only = len(getattr(model, "blocks_token_only", []))
    groups, named_groups = timm_groups(model)

    # timm's view, by parameter identity (scale, weight decay) and by group name (layer id).
    by_id = {}
    for g in groups:
        for p in g["params"]:
            by_id[id(p)] = (float(g["lr_scale"]), float(g["weight_decay"]))
    name_to_layer = {}
    for gname, g in named_groups.items():
        m = re.fullmatch(r"layer_(\d+)_(decay|no_decay)", gname)
        assert m, gname
        for pname in g["param_names"]:
            name_to_layer[pname] = (int(m.group(1)), m.group(2) == "decay", float(g["lr_scale"]))
    timm_num_layers = max(v[0] for v in name_to_layer.values()) + 1

    params = {}
    for name, p in model.named_parameters():
        scale, wd = by_id[id(p)]
        layer_id, decays, scale_named = name_to_layer[name]
        assert scale == scale_named, (name, scale, scale_named)
        assert decays == (wd > 0), (name, wd)
        assert math.isclose(scale, LAYER_DECAY ** (timm_num_layers - 1 - layer_id), rel_tol=1e-12), name
        mae_id, mae_num = mae_layer_id(name, depth, depth_token_only)
        params[name] = {
            "shape": list(p.shape),
            "timm_layer_id": layer_id,
            "timm_scale": scale,
            "weight_decay": decays,
            "mae_layer_id": mae_id,
            "mae_scale": LAYER_DECAY ** (mae_num - mae_id),
        }
    assert len(params) == len(by_id)

    _, mae_num_layers = mae_layer_id("head.weight", depth, depth_token_only)
    notes = [
        "timm_scale = layer_decay ** (timm_num_layers - 1 - timm_layer_id); unmatched params (head, fc_norm) "
        "get the last layer id.",
        "weight_decay: timm puts every 1-D parameter and every name in no_weight_decay() in its no_decay "
        "groups (weight 0.0); all others get weight_decay=0.05.",
        "mae_scale = layer_decay ** (mae_num_layers - mae_layer_id); cls_token, pos_embed, patch_embed.* -> 0; "
        "blocks.i.* -> i + 1; everything else -> mae_num_layers (scale 1.0).",
    ]
    if depth_token_only:
        notes.append(
            "CaiT under the MAE rule is our extension (MAE only defines plain ViTs): class-attention blocks "
            "blocks_token_only.j -> depth + 1 + j, and mae_num_layers = depth + depth_token_only + 1 "
            f"= {mae_num_layers}, so norm and head stay at scale 1.0.")
        notes.append(
            "timm's CaiT group_matcher overlaps blocks_token_only.j with the last SA blocks "
            "(j + depth - depth_token_only + 1) and puts norm with the last SA block (id depth); see the "
            "timm_layer_id values.")
    else:
        notes.append(
            "timm's ViT group_matcher puts the final norm in the last block's group (MATCH_PREV_GROUP), "
            "so norm.* has scale layer_decay**1, not 1.0 as in MAE.")

    out = {
        "model_name": model_name,
        "description": ("Made by scripts/make_layer_decay_fixtures.py: timm.create_model(model_name, "
                        "pretrained=False, num_classes=1000) with torch.manual_seed(0), then "
                        "timm.optim.param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.65, "
                        "no_weight_decay_list=model.no_weight_decay(), verbose=True); layer ids parsed from "
                        "timm's logged group names; MAE columns computed from the rule in 'notes'."),
        "timm_version": timm.__version__,
        "torch_version": torch.__version__,
        "layer_decay": LAYER_DECAY,
        "weight_decay": WEIGHT_DECAY,
        "num_params": n_params,
        "num_param_tensors": len(params),
        "depth": depth,
        "depth_token_only": depth_token_only,
        "no_weight_decay": sorted(model.no_weight_decay()),
        "timm_num_layers": timm_num_layers,
        "mae_num_layers": mae_num_layers,
        "timm_group_names": sorted(named_groups, key=lambda g: (int(g.split("_")[1]), g)),
        "notes": notes,
        "params": params,
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{model_name}.json"
    with open(path, "w") as f:
        f.write(_dump_one_param_per_line(out))
    assert json.loads(path.read_text()) == out
    return path


def _dump_one_param_per_line(out: dict) -> str:
    """Pretty JSON with each entry of ``params`` on a single line (small, diff-friendly)."""
    head = {k: v for k, v in out.items() if k != "params"}
    text = json.dumps(head, indent=1)
    rows = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in out["params"].items()]
    return text[:-2] + ',\n "params": {\n' + ",\n".join(rows) + "\n }\n}\n"


def main() -> int:
    for name in EXPECTED_PARAMS:
        path = make(name)
        print(f"{path.stat().st_size:>10,d}  {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
