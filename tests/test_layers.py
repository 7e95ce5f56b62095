"""Specifications of the building blocks: LayerScale and the other branch scalings, DropPath, attention, blocks.

The block tests check the JAX code against the block equations written out independently in numpy (float64) from
the same weights, e.g. ``x' = x + λ1 ⊙ Attn(LN(x))``, ``x'' = x' + λ2 ⊙ MLP(LN(x'))``.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layerscale_jax.layers import (Block, ClassAttentionBlock, DropPath, LayerScale, cait_init_value, drop_path,
                                   drop_path_rates, resolve_init_value)
from layerscale_jax.layers.common import gelu

DIM, HEADS, TOKENS, BATCH = 32, 2, 5, 2   # the width and heads of the tiny models in test_models.py
# XLA:CPU compiles these tiny programs faster without backend optimisation; the tests check the models'
# mathematics, not XLA's optimisations.
FAST_COMPILE = ({"xla_backend_optimization_level": 0}
                if jax.default_backend() == "cpu" else {})


# ---------------------------------------------------------------------------------------------------------------
# numpy reference of the block equations
# ---------------------------------------------------------------------------------------------------------------
def np_layer_norm(x, p, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def np_dense(x, p):
    return x @ p["kernel"] + p["bias"]


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


_erf = np.vectorize(math.erf)


def np_mlp(x, p):
    h = np_dense(x, p["fc1"])
    return np_dense(0.5 * h * (1.0 + _erf(h / math.sqrt(2.0))), p["fc2"])


def np_heads(x):            # (b, n, d) -> (b, h, n, d_h)
    b, n, d = x.shape
    return x.reshape(b, n, HEADS, d // HEADS).transpose(0, 2, 1, 3)


def np_merge_heads(x):      # (b, h, n, d_h) -> (b, n, d)
    b, h, n, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n, h * dh)


def np_qkv(x, p):
    """q, k, v ``(b, h, n, d_h)`` from the fused projection, whose columns are heads-major: column
    ``(h·3 + j)·d_h + i`` is component i of head h's query (j = 0), key (1) or value (2)."""
    b, n, d = x.shape
    qkv = np_dense(x, p["qkv"]).reshape(b, n, HEADS, 3, d // HEADS)
    return (qkv[:, :, :, j].transpose(0, 2, 1, 3) for j in range(3))


def np_self_attention(x, p):
    """softmax(q kᵀ/√d_h) v per head."""
    d = x.shape[-1]
    q, k, v = np_qkv(x, p)
    a = np_softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // HEADS))
    return np_dense(np_merge_heads(a @ v), p["proj"])


def np_talking_heads_attention(x, p):
    """Logits mixed across heads by P_l before the softmax, weights mixed by P_w after it (Shazeer et al.)."""
    d = x.shape[-1]
    q, k, v = np_qkv(x, p)
    logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // HEADS)                 # (b, h, n, n)
    mix = lambda a, lin: np.einsum("bhqk,hg->bgqk", a, lin["kernel"]) + lin["bias"][:, None, None]
    weights = mix(np_softmax(mix(logits, p["proj_l"])), p["proj_w"])
    return np_dense(np_merge_heads(weights @ v), p["proj"])


def np_class_attention(tokens, p):
    """Only the class token (position 0) queries; keys and values come from every token."""
    q = np_heads(np_dense(tokens[:, :1], p["q"]))
    k, v = np_heads(np_dense(tokens, p["k"])), np_heads(np_dense(tokens, p["v"]))
    a = np_softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(tokens.shape[-1] // HEADS))
    return np_dense(np_merge_heads(a @ v), p["proj"])


def np_block(x, p, attention):
    x = x + p["ls1"]["gamma"] * attention(np_layer_norm(x, p["norm1"]), p["attn"])
    return x + p["ls2"]["gamma"] * np_mlp(np_layer_norm(x, p["norm2"]), p["mlp"])


def randomize(module, seed):
    """Give every parameter a random value (LayerScale λ distinct per channel), so no term hides behind ε ≈ 0.

    Returns the new parameters as a float64 numpy tree for the reference.
    """
    rng = np.random.default_rng(seed)
    state = nnx.state(module, nnx.Param)
    tree = jax.tree.map(lambda a: rng.normal(0.0, 0.3, a.shape), nnx.to_pure_dict(state))
    for ls in ("ls1", "ls2"):
        if "gamma" in tree.get(ls, {}):
            tree[ls]["gamma"] = rng.uniform(-1.0, 1.0, DIM)
    for norm in ("norm1", "norm2"):
        if norm in tree:
            tree[norm]["scale"] = 1.0 + tree[norm]["scale"]
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree))
    nnx.update(module, state)
    return jax.tree.map(lambda a: np.asarray(np.asarray(a, np.float32), np.float64), tree)


def apply(module, *args):
    """``module(*args)`` compiled as one function (eager dispatch of every op is slower than one compile)."""
    graphdef, state = nnx.split(module)
    fn = jax.jit(lambda state, *args: nnx.merge(graphdef, state)(*args), compiler_options=FAST_COMPILE)
    return fn(state, *args)


def grad_of_weighted_sum(module, upstream, *args):
    """d/dparams Σ upstream ⊙ module(*args): the gradient for an arbitrary upstream gradient."""
    graphdef, state = nnx.split(module)
    loss = lambda state: jnp.sum(upstream * nnx.merge(graphdef, state)(*args))
    return jax.jit(jax.grad(loss), compiler_options=FAST_COMPILE)(state)


def tokens(seed=0, n=TOKENS):
    return jax.random.normal(jax.random.key(seed), (BATCH, n, DIM), jnp.float32)


# ---------------------------------------------------------------------------------------------------------------
# exact GELU (custom derivative)
# ---------------------------------------------------------------------------------------------------------------
def np_gelu(a):
    return 0.5 * a * (1.0 + _erf(a / math.sqrt(2.0)))


GELU_POINTS = np.concatenate([np.linspace(-7.0, 7.0, 281), [-0.0, 1e-4, -1e-4, 30.0, -30.0]])


def test_gelu_matches_the_float64_erf_formula():
    """Within float32 rounding of ``1 + erf(·)`` (PyTorch's formula too): |error| ≤ |a| · 2⁻²⁴ + 1 ulp, so 5e-7 here."""
    got = np.asarray(jax.jit(gelu)(jnp.asarray(GELU_POINTS, jnp.float32)), np.float64)
    np.testing.assert_allclose(got, np_gelu(GELU_POINTS), rtol=2e-6, atol=5e-7)


def test_gelu_derivative_matches_central_differences_of_the_float64_formula():
    h = 1e-5
    want = (np_gelu(GELU_POINTS + h) - np_gelu(GELU_POINTS - h)) / (2 * h)
    upstream = np.random.default_rng(0).uniform(0.5, 2.0, GELU_POINTS.shape)
    got = jax.jit(jax.grad(lambda a, u: jnp.sum(u * gelu(a))))(jnp.asarray(GELU_POINTS, jnp.float32),
                                                                jnp.asarray(upstream, jnp.float32))
    np.testing.assert_allclose(np.asarray(got, np.float64), upstream * want, rtol=1e-5, atol=1e-6)


def test_gelu_keeps_the_compute_dtype_in_both_passes():
    a = jnp.linspace(-3.0, 3.0, 64, dtype=jnp.bfloat16)
    out, pull = jax.vjp(gelu, a)
    (grad,) = pull(jnp.ones_like(out))
    assert out.dtype == grad.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float64), np_gelu(np.asarray(a, np.float64)), rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------------------------------------------------
# a branch scale folded into the output layer: x (W diag s) + s ⊙ b = s ⊙ (x W + b)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale_shape", [(DIM,), ()])
def test_folded_scale_equals_scaling_the_layer_output_and_so_do_its_gradients(scale_shape):
    from layerscale_jax.layers.common import dense, linear
    layer = dense(DIM, DIM, (None, None), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(5)
    w, b = rng.normal(0, 0.3, (DIM, DIM)), rng.normal(0, 0.3, DIM)
    layer.kernel[...], layer.bias[...] = jnp.asarray(w, jnp.float32), jnp.asarray(b, jnp.float32)
    x = rng.normal(0, 1, (7, DIM))
    s = rng.uniform(-1, 1, scale_shape)
    upstream = rng.normal(0, 1, (7, DIM))

    def loss(s, layer):
        return jnp.sum(jnp.asarray(upstream, jnp.float32) * linear(layer, jnp.asarray(x, jnp.float32), s))

    # float32 maths on every backend: a GPU's float32 matmuls default to TF32 (10-bit mantissa), ~1e-3 off here
    with jax.default_matmul_precision("highest"):
        value = jax.jit(lambda s: linear(layer, jnp.asarray(x, jnp.float32), s))(jnp.asarray(s, jnp.float32))
        grad_s, grad_layer = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(s, jnp.float32), layer)
    np.testing.assert_allclose(value, s * (x @ w + b), rtol=1e-5, atol=1e-5)
    want_s = (upstream * (x @ w + b)).sum(0)                               # ∂/∂s of Σ u ⊙ s ⊙ (xW + b)
    np.testing.assert_allclose(grad_s, want_s if scale_shape else want_s.sum(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grad_layer.kernel[...], x.T @ (upstream * s), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grad_layer.bias[...], (upstream * s).sum(0), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# LayerScale and the CaiT ε rule
# ---------------------------------------------------------------------------------------------------------------
def test_layerscale_is_a_float32_per_channel_vector_initialised_to_epsilon():
    ls = LayerScale(DIM, 1e-5)
    assert ls.gamma.shape == (DIM,) and ls.gamma.dtype == jnp.float32
    np.testing.assert_array_equal(ls.gamma[...], np.full(DIM, 1e-5, np.float32))


@pytest.mark.parametrize("depth, eps", [(1, 0.1), (12, 0.1), (18, 0.1), (19, 1e-5), (24, 1e-5), (25, 1e-6),
                                        (36, 1e-6), (48, 1e-6)])
def test_cait_rule_gives_epsilon_from_depth(depth, eps):
    assert cait_init_value(depth) == eps


def test_auto_init_values_apply_the_cait_rule_to_layerscale_and_scalar():
    assert resolve_init_value("layerscale", "auto", 24) == 1e-5
    assert resolve_init_value("scalar", "auto", 12) == 0.1
    assert resolve_init_value("layerscale", 3e-4, 24) == 3e-4


@pytest.mark.parametrize("kind", ["scalar_zero", "rezero", "skipinit"])
def test_zero_init_scalings_resolve_to_zero_whatever_init_values_say(kind):
    assert resolve_init_value(kind, "auto", 12) == 0.0
    assert resolve_init_value(kind, 0.1, 12) == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Branch-scaling kinds inside a block
# ---------------------------------------------------------------------------------------------------------------
def param_paths(module):
    """``{"ls1/gamma": array, ...}`` for every parameter of ``module``."""
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(module, nnx.Param)))[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf) for path, leaf in flat}


def block(kind, init_value=0.1, cls=Block, seed=0):
    return cls(DIM, HEADS, branch_scaling=kind, init_value=init_value, rngs=nnx.Rngs(seed))


def test_layerscale_block_has_a_lambda_vector_per_branch():
    params = param_paths(block("layerscale"))
    for name in ("ls1/gamma", "ls2/gamma"):
        np.testing.assert_array_equal(params[name], np.full(DIM, 0.1, np.float32))
    assert {"norm1/scale", "norm2/scale"} <= set(params)


def test_scalar_block_has_one_alpha_per_branch_initialised_to_epsilon():
    params = param_paths(block("scalar"))
    for name in ("ls1/alpha", "ls2/alpha"):
        assert params[name].shape == () and float(params[name]) == pytest.approx(0.1)
    assert not any("gamma" in name for name in params)


def test_rezero_block_has_no_layernorm_and_one_zero_alpha_shared_by_both_branches():
    params = param_paths(block("rezero"))
    assert not any(name.startswith(("norm1", "norm2")) for name in params)
    assert [name for name in params if name.startswith("ls")] == ["ls1/alpha"]
    assert float(params["ls1/alpha"]) == 0.0


def test_skipinit_block_has_no_normalisation_and_a_zero_alpha_per_branch_even_when_given_an_init_value():
    params = param_paths(block("skipinit"))
    assert not any(name.startswith(("norm1", "norm2")) for name in params)
    assert float(params["ls1/alpha"]) == 0.0 and float(params["ls2/alpha"]) == 0.0


def test_scalar_zero_block_keeps_layernorm_and_has_a_zero_alpha_per_branch_even_when_given_an_init_value():
    params = param_paths(block("scalar_zero"))
    assert {"norm1/scale", "norm1/bias", "norm2/scale", "norm2/bias"} <= set(params)
    assert float(params["ls1/alpha"]) == 0.0 and float(params["ls2/alpha"]) == 0.0


def test_none_block_has_no_scale_parameters():
    params = param_paths(block("none"))
    assert not any(name.startswith(("ls1", "ls2")) for name in params)
    assert {"norm1/scale", "norm2/scale"} <= set(params)


@pytest.mark.parametrize("kind", ["scalar_zero", "rezero", "skipinit"])
def test_zero_initialised_scalings_make_the_block_the_identity_at_init(kind):
    x = tokens()
    np.testing.assert_array_equal(apply(block(kind, init_value=0.1), x), x)


def test_none_block_adds_the_unscaled_branches():
    blk = block("none")
    p = randomize(blk, seed=3)
    x = tokens()
    expected = np_block(np.asarray(x, np.float64), {**p, "ls1": {"gamma": 1.0}, "ls2": {"gamma": 1.0}},
                        np_self_attention)
    np.testing.assert_allclose(apply(blk, x), expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Blocks against the numpy reference
# ---------------------------------------------------------------------------------------------------------------
def test_layerscale_block_matches_numpy_x_plus_lambda_times_branch_of_layernorm():
    blk = block("layerscale")
    p = randomize(blk, seed=1)
    x = tokens()
    np.testing.assert_allclose(apply(blk, x), np_block(np.asarray(x, np.float64), p, np_self_attention),
                               rtol=1e-4, atol=1e-5)


def test_talking_heads_block_matches_numpy_reference():
    blk = Block(DIM, HEADS, attention="talking_heads", init_value=0.1, rngs=nnx.Rngs(0))
    p = randomize(blk, seed=2)
    x = tokens()
    np.testing.assert_allclose(apply(blk, x), np_block(np.asarray(x, np.float64), p, np_talking_heads_attention),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", ["einsum", "xla"])
def test_each_attention_implementation_gives_the_numpy_block(impl):
    blk = Block(DIM, HEADS, attention_impl=impl, init_value=0.1, rngs=nnx.Rngs(0))
    p = randomize(blk, seed=1)
    x = tokens()
    np.testing.assert_allclose(apply(blk, x), np_block(np.asarray(x, np.float64), p, np_self_attention),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n, multiple", [(5, 2), (5, 8), (6, 2)])
def test_padded_masked_attention_equals_plain_attention_and_so_do_its_gradients(n, multiple):
    """The cuDNN path's padding (``padded_attention``), run through XLA's implementation on the CPU: the padded
    keys are masked, the padded queries sliced off, so values and gradients are those of attention over n tokens."""
    from layerscale_jax.layers.attention import padded_attention
    rng = np.random.default_rng(n + multiple)
    q, k, v, upstream = (jnp.asarray(rng.normal(0, 1, (BATCH, n, HEADS, 8)), jnp.float32) for _ in range(4))

    def loss(fn, q, k, v):
        return jnp.sum(upstream * fn(q, k, v))

    plain = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla")
    padded = lambda q, k, v: padded_attention(q, k, v, multiple, implementation="xla")
    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(jax.jit(padded)(q, k, v), jax.jit(plain)(q, k, v), rtol=1e-5, atol=1e-6)
        want = jax.jit(jax.grad(lambda *a: loss(plain, *a), argnums=(0, 1, 2)))(q, k, v)
        got = jax.jit(jax.grad(lambda *a: loss(padded, *a), argnums=(0, 1, 2)))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # the reference: softmax(q kᵀ/√d) v in float64 numpy
    qh, kh, vh = (np.asarray(t, np.float64).transpose(0, 2, 1, 3) for t in (q, k, v))
    ref = (np_softmax(qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(8)) @ vh).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(jax.jit(padded)(q, k, v), ref, rtol=1e-4, atol=1e-5)


def test_auto_attention_is_einsum_on_cpu_cudnn_on_gpu_where_cudnn_takes_the_shapes_and_xla_elsewhere():
    from layerscale_jax.layers.attention import resolve_attention_impl
    assert resolve_attention_impl("auto", "cpu", jnp.bfloat16, 64) == "einsum"
    assert resolve_attention_impl("auto", "cuda", jnp.bfloat16, 64) == "cudnn"
    assert resolve_attention_impl("auto", "gpu", jnp.float16, 128) == "cudnn"
    assert resolve_attention_impl("auto", "gpu", jnp.float32, 64) == "xla"        # cuDNN's kernel: 16-bit only
    assert resolve_attention_impl("auto", "gpu", jnp.bfloat16, 12) == "xla"       # head dim not a multiple of 8
    assert resolve_attention_impl("auto", "tpu", jnp.bfloat16, 64) == "xla"
    assert resolve_attention_impl("xla", "gpu", jnp.bfloat16, 64) == "xla"        # an explicit choice stays
    with pytest.raises(ValueError, match="attention_impl='flash' is not one of"):
        resolve_attention_impl("flash", "gpu", jnp.bfloat16, 64)


def test_attention_impl_is_a_model_field_checked_where_the_model_config_enters():
    from layerscale_jax import create_model
    from layerscale_jax.models import model_config
    assert model_config("deit3_small_patch16_224", attention_impl="cudnn").attention_impl == "cudnn"
    assert model_config("mae_deit3_small_patch16_224").attention_impl == "auto"
    with pytest.raises(ValueError, match="attention_impl='fast' is not one of"):
        create_model("deit3_small_patch16_224", attention_impl="fast")


def test_class_attention_block_updates_the_class_token_as_numpy_reference():
    """x_cls' = x_cls + λ1 ⊙ CA(LN([x_cls, x_patches])) ;  x_cls'' = x_cls' + λ2 ⊙ MLP(LN(x_cls'))."""
    blk = block("layerscale", cls=ClassAttentionBlock)
    p = randomize(blk, seed=4)
    cls_tok, patches = tokens(5, n=1), tokens(6)
    out = apply(blk, cls_tok, patches)
    assert out.shape == (BATCH, 1, DIM)
    c, u = np.asarray(cls_tok, np.float64), np.concatenate([cls_tok, patches], axis=1).astype(np.float64)
    c = c + p["ls1"]["gamma"] * np_class_attention(np_layer_norm(u, p["norm1"]), p["attn"])
    c = c + p["ls2"]["gamma"] * np_mlp(np_layer_norm(c, p["norm2"]), p["mlp"])
    np.testing.assert_allclose(out, c, rtol=1e-4, atol=1e-5)


def test_each_channel_of_each_lambda_gets_its_own_gradient_at_init():
    blk = block("layerscale", init_value=1e-6)
    grads = grad_of_weighted_sum(blk, tokens(8), tokens(7))
    for ls in ("ls1", "ls2"):
        g = np.asarray(grads[ls]["gamma"][...])
        assert np.all(g != 0), ls
        assert len(np.unique(g)) == DIM, f"{ls}: channels share gradient values {g}"


# ---------------------------------------------------------------------------------------------------------------
# DropPath
# ---------------------------------------------------------------------------------------------------------------
def test_drop_path_keeps_the_expectation():
    """Monte-Carlo over 4,000 keys: E[DropPath(x)] = x (5σ tolerance at rate 0.25)."""
    x = tokens(9)
    keys = jax.random.split(jax.random.key(0), 4_000)
    samples = jax.jit(jax.vmap(lambda k: drop_path(x, 0.25, k)))(keys)
    mean = np.asarray(samples.mean(axis=0))
    sigma = np.abs(np.asarray(x)) * math.sqrt(0.25 / 0.75 / len(keys))
    assert np.all(np.abs(mean - np.asarray(x)) <= 5 * sigma + 1e-6)


def test_drop_path_drops_or_rescales_whole_samples():
    x = jnp.ones((4000, TOKENS, DIM), jnp.float32)
    out = np.asarray(drop_path(x, 0.25, jax.random.key(1)))
    per_sample = out.reshape(len(out), -1)
    kept = per_sample[:, 0] != 0
    np.testing.assert_array_equal(per_sample[kept], np.float32(1 / 0.75))
    np.testing.assert_array_equal(per_sample[~kept], 0.0)
    assert abs((~kept).mean() - 0.25) < 0.03


def test_block_drop_path_drops_whole_samples_of_its_token_matrix():
    """The block works on the (batch · tokens, dim) token matrix; DropPath must still drop whole samples."""
    blk = Block(DIM, HEADS, branch_scaling="none", drop_path=0.5, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(3), (16, TOKENS, DIM), jnp.float32)
    graphdef, state = nnx.split(blk)

    def run(state, x, key, train):
        b = nnx.merge(graphdef, state)
        b.mlp.fc2.kernel[...] = jnp.zeros_like(b.mlp.fc2.kernel[...])     # only the attention branch remains
        b.mlp.fc2.bias[...] = jnp.zeros_like(b.mlp.fc2.bias[...])
        if not train:
            b.eval()
        return b(x, key=key)

    run = jax.jit(run, static_argnums=3, compiler_options=FAST_COMPILE)
    branch = np.asarray(run(state, x, None, False) - x)
    update = np.asarray(run(state, x, jax.random.key(4), True) - x)
    dropped = np.all(update == 0.0, axis=(1, 2))
    np.testing.assert_allclose(update[~dropped], branch[~dropped] / 0.5, rtol=1e-5, atol=1e-6)
    assert 0 < dropped.sum() < len(dropped)


def test_drop_path_with_a_traced_rate_draws_the_same_mask_as_a_static_rate():
    x, key = tokens(10), jax.random.key(2)
    np.testing.assert_array_equal(drop_path(x, 0.4, key), jax.jit(drop_path)(x, jnp.float32(0.4), key))


def test_drop_path_is_the_identity_at_eval():
    dp = DropPath(0.5)
    dp.eval()
    x = tokens(11)
    np.testing.assert_array_equal(dp(x, jax.random.key(0)), x)
    np.testing.assert_array_equal(dp(x, None), x)


def test_drop_path_at_train_time_is_random():
    dp, x = DropPath(0.5), jnp.ones((64, 1, 1))
    assert not np.array_equal(dp(x, jax.random.key(0)), dp(x, jax.random.key(1)))


def test_drop_path_with_zero_rate_needs_no_key():
    x = tokens(12)
    np.testing.assert_array_equal(DropPath(0.0)(x, None), x)


def test_drop_path_in_train_mode_without_a_key_raises():
    with pytest.raises(ValueError, match="PRNG key"):
        DropPath(0.1)(tokens(), None)


def test_linear_rule_grows_from_zero_to_the_rate():
    np.testing.assert_allclose(drop_path_rates(0.2, 5, "linear"), [0.0, 0.05, 0.1, 0.15, 0.2], rtol=1e-6)


def test_constant_rule_uses_the_rate_in_every_block():
    np.testing.assert_array_equal(drop_path_rates(0.2, 4, "constant"), np.full(4, 0.2, np.float32))


def test_unknown_drop_path_rule_raises():
    with pytest.raises(ValueError, match="drop_path_rule='cosine'"):
        drop_path_rates(0.1, 4, "cosine")
