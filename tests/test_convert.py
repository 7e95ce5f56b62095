"""Pretrained-weight conversion against timm fixtures (made with timm 1.0.31 by scripts/make_parity_fixtures.py).

No torch needed: the fixtures hold timm's state dicts, an input batch and timm's eval-mode logits.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from layerscale_jax import create_model
from layerscale_jax.convert import (from_timm, load_model, load_pretrained, read_model_json, read_state_dict,
                                    resize_pos_embed, save_pretrained, to_timm, write_state_dict)
from layerscale_jax.convert.__main__ import main as convert_main
from layerscale_jax.convert.naming import qkv_heads_major
from layerscale_jax.convert.flat import unrolled_params

FIXTURES = Path(__file__).parent / "fixtures" / "timm"
CASES = ["deit3_tiny", "deit3_tiny_img48", "deit3_tiny_avgpool", "cait_tiny", "posembed_resize"]
TOL = 1e-4


@functools.lru_cache(maxsize=None)
def _fixture(case: str):
    meta = json.loads((FIXTURES / f"{case}.json").read_text())
    tensors = load_file(str(FIXTURES / f"{case}.safetensors"))
    extras = {k: tensors.pop(k) for k in list(tensors) if k.startswith("__")}
    kwargs = {k: v for k, v in meta["create_model_kwargs"].items() if k != "pretrained"}
    return meta["model_name"], kwargs, tensors, extras


def fixture(case: str):
    """(timm model name, create_model kwargs, timm state dict, {'__input__' NHWC, '__logits__', ...})."""
    name, kwargs, tensors, extras = _fixture(case)
    extras = dict(extras, __input__=extras["__input__"].transpose(0, 2, 3, 1))
    return name, dict(kwargs), dict(tensors), extras


def logits(model, images):
    """Eval-mode logits through one jitted call (a single compile instead of one per op)."""
    model.eval()
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, images))


def params_equal(a, b) -> bool:
    pa, pb = unrolled_params(a), unrolled_params(b)
    return pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)


# --- parity with timm --------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("case", CASES)
def test_logits_match_timm(case, scan_layers):
    name, kwargs, state_dict, extras = fixture(case)
    model = from_timm(name, state_dict, scan_layers=scan_layers, **kwargs)
    diff = np.abs(logits(model, extras["__input__"]) - extras["__logits__"]).max()
    assert diff < TOL, f"{case}: max |ours - timm| = {diff}"


def test_pos_embed_resize_matches_timm_resample():
    _, _, state_dict, extras = fixture("posembed_resize")
    ours = resize_pos_embed(state_dict["pos_embed"], (6, 6))
    np.testing.assert_allclose(ours, extras["__resampled_pos_embed__"], atol=1e-5, rtol=0)


def test_loading_at_another_img_size_resamples_pos_embed():
    name, kwargs, state_dict, extras = fixture("posembed_resize")      # 32px weights, 48px model
    model = from_timm(name, state_dict, **kwargs)
    np.testing.assert_allclose(np.asarray(model.pos_embed[...]), extras["__resampled_pos_embed__"], atol=1e-5)


# --- export ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["deit3_tiny", "deit3_tiny_avgpool", "cait_tiny"])
def test_to_timm_reproduces_the_timm_state_dict_bit_exactly(case):
    name, kwargs, state_dict, _ = fixture(case)
    for scan_layers in (False, True):
        exported = to_timm(from_timm(name, state_dict, scan_layers=scan_layers, **kwargs))
        assert exported.keys() == state_dict.keys()
        for key, value in state_dict.items():
            assert exported[key].dtype == value.dtype and np.array_equal(exported[key], value), key


def test_export_then_import_is_bit_exact():
    name, kwargs, state_dict, _ = fixture("cait_tiny")
    model = from_timm(name, state_dict, scan_layers=True, **kwargs)
    again = from_timm(name, to_timm(model), **kwargs)
    assert params_equal(model, again)


def test_to_timm_refuses_parameters_timm_cannot_name():
    model = nnx.eval_shape(lambda: create_model("deit3_small_patch16_224", img_size=32, patch_size=8, embed_dim=32,
                                                depth=1, num_heads=2, num_classes=3, branch_scaling="scalar",
                                                init_values=0.1))
    with pytest.raises(ValueError, match=r"blocks\.0\.ls1\.alpha"):
        to_timm(model)


# --- files -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_weights_file_round_trip(tmp_path, suffix):
    name, kwargs, state_dict, extras = fixture("deit3_tiny")
    path = write_state_dict(state_dict, tmp_path / f"weights{suffix}")
    assert read_state_dict(path).keys() == state_dict.keys()
    model = from_timm(name, path, **kwargs)
    assert np.abs(logits(model, extras["__input__"]) - extras["__logits__"]).max() < TOL
    assert "torch" not in sys.modules


def test_unknown_file_format_is_refused(tmp_path):
    path = tmp_path / "weights.h5"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"\.h5"):
        load_pretrained(nnx.eval_shape(lambda: create_model("deit3_small_patch16_224", depth=1)), path)


# --- official naming variants ------------------------------------------------------------------------------------

def test_official_deit3_checkpoint_gamma_names_under_model_key():
    name, kwargs, state_dict, _ = fixture("deit3_tiny")
    official = {"model": {k.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2"): v
                          for k, v in state_dict.items()}, "epoch": 799}
    assert any("gamma_1" in k for k in official["model"])
    assert params_equal(from_timm(name, official, **kwargs), from_timm(name, state_dict, **kwargs))


def test_official_cait_checkpoint_module_prefix_under_model_key():
    name, kwargs, state_dict, _ = fixture("cait_tiny")
    official = {"model": {f"module.{k}": v for k, v in state_dict.items()}}
    assert params_equal(from_timm(name, official, **kwargs), from_timm(name, state_dict, **kwargs))


# --- errors ------------------------------------------------------------------------------------------------------

def test_missing_unexpected_and_mismatched_keys_are_reported_together_and_nothing_is_loaded():
    name, kwargs, state_dict, _ = fixture("deit3_tiny")
    model = from_timm(name, state_dict, **kwargs)
    before = unrolled_params(model)
    del state_dict["blocks.1.ls2.gamma"]
    state_dict["blocks.0.attn.extra.weight"] = np.zeros((4, 4), np.float32)
    state_dict["blocks.0.mlp.fc1.weight"] = np.full((64, 32), 2.0, np.float32)
    state_dict["blocks.0.mlp.fc2.weight"] = state_dict["blocks.0.mlp.fc2.weight"] + 1.0   # loadable, not loaded
    with pytest.raises(ValueError) as err:
        load_pretrained(model, state_dict)
    message = str(err.value)
    assert "1 missing, 1 unexpected, 1 shape-mismatched" in message
    assert "'blocks.1.ls2.gamma': expected shape (32,)" in message
    assert "'blocks.0.attn.extra.weight'" in message and "found shape (4, 4)" in message
    assert "'blocks.0.mlp.fc1.weight' (ours 'blocks.0.mlp.fc1.kernel'): expected shape (128, 32), found (64, 32)" \
        in message
    after = unrolled_params(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_wrong_architecture_error_hints_at_the_source_architecture():
    name, kwargs, state_dict, _ = fixture("cait_tiny")
    with pytest.raises(ValueError, match="the source has depth=2, the model depth=3"):
        from_timm(name, state_dict, **dict(kwargs, depth=3))


def test_pooling_mismatch_error_names_norm_keys_and_hints_global_pool():
    name, kwargs, state_dict, _ = fixture("deit3_tiny_avgpool")
    kwargs.pop("global_pool")
    with pytest.raises(ValueError) as err:
        from_timm(name, state_dict, **kwargs)
    message = str(err.value)
    assert "'norm.weight' (ours 'norm.scale'): expected shape (32,)" in message
    assert "'fc_norm.weight'" in message and "global_pool='avg'" in message


# --- head re-initialisation --------------------------------------------------------------------------------------

def filled_model(name, value, **kwargs):
    """A concrete model with every parameter ``value`` (cheaper than a random init, which compiles op by op)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: create_model(name, **kwargs)))
    return nnx.merge(graphdef, jax.tree.map(lambda a: np.full(a.shape, value, a.dtype), state))


def test_head_keeps_the_model_initialisation_when_num_classes_differs(caplog):
    name, kwargs, state_dict, _ = fixture("deit3_tiny")
    model = filled_model(name, 0.5, **dict(kwargs, num_classes=5))
    with caplog.at_level(logging.WARNING, logger="layerscale_jax.convert"):
        load_pretrained(model, state_dict)
    params = unrolled_params(model)
    assert params["head.kernel"].shape == (32, 5) and np.all(params["head.kernel"] == 0.5)
    assert np.array_equal(params["blocks.1.ls2.gamma"], state_dict["blocks.1.ls2.gamma"])
    assert "num_classes differs" in caplog.text


@pytest.mark.slow
def test_from_timm_initialises_a_new_head_from_rngs():
    name, kwargs, state_dict, _ = fixture("deit3_tiny")
    model = from_timm(name, state_dict, rngs=nnx.Rngs(3), **dict(kwargs, num_classes=5))
    assert model.head.kernel[...].shape == (32, 5) and float(np.abs(model.head.kernel[...]).max()) > 0
    np.testing.assert_array_equal(model.pos_embed[...], state_dict["pos_embed"])


# --- our orbax checkpoints (config.init_from) -------------------------------------------------------------------

@pytest.mark.slow
def test_save_pretrained_then_load_model_is_bit_exact(tmp_path):
    name, kwargs, state_dict, _ = fixture("cait_tiny")
    model = from_timm(name, state_dict, scan_layers=True, **kwargs)
    save_pretrained(model, tmp_path / "ckpt", name=name)
    record = read_model_json(tmp_path / "ckpt")
    assert record["model"] == name and record["overrides"]["depth"] == 2
    again = load_model(tmp_path / "ckpt", scan_layers=False)
    assert again.cfg == dataclasses.replace(model.cfg, scan_layers=False)
    assert params_equal(model, again)


def test_init_from_our_checkpoint_into_another_layout_and_img_size(tmp_path):
    name, kwargs, state_dict, extras = fixture("posembed_resize")       # 48px kwargs, 32px weights
    save_pretrained(from_timm(name, state_dict, **dict(kwargs, img_size=32)), tmp_path / "ckpt")
    target = nnx.eval_shape(lambda: create_model(name, **dict(kwargs, scan_layers=True)))
    assert load_pretrained(target, tmp_path / "ckpt") is target
    params = unrolled_params(target)
    np.testing.assert_allclose(params["pos_embed"], extras["__resampled_pos_embed__"], atol=1e-5)
    assert np.array_equal(params["blocks.1.attn.qkv.kernel"],
                          qkv_heads_major(state_dict["blocks.1.attn.qkv.weight"].T, target.cfg.num_heads))
    assert np.abs(logits(target, extras["__input__"]) - extras["__logits__"]).max() < TOL


def test_an_abstract_model_cannot_keep_a_fresh_head(tmp_path):
    name, kwargs, state_dict, _ = fixture("deit3_tiny")
    target = nnx.eval_shape(lambda: create_model(name, **dict(kwargs, num_classes=5)))
    with pytest.raises(ValueError, match="abstract"):
        load_pretrained(target, state_dict)


def test_cli_converts_to_orbax_and_exports_timm(tmp_path):
    name, kwargs, state_dict, extras = fixture("deit3_tiny")
    write_state_dict(state_dict, tmp_path / "timm.safetensors")
    arch = [f"--set={k}={v}" for k, v in kwargs.items() if k not in ("img_size", "num_classes")]
    assert convert_main(["--model", name, "--source", str(tmp_path / "timm.safetensors"), "--out",
                         str(tmp_path / "ckpt"), "--img-size", "32", "--num-classes", "10", "--scan-layers",
                         *arch]) == 0
    assert convert_main(["--source", str(tmp_path / "ckpt"), "--export-timm", str(tmp_path / "back.npz")]) == 0
    back = read_state_dict(tmp_path / "back.npz")
    assert back.keys() == state_dict.keys() and all(np.array_equal(back[k], state_dict[k]) for k in back)
    model = load_model(tmp_path / "ckpt")
    assert model.cfg.scan_layers
    assert np.abs(logits(model, extras["__input__"]) - extras["__logits__"]).max() < TOL
