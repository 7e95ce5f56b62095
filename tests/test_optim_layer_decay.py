"""Layer-wise LR multipliers and the weight-decay mask equal timm's and MAE's, for real-size models in both layouts.

The reference tables (tests/fixtures/layer_decay/*.json) were written by scripts/make_layer_decay_fixtures.py with
timm 1.0.31: ``timm.optim.param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.65,
no_weight_decay_list=model.no_weight_decay())`` and the MAE rule. Models here are abstract (``nnx.eval_shape``).
"""
import functools
import json
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from layerscale_jax import create_model, optim
from layerscale_jax.models import groups

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "layer_decay"
MODELS = ("deit3_small_patch16_224", "cait_xxs24_224")


@functools.lru_cache(maxsize=None)
def fixture(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


@functools.lru_cache(maxsize=None)
def abstract_model(name, scan_layers):
    return nnx.eval_shape(lambda: create_model(name, scan_layers=scan_layers))


def timm_name(path, cait):
    """Our unrolled param path → timm's state-dict name."""
    *modules, leaf = (str(k) for k in path)
    if leaf == "gamma" and cait:  # CaiT keeps LayerScale as gamma_1 / gamma_2 on the block
        return ".".join(modules[:-1] + [f"gamma_{modules[-1][-1]}"])
    leaf = {"kernel": "weight", "scale": "weight"}.get(leaf, leaf)
    return ".".join(modules + [leaf])


def per_timm_name(model, tree):
    """A params-shaped tree → {timm name: value}, one entry per layer for stacked params."""
    cait = "blocks_token_only" in nnx.to_pure_dict(nnx.state(model, nnx.Param))
    flat = {}
    for jax_path, value in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(tree))[0]:
        path = groups.param_path(jax_path)
        if model.cfg.scan_layers and path[0] == "blocks":
            assert np.shape(value) == (model.cfg.depth,), (path, value)
            for i in range(model.cfg.depth):
                flat[timm_name(("blocks", i) + path[1:], cait)] = np.asarray(value)[i]
        else:
            assert np.ndim(value) == 0, (path, value)
            flat[timm_name(path, cait)] = value
    return flat


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("name", MODELS)
def test_every_timm_parameter_is_covered_with_its_size(name, scan_layers):
    model = abstract_model(name, scan_layers)

    def layer_size(path, x):  # the size of one layer's slice of a stacked param
        if scan_layers and path[0] == "blocks":
            return np.full(x.shape[0], np.prod(x.shape[1:]))
        return int(np.prod(x.shape))

    sizes = per_timm_name(model, groups.map_params(layer_size, nnx.state(model, nnx.Param)))
    ref = fixture(name)["params"]
    assert sorted(sizes) == sorted(ref)
    for timm, size in sizes.items():
        assert size == np.prod(ref[timm]["shape"]), timm


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("convention", ["timm", "mae"])
@pytest.mark.parametrize("name", MODELS)
def test_layer_ids_and_lr_scales_match_reference(name, convention, scan_layers):
    model = abstract_model(name, scan_layers)
    ref = fixture(name)
    ids = per_timm_name(model, groups.layer_group_ids(model, convention))
    scales = per_timm_name(model, optim.layer_decay_scales(model, ref["layer_decay"], convention))
    for timm, row in ref["params"].items():
        assert ids[timm] == row[f"{convention}_layer_id"], timm
        np.testing.assert_allclose(scales[timm], row[f"{convention}_scale"], rtol=1e-12, err_msg=timm)


@pytest.mark.parametrize("name", MODELS)
def test_number_of_layer_groups_matches_reference(name):
    model = abstract_model(name, False)
    ref = fixture(name)
    assert groups.num_layer_groups(model, "timm") == ref["timm_num_layers"]
    assert groups.num_layer_groups(model, "mae") == ref["mae_num_layers"] + 1  # ids 0..mae_num_layers


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("name", MODELS)
def test_weight_decay_mask_matches_timm_no_weight_decay_set(name, scan_layers):
    model = abstract_model(name, scan_layers)
    mask = optim.weight_decay_mask(model)
    if scan_layers:  # one flag per stacked param, expanded to its layers for the comparison
        mask = groups.map_params(lambda p, m: np.full(model.cfg.depth, m) if p[0] == "blocks" else m, mask)
    decays = per_timm_name(model, mask)
    for timm, row in fixture(name)["params"].items():
        assert bool(decays[timm]) == row["weight_decay"], timm


def test_min_scale_floors_the_multiplier_and_decay_one_is_off():
    model = abstract_model("deit3_small_patch16_224", True)
    floored = nnx.to_pure_dict(optim.layer_decay_scales(model, 0.65, "mae", min_scale=0.05))
    assert floored["cls_token"] == 0.05
    np.testing.assert_allclose(floored["blocks"]["ls1"]["gamma"][-1], 0.65)
    assert min(floored["blocks"]["ls1"]["gamma"]) == 0.05
    ones = optim.layer_decay_scales(model, 1.0, "timm")
    assert all(np.all(np.asarray(s) == 1.0) for s in jax.tree.leaves(ones))


@pytest.mark.parametrize("decay", [0.0, -0.5, 1.5])
def test_decay_outside_unit_interval_is_rejected(decay):
    with pytest.raises(ValueError, match="layer_decay"):
        optim.layer_decay_scales(abstract_model("deit3_small_patch16_224", False), decay, "mae")


def test_multiplier_that_underflows_float32_is_rejected_unless_floored():
    model = nnx.eval_shape(lambda: create_model("deit3_small_patch16_224", depth=200, embed_dim=8, num_heads=2,
                                                scan_layers=True))
    with pytest.raises(ValueError, match="layer_decay=0.5 over 202 layer groups.*layer_decay_min_scale"):
        optim.layer_decay_scales(model, 0.5, "mae")
    assert nnx.to_pure_dict(optim.layer_decay_scales(model, 0.5, "mae", min_scale=1e-6))["cls_token"] == 1e-6


def test_unknown_convention_is_rejected():
    with pytest.raises(ValueError, match="layer_decay_convention='beit'"):
        groups.layer_group_ids(abstract_model("deit3_small_patch16_224", False), "beit")


def test_param_no_group_claims_is_named():
    model = nnx.eval_shape(lambda: create_model("deit3_small_patch16_224", depth=1, embed_dim=8, num_heads=2))
    model.register_token = nnx.Param(jax.ShapeDtypeStruct((1, 1, 8), np.float32))
    with pytest.raises(ValueError, match="no layer group claims.*register_token"):
        groups.layer_group_ids(model, "mae")
    with pytest.raises(ValueError, match=r"\['register_token'\] carry no role"):
        optim.weight_decay_mask(model)


def test_table_counts_every_parameter_once_per_group():
    model = abstract_model("cait_xxs24_224", True)
    config = optim.default_config()
    config.layer_decay = 0.65
    config.layer_decay_convention = "timm"
    bundle = optim.build(config, model, total_steps=10)
    ref = fixture("cait_xxs24_224")
    assert sum(r.params for r in bundle.rows) == ref["num_params"]
    assert [r.group for r in bundle.rows] == list(range(ref["timm_num_layers"]))
    by_group = {r.group: r for r in bundle.rows}
    assert set(by_group[24].members) == {"blocks.23", "blocks_token_only.1", "norm"}
    assert by_group[25].members == ("head",) and by_group[25].lr_scale == 1.0
    table = bundle.table()
    assert "11,956,264 params" in table and "blocks_token_only.0" in table
