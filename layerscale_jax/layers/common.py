"""Small shared pieces: initialisers, Dense/LayerNorm/MLP constructors and the patch embedding."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

trunc_normal_02 = nnx.initializers.truncated_normal(stddev=0.02)


def dense(din: int, dout: int, *, use_bias: bool = True, dtype=jnp.float32, param_dtype=jnp.float32,
          rngs: nnx.Rngs) -> nnx.Linear:
    """A Dense layer initialised as timm's ViTs are: truncated normal (std 0.02) kernel, zero bias."""
    return nnx.Linear(din, dout, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                      kernel_init=trunc_normal_02, bias_init=nnx.initializers.zeros_init(), rngs=rngs)


def layer_norm(dim: int, *, eps: float, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    """LayerNorm whose statistics are computed in float32 and whose output has the compute dtype."""
    return nnx.LayerNorm(dim, epsilon=eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


class Mlp(nnx.Module):
    """The transformer FFN: ``FFN(x) = W_2 · GELU(W_1 x + b_1) + b_2`` (exact erf GELU, as PyTorch's default)."""

    def __init__(self, dim: int, hidden: int, *, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.fc1 = dense(dim, hidden, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.fc2 = dense(hidden, dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class PatchEmbed(nnx.Module):
    """Non-overlapping ``patch × patch`` patches projected to ``dim``: a strided convolution on NHWC images.

    Output: ``(batch, (H/patch)·(W/patch), dim)`` in row-major patch order, as timm's ``PatchEmbed``.
    """

    def __init__(self, patch_size: int, in_chans: int, dim: int, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        self.proj = nnx.Conv(in_chans, dim, kernel_size=(patch_size, patch_size),
                             strides=(patch_size, patch_size), padding="VALID", dtype=dtype,
                             param_dtype=param_dtype, rngs=rngs)

    def __call__(self, images: jnp.ndarray) -> jnp.ndarray:
        x = self.proj(images)
        b, h, w, d = x.shape
        return x.reshape(b, h * w, d)
