"""Small shared pieces: initialisers, Dense/LayerNorm/MLP constructors, exact GELU and the patch embedding.

Initialisation follows timm (``VisionTransformer.init_weights`` / ``init_weights_vit_timm``, CaiT's
``_init_weights``) for every parameter of a model trained from scratch:

    Linear kernel      timm ``trunc_normal_(std=0.02)``: N(0, 0.02²) truncated at ±2 *absolute* (±100σ, so in effect
                       an untruncated normal of std 0.02; ``timm_trunc_normal``). Bias 0.
    LayerNorm          scale 1, bias 0 (PyTorch's default).
    patch embedding    PyTorch's ``Conv2d`` default, which timm and the official DeiT III / CaiT code leave alone:
                       ``kaiming_uniform_(a=√5)`` = U(−1/√fan_in, 1/√fan_in) for the kernel and the same uniform for
                       the bias, ``fan_in = patch² · in_chans`` (std 0.0208 for 16×16×3; ``torch_conv_uniform``).
    pos_embed          trunc_normal(0.02).
    cls_token          DeiT III / ViT: N(0, 1e-6²) (timm's ``nn.init.normal_(cls_token, std=1e-6)``; the official
                       DeiT III code uses trunc_normal(0.02)); CaiT: trunc_normal(0.02).
    LayerScale λ       ε; scalar gates α: ε or 0 (``layers.scaling``).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from layerscale_jax.layers.params import metadata
from layerscale_jax.layers.partitioning import constrain


def timm_trunc_normal(std: float, a: float = -2.0, b: float = 2.0):
    """timm's ``trunc_normal_(tensor, std=std, a=a, b=b)``: N(0, std²) truncated at the *absolute* bounds ``[a, b]``.

    flax's ``truncated_normal(stddev)`` truncates at ±2σ instead (its std is 0.88·stddev); here the bounds are
    ``a/std`` and ``b/std`` standard deviations, as in timm, but at most ±6σ. Both samplers invert the normal CDF
    of a float32 uniform, whose lowest value (probability 2⁻²³ per entry) maps to −∞ and is clipped to the bound:
    timm's bound −2 is −100σ at std 0.02, a weight of −2.0 in about one of every 100 models of DeiT-S size (seen
    here in a 384×1000 head); at −6σ the same clipped entry is harmless. The float32 sampler cannot produce values
    between about 5.3σ and the bound anyway, so the distribution is otherwise identical.
    """
    return nnx.initializers.truncated_normal(stddev=std, lower=max(a / std, -6.0), upper=min(b / std, 6.0))


def torch_conv_uniform(fan_in: int):
    """PyTorch's default ``Conv2d`` / ``Linear`` initialisation of weight and bias: U(−1/√fan_in, 1/√fan_in).

    (``kaiming_uniform_(a=√5)``: bound = gain·√(3/fan_in) with gain = √(2/(1+5)), i.e. 1/√fan_in.)
    """
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


trunc_normal_02 = timm_trunc_normal(0.02)


def dense(din: int, dout: int, axes: tuple, *, use_bias: bool = True, dtype=jnp.float32, param_dtype=jnp.float32,
          rngs: nnx.Rngs) -> nnx.Linear:
    """A Dense layer initialised as timm's ViTs are: truncated normal (std 0.02) kernel, zero bias. ``axes``: the
    logical axes ``(input, output)`` of its kernel (``layers.params``); the bias takes the output's."""
    return nnx.Linear(din, dout, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                      kernel_init=trunc_normal_02, bias_init=nnx.initializers.zeros_init(), rngs=rngs,
                      kernel_metadata=metadata("weight", axes), bias_metadata=metadata("bias", axes[-1:]))


def linear(layer: nnx.Linear, x: jnp.ndarray, out_scale: jnp.ndarray | None = None) -> jnp.ndarray:
    """``layer(x)``, or ``s ⊙ layer(x)`` for a float32 branch scale ``s`` (LayerScale's λ or a scalar α) folded in:

        s ⊙ (x W + b) = x (W diag s) + s ⊙ b

    The same function. Folded, the scale meets only the layer's parameters: ``∂L/∂s_j = Σ_i W_ij ∂L/∂W'_ij +
    b_j ∂L/∂b'_j`` comes from the small weight gradient, and the backward pass needs no ``s ⊙ ∂L/∂y`` over every
    token, no reduction over tokens and no stored unscaled branch output. ``W diag s`` is formed in float32 and
    then cast to the compute dtype like any kernel, so the matmul keeps its precision relative to its output.
    A LoRA layer (``layers.lora.LoRALinear``) adds its update folded the same way, ``(α/r) x A (B diag s)``.
    """
    if out_scale is None:
        return layer(x)
    dtype = layer.dtype if layer.dtype is not None else x.dtype
    kernel = (layer.kernel[...].astype(jnp.float32) * out_scale).astype(dtype)
    y = jnp.matmul(x.astype(dtype), kernel, precision=layer.precision)
    if layer.bias is not None:
        y = y + (layer.bias[...].astype(jnp.float32) * out_scale).astype(dtype)
    adapter = getattr(layer, "adapter_delta", None)      # a LoRA adapter folds the same way: (α/r) x A (B diag s)
    if adapter is not None:
        y = y + adapter(x, out_scale).astype(y.dtype)
    return y


def layer_norm(dim: int, *, eps: float, axis: str | None = "embed", dtype=jnp.float32, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    """LayerNorm whose statistics are computed in float32 and whose output has the compute dtype; its scale and
    bias have the logical axis ``axis``."""
    return nnx.LayerNorm(dim, epsilon=eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                         scale_metadata=metadata("norm", (axis,)), bias_metadata=metadata("bias", (axis,)))


def _normal_cdf(a: jnp.ndarray) -> jnp.ndarray:
    """``Φ(a) = (1 + erf(a / √2)) / 2``."""
    return 0.5 * (1.0 + jax.lax.erf(a * (1.0 / math.sqrt(2.0))))


@jax.custom_vjp
def gelu(a: jnp.ndarray) -> jnp.ndarray:
    """Exact GELU (Hendrycks & Gimpel 2016), PyTorch's default: ``GELU(a) = a · Φ(a)``, computed in float32.

    ``Φ`` is ``(1 + erf(a/√2)) / 2`` as in PyTorch's kernel (``erfc(-a/√2) / 2`` would keep relative precision in
    the far negative tail, where the absolute error of both is below 5e-7, but XLA's erfc is a costlier
    piecewise polynomial).

    Its derivative is ``Φ(a) + a · φ(a)`` with ``φ(a) = exp(-a²/2) / √(2π)``. The backward pass is written out so
    that erf is evaluated once in each pass and each pass is one loop over the activation (XLA's own derivative of
    ``jax.nn.gelu`` evaluates erfc in several fusions: on the CPU that cost more than the MLP's bias, LayerNorm and
    residual work together).
    """
    a32 = a.astype(jnp.float32)
    return (a32 * _normal_cdf(a32)).astype(a.dtype)


def _gelu_fwd(a):
    return gelu(a), a


def _gelu_bwd(a, g):
    # The barrier stops XLA from sharing erf(a) with the forward pass: sharing it would write erf(a) to memory and
    # read it back, a full extra pass over the MLP's widest activation, which costs more than evaluating erf again.
    a32 = jax.lax.optimization_barrier(a).astype(jnp.float32)
    slope = _normal_cdf(a32) + a32 * jnp.exp(-0.5 * a32 * a32) * (1.0 / math.sqrt(2.0 * math.pi))
    return ((g.astype(jnp.float32) * slope).astype(a.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


class Mlp(nnx.Module):
    """The transformer FFN: ``FFN(x) = W_2 · GELU(W_1 x + b_1) + b_2`` (exact erf GELU, as PyTorch's default)."""

    def __init__(self, dim: int, hidden: int, *, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.fc1 = dense(dim, hidden, ("embed", "mlp"), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.fc2 = dense(hidden, dim, ("mlp", "embed"), dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jnp.ndarray, out_scale: jnp.ndarray | None = None) -> jnp.ndarray:
        """``FFN(x)``, or ``out_scale ⊙ FFN(x)`` with the scale folded into ``fc2`` (see ``linear``)."""
        return linear(self.fc2, constrain(gelu(self.fc1(x)), ("batch",) + (None,) * (x.ndim - 2) + ("mlp",)), out_scale)


class PatchEmbed(nnx.Module):
    """Non-overlapping ``patch × patch`` patches projected to ``dim``: a strided convolution on NHWC images
    (``dims=1``: patches of ``patch`` samples of ``(batch, length, channels)`` signals, a strided 1-D convolution).

    Output: ``(batch, (H/patch)·(W/patch), dim)`` in row-major patch order, as timm's ``PatchEmbed``
    (``(batch, length/patch, dim)`` for signals). Initialised as PyTorch's ``Conv2d`` (``torch_conv_uniform``), which
    timm and DeiT III keep (``Conv1d``'s rule, the same fan-in, for signals).
    """

    def __init__(self, patch_size: int, in_chans: int, dim: int, *, dims: int = 2, dtype=jnp.float32,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        window = (patch_size,) * dims
        init = torch_conv_uniform(patch_size ** dims * in_chans)
        self.proj = nnx.Conv(in_chans, dim, kernel_size=window, strides=window, padding="VALID", dtype=dtype,
                             param_dtype=param_dtype, kernel_init=init, bias_init=init, rngs=rngs,
                             kernel_metadata=metadata("weight", (None,) * (dims + 1) + ("embed",)),
                             bias_metadata=metadata("bias", ("embed",)))

    def __call__(self, images: jnp.ndarray) -> jnp.ndarray:
        x = self.proj(images)
        return x.reshape(x.shape[0], -1, x.shape[-1])
