"""The ``--vs-peer`` side: big_vision's ViT-S/16 architecture, re-implemented in the bench with flax linen.

As ``big_vision/models/vit.py`` builds it with ViT-S/16's default ``pool_type="gap"``: no class token, no LayerScale,

    x_0 = Conv_P(image) + E_pos                          (learned; n_patches tokens, 196 at 224² and patch 16)
    x'  = x + MHA(LN(x)) ;  x_l = x' + MLP(LN(x'))       MLP(y) = W₂ gelu(W₁ y + b₁) + b₂    (linen's tanh GELU)
    logits = W_h mean_tokens(LN(x_L)) + b_h              (W_h zero-initialised)

with our config's width, depth, heads, MLP width, patch, image size and classes (deit3_small_patch16_224: ViT-S/16),
trained by ``step``'s protocol: the same batch, dtype, cross-entropy and optax AdamW, jitted, donated (unrolled).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from layerscale_jax.bench import timing
from layerscale_jax.errors import ConfigError

LABEL = "big_vision ViT-S/16 architecture (re-implemented in the bench with flax linen)"


class EncoderBlock(nn.Module):
    num_heads: int
    mlp_dim: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        y = nn.LayerNorm(dtype=self.dtype)(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, dtype=self.dtype,
                                                kernel_init=nn.initializers.xavier_uniform())(y, y)
        dense = dict(dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
                     bias_init=nn.initializers.normal(stddev=1e-6))
        y = nn.Dense(self.mlp_dim, **dense)(nn.LayerNorm(dtype=self.dtype)(x))
        return x + nn.Dense(x.shape[-1], **dense)(nn.gelu(y))


class BigVisionViT(nn.Module):
    num_classes: int
    patch_size: int
    width: int
    depth: int
    num_heads: int
    mlp_dim: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, images):
        p = (self.patch_size, self.patch_size)
        x = nn.Conv(self.width, p, strides=p, padding="VALID", dtype=self.dtype, name="embedding")(images)
        n, h, w, c = x.shape
        x = x.reshape(n, h * w, c) + self.param("pos_embedding", nn.initializers.normal(stddev=1 / np.sqrt(c)),
                                                (1, h * w, c))
        for i in range(self.depth):
            x = EncoderBlock(self.num_heads, self.mlp_dim, self.dtype, name=f"encoderblock_{i}")(x)
        x = nn.LayerNorm(dtype=self.dtype, name="encoder_norm")(x).mean(axis=1)
        return nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros, name="head")(x)


def check(cfg, model: str) -> None:
    """The peer is a plain ViT: refuse any other family (CaiT) before anything is compiled."""
    from layerscale_jax.arch import ViTConfig
    if type(cfg) is not ViTConfig:
        raise ConfigError(f"--vs-peer: model {model!r} is a {type(cfg).__name__[:-6]}, and the peer ({LABEL}) is a "
                          "plain ViT; use --vs-peer with a ViT model such as deit3_small_patch16_224")


def compile_step(cfg, images, labels, tx: optax.GradientTransformation, seed: int = 0) -> tuple[timing.Loop, int]:
    """The peer's jitted, donated train step on ``images, labels`` (a ``timing.Loop``) and its parameter count."""
    model = BigVisionViT(cfg.num_classes, cfg.patch_size, cfg.embed_dim, cfg.depth, cfg.num_heads,
                         int(cfg.embed_dim * cfg.mlp_ratio), jnp.dtype(cfg.dtype))
    params = model.init(jax.random.key(seed), images[:1])["params"]

    def step(state, images, labels):
        loss_fn = lambda p: optax.softmax_cross_entropy_with_integer_labels(  # noqa: E731
            model.apply({"params": p}, images).astype(jnp.float32), labels).mean()
        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

    state = {"params": params, "opt_state": tx.init(params)}
    compiled = jax.jit(step, donate_argnums=0).lower(state, images, labels).compile()
    return timing.Loop(compiled, state, images, labels), int(sum(x.size for x in jax.tree.leaves(params)))
