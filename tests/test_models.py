"""Specifications of the models: registry, parameter counts, precision policy, depth at scale, bad input.

Shapes are tiny (16×16 images, patch 4, width 32, 2 heads, depth 2). Models are built unrolled (eager building
of a scanned model costs more) and converted to the scanned layout with ``convert_layout``; compiled results are
shared through module-scoped fixtures, and compiled with fast XLA:CPU options (see ``FAST_COMPILE``).
"""
import dataclasses
import functools
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layerscale_jax import create_model, list_models
from layerscale_jax.models import REMAT_POLICIES, create_from_config, model_config
from layerscale_jax.models.layout import convert_layout, unstack_blocks

DEIT3, CAIT = "deit3_small_patch16_224", "cait_xxs24_224"
FAMILIES = {"deit3": DEIT3, "cait": CAIT}
TINY = dict(img_size=16, patch_size=4, embed_dim=32, num_heads=2, num_classes=10)
BATCH = 2
DEPTH = 2
# XLA:CPU compiles these tiny programs faster without backend optimisation; the tests check the models'
# mathematics, not XLA's optimisations.
FAST_COMPILE = ({"xla_backend_optimization_level": 0}
                if jax.default_backend() == "cpu" else {})


def tiny(name, **overrides):
    return create_model(name, **{**TINY, **overrides})


def relative_diff(a, b):
    """‖a − b‖ / ‖b‖ (a traced scalar inside jit)."""
    return jnp.linalg.norm(a - b) / jnp.linalg.norm(b)


def assert_trees_close(actual, expected, rtol=1e-5, floor=1e-9):
    """Leafwise |a − e| ≤ rtol · max|e| + floor: the same values up to float32 summation order.

    The floor covers gradients that are zero in exact arithmetic (e.g. the key bias: softmax ignores a shift shared
    by all logits) and come out as ±1e-12 rounding noise.
    """
    def check(path, a, e):
        atol = rtol * float(np.max(np.abs(e))) + floor
        np.testing.assert_allclose(a, e, rtol=0, atol=atol, err_msg=jax.tree_util.keystr(path))
    jax.tree_util.tree_map_with_path(check, actual, expected)


def pure(tree):
    return nnx.to_pure_dict(tree)


# ---------------------------------------------------------------------------------------------------------------
# Compiled pure functions over (params, rest): nnx.split outside, nnx.merge inside
# ---------------------------------------------------------------------------------------------------------------
def loss_and_grad_fn(graphdef):
    def loss(params, rest, images, targets):
        logits = nnx.merge(graphdef, params, rest)(images)
        return jnp.mean((logits - targets) ** 2), logits
    return jax.jit(jax.value_and_grad(loss, has_aux=True), compiler_options=FAST_COMPILE)


def run_loss_and_grad(model, images, targets, graphdef=None):
    """(logits, gradient of the loss wrt the params as a pure dict); ``graphdef`` swaps in other static options."""
    own_graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    (_, logits), grads = loss_and_grad_fn(graphdef or own_graphdef)(params, rest, images, targets)
    return logits, pure(grads)


def forward_fn(model, method="__call__"):
    graphdef, state = nnx.split(model)
    fn = lambda state, images, key: getattr(nnx.merge(graphdef, state), method)(images, key)
    return jax.jit(fn, compiler_options=FAST_COMPILE), state


def graphdef_with(model, **changes):
    """The graphdef of ``model`` with some config fields changed (same parameter structure), built abstractly."""
    cfg = dataclasses.replace(model.cfg, **changes)
    return nnx.graphdef(nnx.eval_shape(lambda: create_from_config(cfg, rngs=nnx.Rngs(0))))


@pytest.fixture(scope="module")
def images():
    return jax.random.normal(jax.random.key(0), (BATCH, 16, 16, 3), jnp.float32)


@pytest.fixture(scope="module")
def targets():
    return jax.random.normal(jax.random.key(1), (BATCH, TINY["num_classes"]), jnp.float32)


def _layouts(name, images, targets):
    """The same weights in both layouts (ε = 0.5, so every parameter gets a sizeable gradient).

    ``{layout: {"model", "logits", "grads"}}`` with the gradients in the layout's own parameter structure.
    """
    unrolled = tiny(name, depth=DEPTH, init_values=0.5)
    result = {}
    for layout, model in (("unrolled", unrolled), ("scanned", convert_layout(unrolled, scan_layers=True))):
        logits, grads = run_loss_and_grad(model, images, targets)
        result[layout] = {"model": model, "logits": logits, "grads": grads}
    return result


@pytest.fixture(scope="module")
def deit3_layouts(images, targets):
    return _layouts(DEIT3, images, targets)


@pytest.fixture(scope="module")
def cait_layouts(images, targets):
    return _layouts(CAIT, images, targets)


@pytest.fixture(params=["deit3", "cait"])
def layouts(request):
    return request.getfixturevalue(f"{request.param}_layouts")


# ---------------------------------------------------------------------------------------------------------------
# Registry and parameter counts
# ---------------------------------------------------------------------------------------------------------------
ISSUE_NAMES = ([f"deit3_{s}_patch16_{r}" for s in ("small", "base", "large") for r in (224, 384)]
               + ["deit3_medium_patch16_224", "deit3_huge_patch14_224"]
               + ["cait_xxs24_224", "cait_xxs24_384", "cait_xxs36_224", "cait_xxs36_384", "cait_xs24_384",
                  "cait_s24_224", "cait_s24_384", "cait_s36_384", "cait_m36_384", "cait_m48_448"])


def test_registry_holds_timms_deit3_and_cait_names():
    assert set(ISSUE_NAMES) <= set(list_models())


def count_params(name, **overrides):
    model = nnx.eval_shape(lambda: create_model(name, rngs=nnx.Rngs(0), **overrides))
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("name, expected, overrides", [
    (DEIT3, 22_059_496, {}),
    (CAIT, 11_956_264, {"scan_layers": True}),     # eval_shape of the unrolled 24 blocks traces slowly in NNX
    ("deit3_base_patch16_224", 86_585_320, {"scan_layers": True}),
    ("cait_s24_224", 46_916_200, {"scan_layers": True}),
])
def test_parameter_count_matches_timm(name, expected, overrides):
    assert count_params(name, **overrides) == expected


@pytest.mark.slow
def test_eval_shape_of_a_632m_parameter_model_allocates_nothing():
    live_before = sum(a.nbytes for a in jax.live_arrays())
    model = nnx.eval_shape(lambda: create_model("deit3_huge_patch14_224", rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(nnx.state(model))
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)
    assert round(sum(int(np.prod(leaf.shape)) for leaf in leaves) / 1e6) == 632
    assert sum(a.nbytes for a in jax.live_arrays()) - live_before < 1 << 20


def test_official_cait_epsilons_are_kept_per_model():
    assert model_config("cait_xxs24_224").init_values == 1e-5
    assert model_config("cait_xxs36_224").init_values == 1e-5      # xxs36 does not follow the depth rule
    assert model_config("cait_s36_384").init_values == 1e-6
    assert model_config(DEIT3).init_values == 1e-6


def test_vit_defaults_to_the_linear_drop_path_rule():
    model = nnx.eval_shape(lambda: tiny(DEIT3, depth=5, drop_path_rate=0.2, rngs=nnx.Rngs(0)))
    np.testing.assert_allclose(model.drop_path_rates, [0.0, 0.05, 0.1, 0.15, 0.2], rtol=1e-6)


def test_cait_defaults_to_the_constant_drop_path_rule():
    model = nnx.eval_shape(lambda: tiny(CAIT, depth=4, drop_path_rate=0.2, rngs=nnx.Rngs(0)))
    np.testing.assert_allclose(model.drop_path_rates, [0.2] * 4, rtol=1e-6)


def test_drop_path_rule_override_switches_the_rule():
    model = nnx.eval_shape(lambda: tiny(DEIT3, depth=3, drop_path_rate=0.3, drop_path_rule="constant",
                                        rngs=nnx.Rngs(0)))
    np.testing.assert_allclose(model.drop_path_rates, [0.3] * 3, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# LayerScale at model level: ε rule, near identity, per-channel gradients, branch-scaling kinds
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth, eps", [(12, 0.1), (18, 0.1), (24, 1e-5), (36, 1e-6)])
def test_auto_init_values_follow_the_cait_rule(depth, eps):
    model = tiny(DEIT3, depth=depth, init_values="auto")
    gammas = np.stack([np.concatenate([b.ls1.gamma[...], b.ls2.gamma[...]]) for b in model.blocks])
    np.testing.assert_array_equal(gammas, np.float32(eps))


def tokens_before_blocks(model, images):
    """What enters the block stack, written out independently: [cls, PatchEmbed(x) + E_pos]."""
    patches = model.patch_embed(images) + model.pos_embed[...]
    cls = jnp.broadcast_to(model.cls_token[...], (images.shape[0], 1, patches.shape[-1]))
    return jnp.concatenate([cls, patches], axis=1)


def stack_relative_change(model, images):
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def change(state, images):
        m = nnx.merge(graphdef, state)
        return relative_diff(m.forward_features(images), tokens_before_blocks(m, images))
    return float(change(state, images))


def deep_tiny(branch_scaling):
    unrolled = tiny(DEIT3, depth=48, branch_scaling=branch_scaling, init_values=1e-6)
    return convert_layout(unrolled, scan_layers=True)


@pytest.mark.slow
def test_deep_layerscale_stack_is_near_identity_at_init(images):
    """Depth 48, ε = 1e-6: the block stack changes its input tokens by a relative norm below 1e-3."""
    assert stack_relative_change(deep_tiny("layerscale"), images) < 1e-3


@pytest.mark.slow
def test_deep_plain_prenorm_stack_is_far_from_identity_at_init(images):
    """The same stack without branch scaling moves the tokens a lot (so the test above is not vacuous)."""
    assert stack_relative_change(deep_tiny("none"), images) > 1e-2


@pytest.mark.slow
def test_every_layer_and_channel_of_lambda_gets_its_own_gradient(deit3_layouts):
    grads = deit3_layouts["scanned"]["grads"]["blocks"]
    for ls in ("ls1", "ls2"):
        g = np.asarray(grads[ls]["gamma"])
        assert g.shape == (DEPTH, TINY["embed_dim"])
        assert np.all(g != 0) and len(np.unique(g)) == g.size, ls


def block_param_names(module):
    flat = jax.tree_util.tree_flatten_with_path(pure(nnx.state(module, nnx.Param)))[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf) for path, leaf in flat}


@pytest.fixture(scope="module", params=["deit3", "cait"])
def scaled_models(request):
    """One tiny depth-1 model of each branch-scaling kind (init_values 0.1), blocks' params by name."""
    models = {kind: tiny(FAMILIES[request.param], depth=1, branch_scaling=kind, init_values=0.1)
              for kind in ("layerscale", "scalar", "scalar_zero", "rezero", "skipinit", "none")}
    blocks = {kind: [m.blocks[0]] + list(getattr(m, "blocks_token_only", [])) for kind, m in models.items()}
    return {kind: [block_param_names(b) for b in bs] for kind, bs in blocks.items()}


def test_layerscale_models_have_a_lambda_vector_per_branch_at_epsilon(scaled_models):
    for params in scaled_models["layerscale"]:
        for name in ("ls1/gamma", "ls2/gamma"):
            np.testing.assert_array_equal(params[name], np.full(TINY["embed_dim"], 0.1, np.float32))


def test_scalar_models_have_one_alpha_per_branch_at_epsilon(scaled_models):
    for params in scaled_models["scalar"]:
        assert params["ls1/alpha"].shape == () and params["ls1/alpha"] == np.float32(0.1)
        assert params["ls2/alpha"] == np.float32(0.1)


def test_rezero_models_have_no_block_layernorm_and_one_zero_alpha_per_block(scaled_models):
    for params in scaled_models["rezero"]:
        assert not any(n.startswith(("norm1", "norm2")) for n in params)
        assert params["ls1/alpha"] == 0.0 and "ls2/alpha" not in params


def test_skipinit_models_have_no_block_normalisation_and_zero_alphas(scaled_models):
    for params in scaled_models["skipinit"]:
        assert not any(n.startswith(("norm1", "norm2")) for n in params)
        assert params["ls1/alpha"] == 0.0 and params["ls2/alpha"] == 0.0


def test_scalar_zero_models_keep_layernorm_and_have_zero_alphas(scaled_models):
    for params in scaled_models["scalar_zero"]:
        assert {"norm1/scale", "norm2/scale"} <= set(params)
        assert params["ls1/alpha"] == 0.0 and params["ls2/alpha"] == 0.0


def test_unscaled_models_have_no_scale_parameters(scaled_models):
    for params in scaled_models["none"]:
        assert not any(n.startswith(("ls1", "ls2")) for n in params)
        assert {"norm1/scale", "norm2/scale"} <= set(params)


# ---------------------------------------------------------------------------------------------------------------
# Precision policy (checked abstractly: nothing is allocated or compiled)
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["deit3", "cait"])
def bf16_model(request):
    """(graphdef, abstract state, abstract images) of a tiny model with bfloat16 compute."""
    model = nnx.eval_shape(lambda: tiny(FAMILIES[request.param], depth=2, dtype="bfloat16", rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    return graphdef, state, jax.ShapeDtypeStruct((BATCH, 16, 16, 3), jnp.float32)


def test_bfloat16_compute_keeps_every_parameter_float32(bf16_model):
    _, state, _ = bf16_model
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(state)}
    assert dtypes == {jnp.dtype(jnp.float32)}


def test_layerscale_stays_float32_even_with_bfloat16_parameters():
    model = nnx.eval_shape(lambda: tiny(DEIT3, depth=2, dtype="bfloat16", param_dtype="bfloat16",
                                        rngs=nnx.Rngs(0)))
    block = model.blocks[0]
    assert block.ls1.gamma.dtype == jnp.float32 and block.ls2.gamma.dtype == jnp.float32
    assert block.attn.qkv.kernel.dtype == jnp.bfloat16


def test_bfloat16_compute_keeps_the_residual_stream_float32(bf16_model):
    graphdef, state, images = bf16_model
    out = jax.eval_shape(lambda s, x: nnx.merge(graphdef, s).forward_features(x), state, images)
    assert out.dtype == jnp.float32


def test_bfloat16_compute_returns_float32_logits(bf16_model):
    graphdef, state, images = bf16_model
    out = jax.eval_shape(lambda s, x: nnx.merge(graphdef, s)(x), state, images)
    assert out.dtype == jnp.float32 and out.shape == (BATCH, TINY["num_classes"])


def _eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (tuple, list)) else [param]):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


def test_bfloat16_compute_runs_every_matmul_in_bfloat16(bf16_model):
    """Except CaiT's talking-heads mixings (a heads × heads kernel), which mix float32 logits by design."""
    graphdef, state, images = bf16_model
    jaxpr = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, images).jaxpr
    products = [e for e in _eqns(jaxpr) if e.primitive.name in ("dot_general", "conv_general_dilated")]
    heads = TINY["num_heads"]
    mixings = [e for e in products if e.invars[1].aval.shape == (heads, heads)]
    assert products
    for eqn in products:
        expected = jnp.float32 if eqn in mixings else jnp.bfloat16
        assert [v.aval.dtype for v in eqn.invars] == [expected] * 2, eqn


# ---------------------------------------------------------------------------------------------------------------
# Depth at scale: scanned layout, layout conversion, remat, stochastic depth
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_scanned_blocks_stack_every_parameter_on_a_leading_layer_axis(layouts):
    stacked = pure(nnx.state(layouts["scanned"]["model"].blocks, nnx.Param))
    assert {leaf.shape[0] for leaf in jax.tree.leaves(stacked)} == {DEPTH}


@pytest.mark.slow
def test_layout_conversion_round_trips_the_weights(layouts):
    back = convert_layout(layouts["scanned"]["model"], scan_layers=False)
    unrolled = layouts["unrolled"]["model"]
    jax.tree.map(np.testing.assert_array_equal, pure(nnx.state(back)), pure(nnx.state(unrolled)))


@pytest.mark.slow
def test_scanned_and_unrolled_give_the_same_logits(layouts):
    assert_trees_close(layouts["scanned"]["logits"], layouts["unrolled"]["logits"])


def test_scanned_and_unrolled_give_the_same_gradients(layouts):
    assert_trees_close(unstack_blocks(layouts["scanned"]["grads"]), layouts["unrolled"]["grads"])


# Every policy once, and both layouts (the unrolled path checkpoints each block separately).
REMAT_CASES = [("scanned", "full"), ("scanned", "dots_with_no_batch_dims_saveable"), ("unrolled", "dots_saveable")]


def test_remat_cases_cover_every_named_policy():
    assert {policy for _, policy in REMAT_CASES} == set(REMAT_POLICIES) - {"none"}


@pytest.mark.slow
@pytest.mark.parametrize("layout, policy", REMAT_CASES)
def test_remat_gives_the_same_gradients_as_no_remat(deit3_layouts, images, targets, layout, policy):
    model = deit3_layouts[layout]["model"]
    _, grads = run_loss_and_grad(model, images, targets, graphdef=graphdef_with(model, remat=policy))
    assert_trees_close(grads, deit3_layouts[layout]["grads"])


@pytest.mark.parametrize("layout", ["scanned", "unrolled"])
def test_remat_policy_checkpoints_the_blocks(deit3_layouts, images, layout):
    model = deit3_layouts[layout]["model"]
    state = nnx.state(model)
    trace = lambda graphdef: str(jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, images))
    assert "remat" in trace(graphdef_with(model, remat="full"))
    assert "remat" not in trace(nnx.graphdef(model))


@pytest.fixture(scope="module")
def stochastic_depth(images):
    """Logits with drop-path rate 0.5: train mode in both layouts under keys 0 and 1; eval mode (keys 0, 1, None)."""
    unrolled = tiny(DEIT3, depth=DEPTH, init_values=0.5, drop_path_rate=0.5, drop_path_rule="constant")
    out = {}
    for layout, model in (("unrolled", unrolled), ("scanned", convert_layout(unrolled, scan_layers=True))):
        fn, state = forward_fn(model)
        out[layout] = [fn(state, images, jax.random.key(k)) for k in (0, 1)]
    unrolled.eval()
    fn, state = forward_fn(unrolled)
    out["eval"] = [fn(state, images, jax.random.key(k)) for k in (0, 1)] + [fn(state, images, None)]
    return out


def test_stochastic_depth_is_the_same_in_scanned_and_unrolled_layouts_for_the_same_key(stochastic_depth):
    """Block i gets key i of ``split(key, depth)`` in both layouts, so the same samples are dropped."""
    for scanned, unrolled in zip(stochastic_depth["scanned"], stochastic_depth["unrolled"]):
        assert_trees_close(scanned, unrolled)


def test_stochastic_depth_depends_on_the_key(stochastic_depth):
    first, second = stochastic_depth["unrolled"]
    assert float(relative_diff(first, second)) > 1e-3


def test_eval_model_returns_float32_logits_of_batch_by_classes(stochastic_depth):
    logits = stochastic_depth["eval"][0]
    assert logits.shape == (BATCH, TINY["num_classes"]) and logits.dtype == jnp.float32


def test_eval_mode_ignores_the_key_and_drops_nothing(stochastic_depth):
    with_key0, with_key1, without_key = stochastic_depth["eval"]
    np.testing.assert_array_equal(with_key0, without_key)
    np.testing.assert_array_equal(with_key1, without_key)
    assert float(relative_diff(stochastic_depth["unrolled"][0], without_key)) > 1e-3


# ---------------------------------------------------------------------------------------------------------------
# Bad input: ValueError naming the option and its value, at build time
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, overrides, must_mention", [
    (DEIT3, dict(embed_dim=30, num_heads=4), ["embed_dim=30", "num_heads=4"]),
    (DEIT3, dict(img_size=30, patch_size=4), ["img_size=30", "patch_size=4"]),
    (DEIT3, dict(drop_path_rate=1.0), ["drop_path_rate=1.0"]),
    (DEIT3, dict(drop_path_rate=-0.1), ["drop_path_rate=-0.1"]),
    (CAIT, dict(drop_path_rate=1.5), ["drop_path_rate=1.5"]),
    (CAIT, dict(branch_scaling="fixup"), ["branch_scaling='fixup'"]),
    (DEIT3, dict(branch_scaling="layernorm"), ["branch_scaling='layernorm'"]),
    (DEIT3, dict(remat="everything"), ["remat='everything'"]),
    (DEIT3, dict(drop_path_rule="cosine"), ["drop_path_rule='cosine'"]),
    (DEIT3, dict(global_pool="max"), ["global_pool='max'"]),
    (DEIT3, dict(depth=0), ["depth=0"]),
    (CAIT, dict(depth=-2), ["depth=-2"]),
    (DEIT3, dict(init_values=-1.0), ["init_values=-1.0"]),
    (DEIT3, dict(init_values="large"), ["init_values='large'"]),
    (DEIT3, dict(dtype="float64"), ["dtype='float64'"]),
    (DEIT3, dict(depthh=3), ["depthh"]),
    (CAIT, dict(global_pool="avg"), ["global_pool"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_inconsistent_options_raise_value_error_naming_option_and_value(name, overrides, must_mention):
    with pytest.raises(ValueError) as info:
        create_model(name, **overrides)
    for text in must_mention:
        assert text in str(info.value), (text, str(info.value))


@pytest.mark.parametrize("typo, closest", [("deit3_smal_patch16_224", "deit3_small_patch16_224"),
                                           ("cait_xxs24", "cait_xxs24_224"), ("DeiT3_base_patch16_224",
                                                                                "deit3_base_patch16_224")])
def test_unknown_model_name_lists_the_closest_registered_names(typo, closest):
    with pytest.raises(ValueError, match=re.escape(repr(typo))) as info:
        create_model(typo)
    assert closest in str(info.value)


@pytest.mark.parametrize("shape", [(BATCH, 32, 32, 3), (BATCH, 16, 16, 1), (BATCH, 3, 16, 16), (16, 16, 3)])
def test_images_of_the_wrong_shape_raise_naming_expected_and_actual_shapes(deit3_layouts, shape):
    with pytest.raises(ValueError) as info:
        deit3_layouts["unrolled"]["model"](jnp.zeros(shape, jnp.float32))
    assert "(batch, 16, 16, 3)" in str(info.value) and str(shape) in str(info.value)


def test_integer_images_raise():
    model = nnx.eval_shape(lambda: tiny(DEIT3, depth=1, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    with pytest.raises(ValueError, match="float images"):
        jax.eval_shape(lambda s, x: nnx.merge(graphdef, s)(x), state, jax.ShapeDtypeStruct((1, 16, 16, 3), jnp.uint8))


# ---------------------------------------------------------------------------------------------------------------
# Packaging
# ---------------------------------------------------------------------------------------------------------------
def test_importing_the_package_does_not_import_tensorflow():
    code = "import sys, layerscale_jax; print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_model_optimizer_bench_and_convert_code_needs_no_data_or_config_stack():
    """The GPU machine has jax, flax, optax and orbax but no TensorFlow, TFDS, grain or ml_collections: the model,
    optimizer, benchmark and conversion code imports and builds a model without them."""
    code = (
        "import sys\n"
        "for name in ('ml_collections', 'tensorflow', 'tensorflow_datasets', 'grain'): sys.modules[name] = None\n"
        "import layerscale_jax.bench.cli, layerscale_jax.bench.peer, layerscale_jax.convert, layerscale_jax.optim\n"
        "import layerscale_jax.lora\n"
        "from flax import nnx\n"
        "from layerscale_jax import create_model\n"
        "create_model('deit3_small_patch16_224', depth=1, embed_dim=32, num_heads=2, rngs=nnx.Rngs(0))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
