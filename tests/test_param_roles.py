"""Parameter roles and logical axes live on the parameters (layers.params): weight decay, sharding, the
optimizer-state sharding, ASAM and the diagnostics follow them whatever a parameter is called, and checkpoints
written before the metadata existed still restore."""
import importlib.util
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from layerscale_jax import optim
from layerscale_jax.layers import scaling
from layerscale_jax.layers.params import ROLES, logical_axes, param, role
from layerscale_jax.models import create_model
from layerscale_jax.train import sharding as shard_lib
from layerscale_jax.train.config import validate_experiment_config

HERE = os.path.dirname(os.path.abspath(__file__))
FSDP_RULES = (("embed", "fsdp"), ("heads", "tensor"), ("mlp", "tensor"), ("classes", None), ("layers", None))


def tiny(scan_layers, **kw):
    return create_model("deit3_small_patch16_224", rngs=nnx.Rngs(0), img_size=8, patch_size=4, num_classes=4,
                        embed_dim=16, depth=2, num_heads=2, scan_layers=scan_layers, **kw)


def by_name(tree):
    """A tree over an nnx.State → {'blocks/0/ls1/gamma': value} (its Variables' values)."""
    return {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(tree),
                                                                   is_leaf=lambda x: isinstance(x, tuple))[0]}


def test_every_parameter_of_every_family_carries_a_role_and_one_axis_name_per_dimension():
    for name in ("deit3_small_patch16_224", "cait_xxs24_224", "mae_deit3_small_patch16_224"):
        for scan in (False, True):
            model = nnx.eval_shape(lambda: create_model(name, rngs=nnx.Rngs(0), depth=2, scan_layers=scan))
            for path, var in jax.tree_util.tree_flatten_with_path(
                    nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]:
                assert role(var) in ROLES, (name, path)
                assert len(logical_axes(var)) == var.ndim, (name, path)
                assert (logical_axes(var)[0] == "layers") == (scan and path[0].key == "blocks"), (name, path)


class RenamedLayerScale(nnx.Module):
    """LayerScale with λ stored as ``lam`` (what a renamed attribute or a new layer type would do)."""

    def __init__(self, dim, init_value):
        self.lam = param(jnp.full((dim,), init_value, jnp.float32), "layerscale", ("embed",))

    def factor(self):
        return self.lam[...]


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_a_renamed_layerscale_keeps_its_decay_sharding_and_diagnostics(monkeypatch, scan_layers):
    from layerscale_jax.train.diagnostics import branch_diagnostics

    monkeypatch.setattr(scaling, "LayerScale", RenamedLayerScale)
    model = tiny(scan_layers, init_values=0.25)
    names = by_name(nnx.state(model, nnx.Param))
    lam = [k for k in names if k.endswith("lam")]
    assert lam and not [k for k in names if k.endswith("gamma")]

    decay = by_name(optim.weight_decay_mask(model))
    assert all(decay[k] is False for k in lam)
    assert all(decay[k] is True for k in names if k.endswith("kernel"))

    mesh = shard_lib.make_mesh({"data": 1, "fsdp": 2, "tensor": 1}, jax.devices()[:2])
    specs = by_name(jax.tree.map(lambda s: s.spec, shard_lib.param_shardings(nnx.state(model, nnx.Param), mesh,
                                                                               FSDP_RULES)))
    assert all(specs[k] == (P(None, "fsdp") if scan_layers else P("fsdp")) for k in lam)

    graphdef, params = nnx.split(model, nnx.Param)
    batch = {"image": jnp.ones((2, 8, 8, 3)), "label": jnp.array([0, 1])}
    diag = branch_diagnostics(graphdef, params, batch)
    np.testing.assert_allclose(diag["blocks/attn.scale"], [0.25, 0.25])
    np.testing.assert_allclose(diag["blocks/mlp.scale"], [0.25, 0.25])


def test_a_renamed_layerscale_exports_to_timms_name_for_lambda(monkeypatch):
    """timm's names follow the role: λ stored as ``lam`` still exports as ``blocks.N.lsK.gamma``."""
    from layerscale_jax.convert import to_timm

    monkeypatch.setattr(scaling, "LayerScale", RenamedLayerScale)
    state = to_timm(tiny(False, init_values=0.25))
    assert sorted(k for k in state if ".ls" in k) == ["blocks.0.ls1.gamma", "blocks.0.ls2.gamma",
                                                       "blocks.1.ls1.gamma", "blocks.1.ls2.gamma"]
    np.testing.assert_array_equal(state["blocks.1.ls2.gamma"], np.full(16, 0.25, np.float32))


def test_a_renamed_kernel_and_a_new_token_are_treated_by_role():
    model = nnx.eval_shape(lambda: tiny(False))
    mlp = model.blocks[0].mlp
    mlp.up = mlp.fc1                        # the same Dense layer under another name
    del mlp.fc1
    model.register_token = param(jax.ShapeDtypeStruct((1, 1, 16), jnp.float32), "token", (None, None, "embed"))
    decay = by_name(optim.weight_decay_mask(model))
    assert decay["blocks/0/mlp/up/kernel"] is True and decay["blocks/0/mlp/up/bias"] is False
    assert decay["register_token"] is False
    axes = by_name(shard_lib.param_logical_axes(nnx.state(model, nnx.Param)))
    assert axes["blocks/0/mlp/up/kernel"] == ("embed", "mlp") and axes["register_token"] == (None, None, "embed")


def test_a_parameter_without_a_role_is_refused_where_the_mask_is_built():
    model = nnx.eval_shape(lambda: tiny(False))
    model.extra = nnx.Param(jax.ShapeDtypeStruct((3,), jnp.float32))
    with pytest.raises(ValueError, match=r"\['extra'\] carry no role"):
        optim.weight_decay_mask(model)
    with pytest.raises(ValueError, match="extra of shape .3,. carries logical axes None"):
        shard_lib.param_logical_axes(nnx.state(model, nnx.Param))
    with pytest.raises(ValueError, match="role=.kernel. is not one of"):
        param(jnp.zeros(2), "kernel", (None,))


def test_optimizer_moments_are_sharded_as_their_parameters_and_counts_replicated():
    """AdamW's moments mirror the parameters structurally (each inside the parameter's Variable): every moment
    gets its parameter's spec, whatever its name; the step counts are replicated."""
    model = nnx.eval_shape(lambda: tiny(True))
    params = nnx.state(model, nnx.Param)
    mesh = shard_lib.make_mesh({"data": 1, "fsdp": 2, "tensor": 1}, jax.devices()[:2])
    param_specs = by_name(jax.tree.map(lambda s: s.spec, shard_lib.param_shardings(params, mesh, FSDP_RULES)))
    opt_state = jax.eval_shape(optax_adamw().init, params)
    shardings = shard_lib.opt_state_shardings(opt_state, mesh, FSDP_RULES)
    mu, nu = shardings[0].mu, shardings[0].nu
    for moments in (mu, nu):
        assert by_name(jax.tree.map(lambda s: s.spec, moments)) == param_specs
    assert shardings[0].count.spec == P()
    assert any(spec != P() for spec in param_specs.values())


def optax_adamw():
    import optax
    return optax.adamw(1e-3)


def load_tiny_config(arg):
    path = os.path.join(HERE, "configs", "tiny_synthetic.py")
    spec = importlib.util.spec_from_file_location("tiny_synthetic", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


@pytest.mark.slow
def test_a_checkpoint_written_before_the_metadata_restores_and_resumes(tmp_path):
    """tests/fixtures/workdir_v1: step 4 of ``tiny_synthetic.py`` (steps=4, scan_layers=True, optim.ema_decay=0.9)
    trained by commit 628bea8, before parameters carried roles; workdir_v1_params.npz holds its parameters as that
    code's ``load_run`` returned them. The new code restores the same values and trains on from the checkpoint."""
    import layerscale_jax as lsj
    from layerscale_jax.train import loop

    workdir = tmp_path / "run"
    shutil.copytree(os.path.join(HERE, "fixtures", "workdir_v1"), workdir)
    expected = np.load(os.path.join(HERE, "fixtures", "workdir_v1_params.npz"))
    restored = by_name(nnx.state(lsj.load_run(workdir, ema=False).model, nnx.Param))
    assert sorted(restored) == sorted(expected.files)
    for key in expected.files:
        np.testing.assert_array_equal(restored[key], expected[key])

    config = load_tiny_config("steps=6,scan_layers=True")
    config.optim.ema_decay = 0.9
    loop.train_and_evaluate(validate_experiment_config(config), str(workdir))
    assert lsj.load_run(workdir).step == 6
