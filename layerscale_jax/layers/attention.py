"""Attention layers: multi-head self-attention, CaiT's talking-heads attention and class attention.

Shapes: tokens ``x`` are ``(batch, tokens, dim)``; heads split ``dim = num_heads · head_dim``.
Self-attention:  ``Attn(x) = W_o · concat_h softmax(q_h k_hᵀ / √d_h) v_h``, with ``q, k, v = W_qkv x`` fused.

The fused ``qkv`` kernel ``(dim, 3·dim)`` is laid out heads-major: output column ``(h·3 + j)·d_h + i`` is
component ``i`` of head ``h``'s query (``j = 0``), key (1) or value (2). A contiguous split of its columns over the
mesh's ``tensor`` axis therefore gives every device whole heads with their q, k and v (Megatron's column split), and
the attention runs where they live. timm orders the columns ``[q | k | v]``; ``layerscale_jax.convert`` permutes at
the boundary (``qkv_heads_major`` / ``qkv_timm_order``), so names and parity with timm are unchanged.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from layerscale_jax.arch import validate_attention_impl
from layerscale_jax.layers.common import dense, linear
from layerscale_jax.layers.partitioning import constrain, target_platform

# How ``Attention`` computes softmax(q kᵀ / √d_h) v (the same function every way; only the speed differs), the
# model field ``attention_impl``:
#   einsum  heads-major (b, h, n, d) einsums: one transpose of the fused qkv, no per-head relayouts
#           (the fastest on the XLA CPU backend: benchmarks/README.md has the numbers).
#   xla     ``jax.nn.dot_product_attention`` with XLA's implementation (token-major (b, n, h, d)).
#   cudnn   ``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN's fused flash attention (GPU,
#           bfloat16/float16), the tokens padded to an even count with the padded keys masked (``padded_attention``).
#   auto    einsum on CPU; on a GPU cudnn where cuDNN takes the shapes (``cudnn_supports``), else xla; xla on TPU.
# ``auto`` is resolved for the platform the step is traced for (``partitioning.target_platform``: the mesh's
# devices, so a step cross-compiled for a GPU target on a CPU machine resolves it as on the GPU). The names are
# ``ATTENTION_IMPLEMENTATIONS`` (``layerscale_jax.arch``, where the model configs check them).

# cuDNN's fused attention trains only even sequence lengths in jax 0.11-0.12: ``check_is_flash_attention`` in
# jax/_src/cudnn/fused_attention_stablehlo.py refuses an odd Q or KV length "with a bias" when training, and the
# training rule passes a placeholder bias even when there is none (``NotImplementedError: Unsupported sequence
# length Q 197, KV 197`` on an H200, benchmarks/results/gpu_h200_2026-12-04/b16_cudnn.log).
CUDNN_TOKEN_MULTIPLE = 2
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def cudnn_supports(dtype, head_dim: int) -> bool:
    """Whether cuDNN's fused attention takes heads of ``head_dim`` in ``dtype``: bfloat16/float16 and a head
    dimension that is a multiple of 8, at most 128 (256 on Hopper; 128 is what every cuDNN GPU takes)."""
    return jnp.dtype(dtype) in tuple(map(jnp.dtype, CUDNN_DTYPES)) and head_dim % 8 == 0 and head_dim <= 128


def resolve_attention_impl(name: str, platform: str, dtype, head_dim: int) -> str:
    """The implementation ``name`` stands for on ``platform`` (``cpu``, ``gpu``/``cuda``/``rocm``, ``tpu``)."""
    validate_attention_impl(name)
    if name != "auto":
        return name
    if platform == "cpu":
        return "einsum"
    if platform in ("gpu", "cuda") and cudnn_supports(dtype, head_dim):
        return "cudnn"
    return "xla"


def padded_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, multiple: int,
                     implementation: str | None = None) -> jnp.ndarray:
    """``jax.nn.dot_product_attention`` of ``(b, n, h, d)`` q, k, v over ``n`` rounded up to ``multiple`` tokens.

    The padded keys are masked (``key_value_seq_lengths = n``, cuDNN's padding mask), so every real query attends
    to exactly the real keys: softmax over ``n`` keys as without padding. The padded queries attend to real keys
    too (finite rows, no all-masked softmax) and their rows are sliced off, so they get no gradient.
    """
    b, n = q.shape[:2]
    pad = -n % multiple
    if pad == 0:
        return jax.nn.dot_product_attention(q, k, v, implementation=implementation)
    widths = ((0, 0), (0, pad), (0, 0), (0, 0))
    q, k, v = (jnp.pad(t, widths) for t in (q, k, v))
    lengths = jnp.full((b,), n, jnp.int32)
    out = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation=implementation)
    return out[:, :n]


def fused_qkv_attention(qkv: jnp.ndarray, impl: str) -> jnp.ndarray:
    """``softmax(q kᵀ / √d_h) v`` per head from the fused projection ``qkv`` ``(b, n, h, 3, d_h)`` → ``(b, n, h, d_h)``,
    computed by ``impl`` (a resolved name: ``einsum``, ``xla`` or ``cudnn``).

    q, k and v are separated with ``jnp.split``, whose gradient is one concatenate (indexing would pad each).
    Logits and softmax are float32 whatever the compute dtype (cuDNN's kernel accumulates in float32 too).
    """
    if impl == "einsum":
        q, k, v = (t[0] for t in jnp.split(qkv.transpose(3, 0, 2, 1, 4), 3, axis=0))   # each (b, h, n, d_h)
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
        weights = jax.nn.softmax(logits * q.shape[-1] ** -0.5, axis=-1).astype(v.dtype)
        return jnp.einsum("bhqk,bhkd->bhqd", weights, v).transpose(0, 2, 1, 3)
    q, k, v = (t[:, :, :, 0] for t in jnp.split(qkv, 3, axis=3))
    if impl == "cudnn":
        return padded_attention(q, k, v, CUDNN_TOKEN_MULTIPLE, implementation="cudnn")
    return jax.nn.dot_product_attention(q, k, v)


def _split_heads(x: jnp.ndarray, num_heads: int) -> jnp.ndarray:
    b, n, d = x.shape
    return x.reshape(b, n, num_heads, d // num_heads)


def project_qkv(layer: nnx.Linear, x: jnp.ndarray, num_heads: int) -> jnp.ndarray:
    """The fused projection of ``x`` ``(b, n, dim)`` as ``(b, n, heads, 3, d_h)``, laid out by heads."""
    b, n, d = x.shape
    qkv = constrain(layer(x.reshape(b * n, d)), ("batch", "heads"))
    return qkv.reshape(b, n, num_heads, 3, d // num_heads)


def project_out(layer: nnx.Linear, heads: jnp.ndarray, out_scale) -> jnp.ndarray:
    """``W_o · concat_h heads_h`` from ``(b, n, heads, d_h)``; on a tensor mesh a partial sum over the local heads
    (the all-reduce follows where the block adds it to the replicated stream)."""
    b, n, h, dh = heads.shape
    concat = constrain(heads.reshape(b * n, h * dh), ("batch", "heads"))
    return linear(layer, concat, out_scale).reshape(b, n, h * dh)


class Attention(nnx.Module):
    """Standard multi-head self-attention with a fused qkv projection (ViT / DeiT III).

    The product goes through ``fused_qkv_attention`` by ``attention_impl`` (``ATTENTION_IMPLEMENTATIONS``;
    ``auto``: heads-major einsums on CPU, cuDNN's fused attention on a GPU, XLA's on TPU).
    """

    def __init__(self, dim: int, num_heads: int, *, qkv_bias: bool = True, attention_impl: str = "auto",
                 dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
        validate_attention_impl(attention_impl)
        self.num_heads = num_heads
        self.attention_impl = attention_impl
        self.qkv = dense(dim, 3 * dim, ("embed", "heads"), use_bias=qkv_bias,
                         dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.proj = dense(dim, dim, ("heads", "embed"), dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jnp.ndarray, out_scale: jnp.ndarray | None = None) -> jnp.ndarray:
        qkv = project_qkv(self.qkv, x, self.num_heads)
        impl = resolve_attention_impl(self.attention_impl, target_platform(), qkv.dtype, qkv.shape[-1])
        return project_out(self.proj, fused_qkv_attention(qkv, impl), out_scale)


def _dense_float32(layer: nnx.Linear, x: jnp.ndarray) -> jnp.ndarray:
    """``x W + b`` with ``x``, the kernel and the bias in float32 (whatever the layer's compute dtype)."""
    y = jnp.matmul(x.astype(jnp.float32), layer.kernel[...].astype(jnp.float32), precision=layer.precision)
    return y + layer.bias[...].astype(jnp.float32) if layer.bias is not None else y


class TalkingHeadsAttention(nnx.Module):
    """Talking-heads attention (Shazeer et al. 2020, used in CaiT's self-attention stage).

    Learned linear maps mix the attention logits across heads before the softmax (``proj_l``) and the attention
    weights across heads after it (``proj_w``):

        A = softmax(P_l · (q kᵀ / √d_h)) ;  A' = P_w · A ;  out = W_o · concat_h A'_h v_h

    The logits, both head mixings and the softmax are computed in float32 whatever the compute dtype (as
    ``fused_qkv_attention`` keeps standard attention's logits): in bfloat16 the mixing would round logits whose
    differences the softmax exponentiates. Only the product with ``v`` runs in the compute dtype.
    """

    def __init__(self, dim: int, num_heads: int, *, qkv_bias: bool = True, dtype=jnp.float32,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = dense(dim, 3 * dim, ("embed", "heads"), use_bias=qkv_bias,
                         dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.proj_l = dense(num_heads, num_heads, (None, None), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.proj_w = dense(num_heads, num_heads, (None, None), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.proj = dense(dim, dim, ("heads", "embed"), dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jnp.ndarray, out_scale: jnp.ndarray | None = None) -> jnp.ndarray:
        qkv = project_qkv(self.qkv, x, self.num_heads)
        q, k, v = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]
        # heads last, so each mixing is a (heads × heads) Dense applied in float32
        logits = jnp.einsum("bqhd,bkhd->bqkh", q * self.scale, k, preferred_element_type=jnp.float32)
        weights = jax.nn.softmax(_dense_float32(self.proj_l, logits), axis=2)
        weights = _dense_float32(self.proj_w, weights).astype(v.dtype)
        return project_out(self.proj, jnp.einsum("bqkh,bkhd->bqhd", weights, v), out_scale)


class ClassAttention(nnx.Module):
    """Class attention (CaiT): only the class token queries; keys and values come from all tokens.

        q = W_q x_cls ;  k = W_k [x_cls, x_patches] ;  v = W_v [x_cls, x_patches]
        x_cls' = W_o · softmax(q kᵀ / √d_h) v

    ``x`` is ``[x_cls, x_patches]``; the output is the updated class token ``(batch, 1, dim)``.
    """

    def __init__(self, dim: int, num_heads: int, *, qkv_bias: bool = True, dtype=jnp.float32,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.num_heads = num_heads
        self.q = dense(dim, dim, ("embed", "heads"), use_bias=qkv_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.k = dense(dim, dim, ("embed", "heads"), use_bias=qkv_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.v = dense(dim, dim, ("embed", "heads"), use_bias=qkv_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.proj = dense(dim, dim, ("heads", "embed"), dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jnp.ndarray, out_scale: jnp.ndarray | None = None) -> jnp.ndarray:
        q, k, v = (_split_heads(constrain(layer(t), ("batch", None, "heads")), self.num_heads)
                   for layer, t in ((self.q, x[:, :1]), (self.k, x), (self.v, x)))
        return project_out(self.proj, jax.nn.dot_product_attention(q, k, v), out_scale)
