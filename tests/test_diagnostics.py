"""Specifications of the per-block diagnostics (``layerscale_jax.train.diagnostics``)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from layerscale_jax.models import create_model
from layerscale_jax.models.layout import convert_layout
from layerscale_jax.data.sharding import batch_sharding
from layerscale_jax.train.config import DEFAULT_RULES
from layerscale_jax.train.sharding import make_mesh
from layerscale_jax.train.diagnostics import branch_diagnostics, make_diagnostics_fn, to_floats

TINY = dict(img_size=8, patch_size=4, in_chans=1, embed_dim=16, num_heads=2, num_classes=3, depth=2)


def batch(n=8):
    images = jax.random.normal(jax.random.key(1), (n, 8, 8, 1))
    return {"image": images, "label": jnp.arange(n) % 3}


def model_with_distinct_scales(branch_scaling="layerscale", family="deit3_small_patch16_224"):
    model = create_model(family, branch_scaling=branch_scaling, init_values=0.1, **TINY)
    for i, block in enumerate(model.blocks):
        block.ls1.gamma[...] = jnp.linspace(-1.0, 1.0, 16) * (i + 1)         # mean |λ| = 0.5333 · (i + 1)
        block.ls2.gamma[...] = jnp.full((16,), 0.25 * (i + 1))
    return model


def diagnostics_of(model, data):
    graphdef, params = nnx.split(model, nnx.Param)
    return to_floats(jax.jit(lambda p, b: branch_diagnostics(graphdef, p, b))(params, data))


@pytest.mark.slow
def test_scale_is_the_mean_absolute_lambda_of_each_block_and_branch():
    diag = diagnostics_of(model_with_distinct_scales(), batch())
    mean_abs = np.mean(np.abs(np.linspace(-1.0, 1.0, 16)))
    for i in range(2):
        assert diag[f"diag/blocks.{i}.attn.scale"] == pytest.approx(mean_abs * (i + 1), rel=1e-6)
        assert diag[f"diag/blocks.{i}.mlp.scale"] == pytest.approx(0.25 * (i + 1), rel=1e-6)


@pytest.mark.slow
def test_ratio_is_the_scaled_branch_norm_over_the_stream_norm_it_joins():
    model = model_with_distinct_scales()
    data = batch()
    model.eval()
    x = np.asarray(jnp.concatenate([jnp.broadcast_to(model.cls_token[...], (8, 1, 16)),
                                    model.patch_embed(data["image"]) + model.pos_embed[...]], axis=1), np.float64)
    blk = model.blocks[0]
    h = np.asarray(blk.attn(blk.norm1(jnp.asarray(x, jnp.float32))), np.float64)
    branch = np.asarray(blk.ls1.gamma[...], np.float64) * h
    diag = diagnostics_of(model, data)
    assert diag["diag/blocks.0.attn.ratio"] == pytest.approx(np.linalg.norm(branch) / np.linalg.norm(x), rel=1e-4)


@pytest.mark.slow
def test_grad_norm_is_the_norm_of_each_blocks_cross_entropy_gradient():
    model = model_with_distinct_scales()
    data = batch()
    model.eval()
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
        logits = nnx.merge(graphdef, p)(data["image"])
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(8), data["label"]])

    grads = nnx.to_pure_dict(jax.grad(loss)(params))
    diag = diagnostics_of(model, data)
    for i in range(2):
        expected = np.sqrt(sum(np.sum(np.square(g)) for g in jax.tree.leaves(grads["blocks"][i])))
        assert diag[f"diag/blocks.{i}.grad_norm"] == pytest.approx(expected, rel=1e-4)
    assert diag["diag/loss"] == pytest.approx(float(loss(params)), rel=1e-5)


@pytest.mark.slow
def test_scanned_and_unrolled_layouts_give_the_same_diagnostics():
    model = model_with_distinct_scales()
    unrolled = diagnostics_of(model, batch())
    scanned = diagnostics_of(convert_layout(model, scan_layers=True), batch())
    assert scanned.keys() == unrolled.keys()
    for key in unrolled:
        assert scanned[key] == pytest.approx(unrolled[key], rel=1e-4, abs=1e-7), key


@pytest.mark.slow
@pytest.mark.parametrize("kind, scale_keys", [("none", 0), ("rezero", 4), ("skipinit", 4)])
def test_every_scheme_reports_ratios_and_grad_norms_and_its_scales(kind, scale_keys):
    """ReZero's one α per block is reported for both branches; `none` has no scale."""
    model = create_model("deit3_small_patch16_224", branch_scaling=kind, **TINY)
    diag = diagnostics_of(model, batch())
    assert sum(k.endswith(".scale") for k in diag) == scale_keys
    assert sum(k.endswith(".ratio") for k in diag) == 4 and sum(k.endswith(".grad_norm") for k in diag) == 2
    if kind != "none":       # zero-initialised gates: the branches add nothing yet
        assert diag["diag/blocks.1.mlp.ratio"] == 0.0


@pytest.mark.slow
def test_cait_reports_its_class_attention_blocks_too():
    model = create_model("cait_xxs24_224", depth_token_only=1, **TINY)
    diag = diagnostics_of(model, batch())
    assert {"diag/blocks_token_only.0.attn.ratio", "diag/blocks_token_only.0.grad_norm",
            "diag/blocks_token_only.0.mlp.scale"} <= set(diag)


@pytest.mark.slow
def test_jitted_on_a_mesh_the_outputs_are_replicated_on_every_device():
    mesh = make_mesh({"data": -1})                              # the train loop's mesh (Auto axes)
    model = model_with_distinct_scales()
    graphdef, params = nnx.split(model, nnx.Param)
    replicated = NamedSharding(mesh, P())
    params = jax.device_put(params, replicated)
    rows = {"image": batch_sharding(mesh), "label": batch_sharding(mesh)}
    data = jax.device_put(batch(len(jax.devices())), rows)
    out = make_diagnostics_fn(graphdef, mesh, replicated, rows, DEFAULT_RULES)(params, data)
    assert all(v.sharding.is_fully_replicated for v in out.values())
    local = diagnostics_of(model, batch(len(jax.devices())))
    for key, value in to_floats(out).items():
        assert value == pytest.approx(local[key], rel=1e-4, abs=1e-7), key
