"""LoRA adapters: merge = unmerge, layouts agree, the base stays frozen without optimizer state, errors name the
input, adapters shard along their kernel's axes and save / load alone."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from layerscale_jax import optim
from layerscale_jax import lora
from layerscale_jax.models import create_model, groups
from layerscale_jax.models.layout import convert_layout
from layerscale_jax.train import sharding as shard_lib

ARCH = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=16, depth=3, num_heads=2,
            init_values=0.1, global_pool="avg")


def tiny(scan_layers=False, **kw):
    return create_model("deit3_small_patch16_224", rngs=nnx.Rngs(0), **{**ARCH, "scan_layers": scan_layers, **kw})


def randomise_b(model, seed=1):
    """B = 0 at init makes every adapter a no-op; give them values so the tests see them."""
    for i, (_, layer) in enumerate(lora.adapted_layers(model)):
        layer.lora_b[...] = 0.3 * jax.random.normal(jax.random.key(seed + i), layer.lora_b.shape)


def images(n=4):
    return jax.random.normal(jax.random.key(7), (n, 8, 8, 1))


@pytest.mark.slow
def test_b_starts_at_zero_so_the_adapted_model_equals_the_base():
    model = tiny()
    model.eval()
    before = model(images())
    lora.add_adapters(model, rank=2, alpha=4.0)
    np.testing.assert_array_equal(model(images()), before)


@pytest.mark.slow
def test_merged_outputs_equal_unmerged_outputs_and_unmerge_restores_the_base():
    model = tiny()
    base_kernel = np.asarray(model.blocks[1].mlp.fc2.kernel[...])
    lora.add_adapters(model, rank=2, alpha=4.0)
    randomise_b(model)
    model.eval()
    unmerged = model(images())
    lora.merge(model)
    np.testing.assert_allclose(model(images()), unmerged, atol=2e-5)
    a, b = model.blocks[1].mlp.fc2.lora_a[...], model.blocks[1].mlp.fc2.lora_b[...]
    np.testing.assert_allclose(model.blocks[1].mlp.fc2.kernel[...], base_kernel + 2.0 * (a @ b), atol=1e-6)
    lora.unmerge(model)
    np.testing.assert_allclose(model.blocks[1].mlp.fc2.kernel[...], base_kernel, atol=1e-6)
    np.testing.assert_allclose(model(images()), unmerged, atol=2e-5)


@pytest.mark.slow
def test_scanned_and_unrolled_adapters_give_the_same_outputs_with_dropout():
    unrolled = tiny()
    scanned = convert_layout(tiny(), scan_layers=True)
    kw = dict(rank=2, alpha=4.0, dropout=0.3, rngs=5)
    assert lora.add_adapters(unrolled, **kw) == lora.add_adapters(scanned, **kw)
    randomise_b(unrolled)
    by_name = dict(lora.adapted_layers(unrolled))
    for path, layer in lora.adapted_layers(scanned):          # same A by construction; copy B layer by layer
        stacked_a = jnp.stack([by_name[(path[0], i) + path[1:]].lora_a[...] for i in range(3)])
        np.testing.assert_array_equal(layer.lora_a[...], stacked_a)
        layer.lora_b[...] = jnp.stack([by_name[(path[0], i) + path[1:]].lora_b[...] for i in range(3)])
    key = jax.random.key(3)
    np.testing.assert_allclose(scanned(images(), key=key), unrolled(images(), key=key), atol=1e-5)
    assert not np.allclose(unrolled(images(), key=key), unrolled(images(), key=jax.random.key(4)))  # dropout acts
    scanned.eval(), unrolled.eval()
    np.testing.assert_allclose(scanned(images()), unrolled(images()), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_the_frozen_base_has_no_optimizer_state_and_does_not_change_over_steps(scan_layers):
    model = tiny(scan_layers)
    lora.add_adapters(model, rank=2, alpha=4.0)
    config = optim.default_config()
    config.learning_rate = 1e-2
    config.layer_decay = 0.75
    config.freeze = lora.frozen_patterns(model, train_head=True)
    bundle = optim.build(config, model, total_steps=10)
    graphdef, params = nnx.split(model, nnx.Param)
    opt_state = bundle.tx.init(params)

    state_paths = set()
    for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state):
        names = [str(getattr(k, "key", "")) for k in path]
        if leaf.ndim > 0 and ("lora_a" in names or "lora_b" in names or "kernel" in names or "bias" in names):
            state_paths.add("/".join(n for n in names if n and not n.isdigit() and n != "value"))
    assert state_paths and all("lora_" in p or p.startswith("head/") or "/head/" in p for p in state_paths), \
        state_paths

    # layer decay counts the groups of the whole model, not only the trainable adapters: block 0 sits at
    # decay ** (L_max - 1) with L_max = depth + 1
    scales = {}
    groups.map_params(lambda path, v: scales.__setitem__(path, np.asarray(v)), bundle.lr_scales)
    block0 = ("blocks", "attn", "qkv", "lora_a") if scan_layers else ("blocks", 0, "attn", "qkv", "lora_a")
    np.testing.assert_allclose(scales[block0].reshape(-1)[0], 0.75 ** 3)

    def loss_fn(p):
        return jnp.mean(nnx.merge(graphdef, p)(images()) ** 2)

    @jax.jit
    def step(p, s):
        grads = jax.grad(loss_fn)(p)
        updates, s = bundle.tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    def flat(tree):
        out = {}
        groups.map_params(lambda path, v: out.__setitem__(groups.path_name(path), np.asarray(v)), tree)
        return out

    before = flat(params)
    for _ in range(3):
        params, opt_state = step(params, opt_state)
    after = flat(params)
    for name, old in before.items():
        trained = "lora_" in name or name.startswith("head/")
        assert (not np.array_equal(after[name], old)) == trained, name


def test_targets_that_match_nothing_and_bad_ranks_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"\['blocks/0/attn/nope/kernel'\] match no dense layer"):
        lora.add_adapters(tiny(), rank=2, alpha=1.0, targets=("blocks/0/attn/nope/kernel",))
    with pytest.raises(ValueError, match="rank=0 must be a positive integer"):
        lora.add_adapters(tiny(), rank=0, alpha=1.0)
    with pytest.raises(ValueError, match=r"rank=17 exceeds min\(d_in, d_out\) = 16 of 'blocks/0/attn/proj/kernel'"):
        lora.add_adapters(tiny(), rank=17, alpha=1.0)
    bad = lora.default_config()
    bad.rank = -1
    with pytest.raises(ValueError, match="lora.rank=-1"):
        lora.validate_config(bad)


@pytest.mark.slow
def test_a_target_matching_some_layers_of_a_stacked_kernel_freezes_the_others_at_zero():
    unrolled, scanned = tiny(), convert_layout(tiny(), scan_layers=True)
    targets = (r"blocks/1/mlp/fc1/kernel",)
    assert lora.add_adapters(unrolled, rank=2, alpha=1.0, targets=targets) == ["blocks/1/mlp/fc1/kernel"]
    assert lora.add_adapters(scanned, rank=2, alpha=1.0, targets=targets) == ["blocks/1/mlp/fc1/kernel"]
    freeze = lora.frozen_patterns(scanned)
    mask = optim.param_rules.trainable_mask(scanned, freeze)
    np.testing.assert_array_equal(mask["blocks"]["mlp"]["fc1"]["lora_b"], [False, True, False])
    counts_u = lora.parameter_counts(unrolled, lora.frozen_patterns(unrolled))
    counts_s = lora.parameter_counts(scanned, freeze)
    assert counts_u["trainable"] == counts_s["trainable"]


def test_adapter_axes_follow_their_kernel_for_sharding():
    model = tiny(scan_layers=True)
    lora.add_adapters(model, rank=2, alpha=1.0)
    axes = shard_lib.param_logical_axes(nnx.state(model, nnx.Param))
    flat = {"/".join(shard_lib.path_names(p)): v for p, v in
            jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))}
    assert flat["blocks/attn/qkv/lora_a"] == ("layers", "embed", None)
    assert flat["blocks/attn/qkv/lora_b"] == ("layers", None, "heads")
    assert flat["blocks/mlp/fc2/lora_a"] == ("layers", "mlp", None)
    assert flat["blocks/mlp/fc2/lora_b"] == ("layers", None, "embed")


@pytest.mark.slow
def test_adapters_save_and_load_alone(tmp_path):
    model = tiny()
    lora.add_adapters(model, rank=2, alpha=4.0)
    randomise_b(model)
    model.eval()
    expected = model(images())
    lora.save_adapters(model, tmp_path / "adapters")
    assert {p.name for p in (tmp_path / "adapters").iterdir()} == {"adapters", "lora.json"}
    fresh = tiny()
    lora.add_adapters(fresh, rank=2, alpha=4.0, rngs=99)
    lora.load_adapters(fresh, tmp_path / "adapters")
    fresh.eval()
    np.testing.assert_allclose(fresh(images()), expected, atol=1e-6)
    other = tiny()
    lora.add_adapters(other, rank=2, alpha=4.0, targets=(r"blocks/\d+/mlp/fc1/kernel",))
    with pytest.raises(ValueError, match="adapted layers differ"):
        lora.load_adapters(other, tmp_path / "adapters")


def _tiny_finetune_config(finetune, **lora_fields):
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "tiny_synthetic.py")
    spec = importlib.util.spec_from_file_location("tiny_synthetic", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("steps=4")
    config.train.finetune = finetune
    if lora_fields:
        config.lora = ml_collections.ConfigDict(lora_fields)
    return config


@pytest.mark.slow
def test_the_trainer_in_lora_mode_keeps_the_base_and_gives_it_no_optimizer_state():
    from layerscale_jax import data as data_lib
    from layerscale_jax.train import loop as loop_lib
    from layerscale_jax.train.config import validate_experiment_config

    config = _tiny_finetune_config("lora", rank=2, alpha=4.0)
    validate_experiment_config(config)
    mesh = shard_lib.make_mesh({"data": 2, "fsdp": 1, "tensor": 2}, jax.devices()[:4])
    trainer = loop_lib.create_trainer(validate_experiment_config(config), mesh)
    state = trainer.init_state()
    moments = {"/".join(str(getattr(k, "key", "")) for k in p if getattr(k, "key", None) is not None)
               for p, leaf in jax.tree_util.tree_leaves_with_path(state["opt_state"]) if leaf.ndim > 0}
    assert moments and all("lora_" in m or "head" in m.split("/") for m in moments), moments
    qkv_b = state["params"]["blocks"][0]["attn"]["qkv"]["lora_b"]
    assert tuple(qkv_b.sharding.spec) == (None, "tensor")            # B's columns split by heads, as the kernel's
    before = jax.tree.map(np.asarray, nnx.to_pure_dict(state["params"]))
    iterator = data_lib.make_train_iterator(config.data, global_batch_size=16, seed=0)
    for _ in range(2):
        state, _ = trainer.train_step(state, data_lib.to_global_batch(next(iterator), mesh, 16))
    iterator.close()
    after = nnx.to_pure_dict(state["params"])
    changed = {"/".join(map(str, groups.param_path(p))) for p, old in jax.tree_util.tree_leaves_with_path(before)
               if not np.array_equal(old, np.asarray(_at(after, p)))}
    assert changed and all("lora_" in name or name.startswith("head/") for name in changed), changed


def _at(tree, path):
    for k in path:
        tree = tree[getattr(k, "key", getattr(k, "idx", None))]
    return tree


def test_finetune_fields_are_checked_where_the_config_enters():
    from layerscale_jax.train.config import validate_experiment_config

    with pytest.raises(ValueError, match=r"train.finetune='lorra' is not one of"):
        validate_experiment_config(_tiny_finetune_config("lorra"))
    with pytest.raises(ValueError, match=r"config.lora is set but train.finetune='full'"):
        validate_experiment_config(_tiny_finetune_config("full", rank=2))
    with pytest.raises(ValueError, match=r"unknown config field\(s\) lora.rnak"):
        validate_experiment_config(_tiny_finetune_config("lora", rnak=2))
    with pytest.raises(ValueError, match=r"lora.dropout=1.5 must lie in \[0, 1\)"):
        validate_experiment_config(_tiny_finetune_config("lora", dropout=1.5))


@pytest.mark.slow
def test_merged_adapters_export_to_timm_through_the_heads_major_qkv_layout():
    from layerscale_jax.convert import from_timm, to_timm

    model = tiny()
    lora.add_adapters(model, rank=2, alpha=4.0)
    randomise_b(model)
    model.eval()
    expected = model(images())
    with pytest.raises(ValueError, match="not merged"):
        to_timm(model)
    state_dict = to_timm(lora.merge(model))          # timm's [q | k | v] column order
    plain = from_timm("deit3_small_patch16_224", state_dict, **ARCH)
    plain.eval()
    np.testing.assert_allclose(plain(images()), expected, atol=2e-5)
