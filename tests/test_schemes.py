"""Specifications of the residual-branch schemes as their papers define them, timm's initialisation, talking-heads
attention's float32 logits under bfloat16, and ASAM's η config field.

Block equations are written out independently in numpy (float64) from the same weights (helpers shared with
``test_layers.py``); initialisation is checked against the distributions timm draws from, stated by hand.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layerscale_jax import optim
from layerscale_jax.layers import Block
from layerscale_jax.layers.attention import TalkingHeadsAttention
from layerscale_jax.models import create_model
from test_layers import (DIM, HEADS, apply, np_layer_norm, np_mlp, np_self_attention, param_paths,
                         randomize, tokens)


def scheme_block(kind):
    return Block(DIM, HEADS, branch_scaling=kind, init_value=0.1, rngs=nnx.Rngs(0))


def forward_with_ratios(module, x):
    graphdef, state = nnx.split(module)
    return jax.jit(lambda s, x: nnx.merge(graphdef, s).forward(x))(state, x)


# ---------------------------------------------------------------------------------------------------------------
# The schemes
# ---------------------------------------------------------------------------------------------------------------
def test_skipinit_is_x_plus_alpha_times_the_unnormalised_branch_with_one_alpha_per_branch():
    """De & Smith 2020: x' = x + α1·Attn(x), x'' = x' + α2·MLP(x'), no normalisation."""
    blk = scheme_block("skipinit")
    p = randomize(blk, seed=5)
    a1, a2 = float(p["ls1"]["alpha"]), float(p["ls2"]["alpha"])
    assert a1 != a2
    x = np.asarray(tokens(), np.float64)
    x1 = x + a1 * np_self_attention(x, p["attn"])
    expected = x1 + a2 * np_mlp(x1, p["mlp"])
    np.testing.assert_allclose(apply(blk, tokens()), expected, rtol=1e-4, atol=1e-5)


def test_rezero_is_x_plus_one_shared_alpha_times_each_unnormalised_branch():
    """Bachlechner et al. 2020: one α per block, x' = x + α·Attn(x), x'' = x' + α·MLP(x')."""
    blk = scheme_block("rezero")
    p = randomize(blk, seed=6)
    alpha = float(p["ls1"]["alpha"])
    x = np.asarray(tokens(), np.float64)
    x1 = x + alpha * np_self_attention(x, p["attn"])
    expected = x1 + alpha * np_mlp(x1, p["mlp"])
    np.testing.assert_allclose(apply(blk, tokens()), expected, rtol=1e-4, atol=1e-5)


def test_rezero_alpha_gradient_sums_the_contributions_of_both_branches():
    """∂x''/∂α = Attn(x) + MLP'(x')·… ≠ 0 at α = 0: with α = 0, x' = x, so d(Σ x'')/dα = Σ Attn(x) + Σ MLP(x)."""
    blk = scheme_block("rezero")
    p = randomize(blk, seed=7)
    state = nnx.state(blk, nnx.Param)
    state["ls1"]["alpha"].set_value(jnp.zeros((), jnp.float32))
    nnx.update(blk, state)
    graphdef, full = nnx.split(blk)
    grads = jax.jit(jax.grad(lambda s: jnp.sum(nnx.merge(graphdef, s)(tokens()))))(full)
    x = np.asarray(tokens(), np.float64)
    expected = np.sum(np_self_attention(x, p["attn"])) + np.sum(np_mlp(x, p["mlp"]))
    np.testing.assert_allclose(float(grads["ls1"]["alpha"][...]), expected, rtol=1e-4)


def test_scalar_zero_is_x_plus_alpha_times_the_layernormed_branch():
    """LayerNorm kept, one α per branch, α = 0 at init: x' = x + α1·Attn(LN(x)), x'' = x' + α2·MLP(LN(x'))."""
    blk = scheme_block("scalar_zero")
    assert float(param_paths(blk)["ls1/alpha"]) == 0.0
    p = randomize(blk, seed=8)
    x = np.asarray(tokens(), np.float64)
    x1 = x + float(p["ls1"]["alpha"]) * np_self_attention(np_layer_norm(x, p["norm1"]), p["attn"])
    expected = x1 + float(p["ls2"]["alpha"]) * np_mlp(np_layer_norm(x1, p["norm2"]), p["mlp"])
    np.testing.assert_allclose(apply(blk, tokens()), expected, rtol=1e-4, atol=1e-5)


def test_unknown_branch_scaling_lists_the_schemes():
    with pytest.raises(ValueError, match="branch_scaling='fixup' is not one of .*scalar_zero"):
        create_model("deit3_small_patch16_224", branch_scaling="fixup")


def test_block_forward_returns_each_scaled_branch_over_the_stream_it_joins():
    """ratio_1 = ‖λ1 ⊙ Attn(LN(x))‖ / ‖x‖, ratio_2 = ‖λ2 ⊙ MLP(LN(x'))‖ / ‖x'‖ (Frobenius over the batch)."""
    blk = scheme_block("layerscale")
    p = randomize(blk, seed=9)
    x = np.asarray(tokens(), np.float64)
    b1 = p["ls1"]["gamma"] * np_self_attention(np_layer_norm(x, p["norm1"]), p["attn"])
    x1 = x + b1
    b2 = p["ls2"]["gamma"] * np_mlp(np_layer_norm(x1, p["norm2"]), p["mlp"])
    out, ratios = forward_with_ratios(blk, tokens())
    np.testing.assert_allclose(out, x1 + b2, rtol=1e-4, atol=1e-5)
    expected = [np.linalg.norm(b1) / np.linalg.norm(x), np.linalg.norm(b2) / np.linalg.norm(x1)]
    np.testing.assert_allclose(ratios, expected, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# Talking-heads attention under bfloat16
# ---------------------------------------------------------------------------------------------------------------
def all_equations(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs nested in its equations' parameters (pjit, custom_vjp, ...)."""
    found = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found.extend(all_equations(inner))
    return found


def test_talking_heads_mixes_logits_and_takes_the_softmax_in_float32_under_bfloat16():
    """Every head-mixing matmul (contraction over the 4 heads) and the softmax's exp see float32 operands."""
    heads = 4
    attn = TalkingHeadsAttention(DIM, heads, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(attn)
    jaxpr = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, tokens().astype(jnp.bfloat16))
    eqns = all_equations(jaxpr.jaxpr)
    mixings = [e for e in eqns if e.primitive.name == "dot_general"
               and e.invars[0].aval.shape[e.params["dimension_numbers"][0][0][0]] == heads]
    exps = [e for e in eqns if e.primitive.name == "exp"]
    assert len(mixings) == 2 and exps
    for e in mixings + exps:
        assert all(v.aval.dtype == jnp.float32 for v in e.invars), e
    out = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, tokens().astype(jnp.bfloat16))
    assert out.dtype == jnp.bfloat16


# ---------------------------------------------------------------------------------------------------------------
# Initialisation = timm's (VisionTransformer.init_weights, CaiT._init_weights), stated by hand
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deit3_small_depth1():
    model = create_model("deit3_small_patch16_224", depth=1)
    return param_paths(model)


@pytest.mark.slow
def test_patch_embedding_is_pytorch_conv2d_default_uniform(deit3_small_depth1):
    """kaiming_uniform_(a=√5): U(±1/√fan_in), fan_in = 16·16·3 = 768, so std = 1/√(3·768) = 0.0208; same bound for
    the bias."""
    kernel, bias = deit3_small_depth1["patch_embed/proj/kernel"], deit3_small_depth1["patch_embed/proj/bias"]
    bound = 1.0 / math.sqrt(768)
    assert np.abs(kernel).max() <= bound and np.abs(kernel).max() > 0.99 * bound
    assert kernel.std() == pytest.approx(bound / math.sqrt(3), rel=0.01)
    assert np.abs(bias).max() <= bound and bias.std() > 0.5 * bound / math.sqrt(3)


def test_linear_kernels_are_normal_std_002_truncated_at_plus_minus_two_absolute(deit3_small_depth1):
    """timm trunc_normal_(std=.02, a=-2, b=2): effectively N(0, 0.02²) (flax's ±2σ truncation would give 0.0176)."""
    for name in ("blocks/0/attn/qkv/kernel", "blocks/0/mlp/fc1/kernel", "head/kernel"):
        kernel = deit3_small_depth1[name]
        assert kernel.std() == pytest.approx(0.02, rel=0.01), name
        assert 6 * 0.02 >= np.abs(kernel).max() > 3 * 0.02, name     # tails beyond 2σ, none beyond 6σ
        assert np.all(deit3_small_depth1[name.replace("kernel", "bias")] == 0)


@pytest.mark.slow
def test_layernorm_is_one_and_zero_and_tokens_follow_timm(deit3_small_depth1):
    assert np.all(deit3_small_depth1["blocks/0/norm1/scale"] == 1) and np.all(deit3_small_depth1["norm/bias"] == 0)
    assert deit3_small_depth1["cls_token"].std() == pytest.approx(1e-6, rel=0.2)      # nn.init.normal_(std=1e-6)
    assert deit3_small_depth1["pos_embed"].std() == pytest.approx(0.02, rel=0.02)
    cait = param_paths(create_model("cait_xxs24_224", depth=1, depth_token_only=1))
    assert cait["cls_token"].std() == pytest.approx(0.02, rel=0.25)                   # CaiT: trunc_normal(.02)
    assert cait["blocks/0/attn/proj_l/kernel"].std() == pytest.approx(0.02, rel=0.3)


# ---------------------------------------------------------------------------------------------------------------
# ASAM's η is a validated config field
# ---------------------------------------------------------------------------------------------------------------
def test_sam_eta_defaults_to_the_official_asam_value_and_negative_values_are_refused():
    config = optim.default_config()
    assert config.sam_eta == 0.01
    config.sam_eta = -1.0
    with pytest.raises(ValueError, match=r"optim.sam_eta=-1.0"):
        optim.validate_config(config)
