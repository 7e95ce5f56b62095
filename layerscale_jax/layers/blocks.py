"""Pre-norm transformer blocks with a scaled residual branch.

Self-attention block (ViT / DeiT III / CaiT's first stage), with ``S`` the branch scaling (LayerScale by default)::

    x'  = x  + DropPath(S1(Attn(LN(x))))
    x'' = x' + DropPath(S2(MLP(LN(x'))))

Class-attention block (CaiT's second stage), updating only the class token::

    x_cls'  = x_cls  + DropPath(S1(CA(LN([x_cls, x_patches]))))
    x_cls'' = x_cls' + DropPath(S2(MLP(LN(x_cls'))))

ReZero (``branch_scaling="rezero"``) has one α per block: ``ls1`` scales both branches and there is no ``ls2``.
``forward(...)`` also returns the ratio ``‖S_k(f_k(·))‖ / ‖x‖`` of each branch to the stream it is added to (the
per-block diagnostics of ``layerscale_jax.train.diagnostics``); ``__call__`` drops it, and XLA removes its cost.

The residual stream ``x`` is float32; the branches compute in ``dtype`` and the scaling and the add are float32.
A learned scale (LayerScale's λ, a scalar α) is folded into the branch's output layer, ``x (W diag λ) + λ ⊙ b``
(``layers.common.linear``): the same function, whose backward pass has no extra pass over the tokens.
Inside ``Block`` the stream is the ``(batch · tokens, dim)`` token matrix (a free reshape): every dense layer is one
2-D matmul, and the gradients of biases, LayerNorm's affine and LayerScale's λ are column sums of a matrix, which
XLA's CPU backend computes several times faster than the same sums over two leading axes, and without transposed
copies of the activations for the weight gradients.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from layerscale_jax.errors import ConfigError
from layerscale_jax.layers.attention import Attention, ClassAttention, TalkingHeadsAttention
from layerscale_jax.layers.common import Mlp, layer_norm
from layerscale_jax.layers.drop_path import DropPath
from layerscale_jax.layers.lora import dropout_rng
from layerscale_jax.layers.partitioning import constrain
from layerscale_jax.layers.scaling import keeps_layernorm, make_branch_scale, shares_scale_across_branches


def _stream(x: jnp.ndarray) -> jnp.ndarray:
    """The residual stream, a ``(batch · tokens, dim)`` token matrix: split by examples, whole along ``dim``."""
    return constrain(x, ("batch", None))


def branch_to_stream_ratio(branch: jnp.ndarray, stream: jnp.ndarray) -> jnp.ndarray:
    """``‖S·f(LN(x))‖ / ‖x‖``: Frobenius norms over every sample, token and channel, float32 (0 when ‖x‖ = 0)."""
    num = jnp.sqrt(jnp.sum(jnp.square(branch.astype(jnp.float32))))
    den = jnp.sqrt(jnp.sum(jnp.square(stream.astype(jnp.float32))))
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


class _ScaledResidualBlock(nnx.Module):
    def _norm(self, norm, x):
        return norm(x) if norm is not None else x.astype(self.dtype)

    def _keys(self, key):
        return (None, None) if key is None else tuple(jax.random.split(key))

    @staticmethod
    def _scaled(branch, scale, h):
        """``S(branch(h))`` in float32, the scale ``S`` folded into the branch's output layer."""
        return branch(h, out_scale=scale.factor()).astype(jnp.float32)

    def _second_scale(self):
        """The MLP branch's scale: ``ls2``, or ReZero's single per-block α (``ls1``)."""
        return self.ls1 if self.ls2 is None else self.ls2

    def branch_scales(self) -> tuple[nnx.Module, nnx.Module]:
        """The scale modules ``(S1, S2)`` of the attention and MLP branches (ReZero: the same α twice); each one's
        ``factor()`` is λ, α or ``None`` (no scaling)."""
        return self.ls1, self._second_scale()

    def _drop(self, branch, batch, key, rate):
        """DropPath of a token-matrix branch: whole samples are dropped, so it acts on the ``(batch, -1, dim)`` view."""
        return self.drop_path(branch.reshape(batch, -1, branch.shape[-1]), key, rate).reshape(branch.shape)


class Block(_ScaledResidualBlock):
    """Pre-norm self-attention block; ``attention='standard'`` (DeiT III) or ``'talking_heads'`` (CaiT).

    ``attention_impl`` picks how standard attention is computed (``layerscale_jax.arch.ATTENTION_IMPLEMENTATIONS``);
    talking-heads attention mixes the heads' logits before the softmax and always computes them explicitly."""

    def __init__(self, dim: int, num_heads: int, *, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 attention: str = "standard", attention_impl: str = "auto", branch_scaling: str = "layerscale",
                 init_value: float = 1e-5, drop_path: float = 0.0, norm_eps: float = 1e-6, dtype=jnp.float32,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.dtype = dtype
        norm = keeps_layernorm(branch_scaling)
        self.norm1 = layer_norm(dim, eps=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs) if norm else None
        if attention == "standard":
            self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias, attention_impl=attention_impl, dtype=dtype,
                                  param_dtype=param_dtype, rngs=rngs)
        elif attention == "talking_heads":
            self.attn = TalkingHeadsAttention(dim, num_heads, qkv_bias=qkv_bias, dtype=dtype, param_dtype=param_dtype,
                                              rngs=rngs)
        else:
            raise ConfigError(f"attention={attention!r} is not one of ('standard', 'talking_heads')")
        self.ls1 = make_branch_scale(branch_scaling, dim, init_value)
        self.norm2 = layer_norm(dim, eps=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs) if norm else None
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.ls2 = None if shares_scale_across_branches(branch_scaling) else make_branch_scale(
            branch_scaling, dim, init_value)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: jnp.ndarray, key: jax.Array | None = None, drop_path_rate=None):
        """``(x'', ratios)`` with ``ratios = [‖S1·Attn‖/‖x‖, ‖S2·MLP‖/‖x'‖]`` (float32, shape ``(2,)``).

        ``key`` (train mode) drives stochastic depth and, through ``lora.dropout_rng``, any LoRA adapter dropout."""
        with dropout_rng(key):
            return self._forward(x, key, drop_path_rate)

    def _forward(self, x, key, drop_path_rate):
        k1, k2 = self._keys(key)
        b, n, d = x.shape
        x = _stream(x.reshape(b * n, d))
        attn = self._scaled(self.attn, self.ls1, self._norm(self.norm1, x).reshape(b, n, d)).reshape(b * n, d)
        ratio1 = branch_to_stream_ratio(attn, x)
        x = _stream(x + self._drop(attn, b, k1, drop_path_rate))
        mlp = self._scaled(self.mlp, self._second_scale(), self._norm(self.norm2, x))
        ratio2 = branch_to_stream_ratio(mlp, x)
        x = _stream(x + self._drop(mlp, b, k2, drop_path_rate))
        return x.reshape(b, n, d), jnp.stack([ratio1, ratio2])

    def __call__(self, x: jnp.ndarray, key: jax.Array | None = None, drop_path_rate=None) -> jnp.ndarray:
        return self.forward(x, key, drop_path_rate)[0]


class ClassAttentionBlock(_ScaledResidualBlock):
    """CaiT's class-attention block: ``__call__(x_cls, x_patches)`` returns the updated class token."""

    def __init__(self, dim: int, num_heads: int, *, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 branch_scaling: str = "layerscale", init_value: float = 1e-5, drop_path: float = 0.0,
                 norm_eps: float = 1e-6, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.dtype = dtype
        norm = keeps_layernorm(branch_scaling)
        self.norm1 = layer_norm(dim, eps=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs) if norm else None
        self.attn = ClassAttention(dim, num_heads, qkv_bias=qkv_bias, dtype=dtype, param_dtype=param_dtype,
                                   rngs=rngs)
        self.ls1 = make_branch_scale(branch_scaling, dim, init_value)
        self.norm2 = layer_norm(dim, eps=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs) if norm else None
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.ls2 = None if shares_scale_across_branches(branch_scaling) else make_branch_scale(
            branch_scaling, dim, init_value)
        self.drop_path = DropPath(drop_path)

    def forward(self, x_cls: jnp.ndarray, x_patches: jnp.ndarray, key: jax.Array | None = None):
        """``(x_cls'', ratios)``: the updated class token and its two branch-to-stream ratios, as ``Block.forward``."""
        with dropout_rng(key):
            return self._forward(x_cls, x_patches, key)

    def _forward(self, x_cls, x_patches, key):
        k1, k2 = self._keys(key)
        tokens = jnp.concatenate([x_cls, x_patches], axis=1)
        attn = self._scaled(self.attn, self.ls1, self._norm(self.norm1, tokens))
        ratio1 = branch_to_stream_ratio(attn, x_cls)
        x_cls = x_cls + self.drop_path(attn, k1)
        mlp = self._scaled(self.mlp, self._second_scale(), self._norm(self.norm2, x_cls))
        ratio2 = branch_to_stream_ratio(mlp, x_cls)
        x_cls = x_cls + self.drop_path(mlp, k2)
        return x_cls, jnp.stack([ratio1, ratio2])

    def __call__(self, x_cls: jnp.ndarray, x_patches: jnp.ndarray, key: jax.Array | None = None) -> jnp.ndarray:
        return self.forward(x_cls, x_patches, key)[0]
