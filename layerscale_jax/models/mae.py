"""Masked-autoencoder pre-training of a LayerScale ViT (He et al., "Masked Autoencoders Are Scalable Vision
Learners", 2021), with a DeiT III encoder.

Per image, a random subset of patches is kept (mask ratio ``m``, 0.75 by default), the encoder sees only those,
and a light decoder reconstructs the pixels of the others from the encoded visible tokens plus a shared mask token:

    noise ~ U(0, 1)^L ;  ids_shuffle = argsort(noise) ;  ids_restore = argsort(ids_shuffle)
    ids_keep = ids_shuffle[:⌊L (1 − m)⌋] ;  mask_j = 0 for kept patches, 1 for removed ones   (MAE random_masking)
    z   = Enc([x_cls, (PatchEmbed(image) + E_pos)[ids_keep]])        LayerScale blocks on the visible tokens only
    ẑ   = unshuffle([W_e z_patches, mask_token × (L − len_keep)], ids_restore) + E_dec ;  prepend W_e z_cls
    p̂   = W_pred · LN(Dec(ẑ))[1:]                                    one vector of patch² · channels per patch
    t_j = (patch_j − mean(patch_j)) / √(var(patch_j) + 1e-6)         (norm_pix_loss; var unbiased, as torch's)
    L   = Σ_j mask_j · mean((p̂_j − t_j)²) / Σ_j mask_j                 (masked patches only)

The encoder's parameters have the names and shapes of ``VisionTransformer``'s (``global_pool='token'``) without
the head, so ``train.init_from`` of an MAE run loads them into a classifier (the decoder is dropped; a new head,
and with ``global_pool='avg'`` a new ``fc_norm``, are initialised). The decoder is MAE's: pre-norm blocks without
branch scaling, ``decoder_embed_dim`` wide (512 for ViT-B/L/H), ``decoder_depth`` deep (8), with its own 2-D sin-cos
position embedding. Both position embeddings start as MAE's fixed 2-D sin-cos tables; MAE keeps them fixed, which the
configs do with ``optim.freeze``. Linear layers are initialised as the rest of this package (timm's
trunc_normal(0.02)), not with MAE's xavier_uniform; the mask token is N(0, 0.02²) as in MAE.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layerscale_jax.arch import MAEConfig, num_kept
from layerscale_jax.errors import ConfigError
from layerscale_jax.layers.blocks import Block
from layerscale_jax.layers.common import PatchEmbed, dense, layer_norm
from layerscale_jax.layers.drop_path import drop_path_rates
from layerscale_jax.layers.params import param
from layerscale_jax.layers.scaling import resolve_init_value
from layerscale_jax.models.base import DTYPES, class_tokens, compute_dtypes, embed_patches, one_line_repr
from layerscale_jax.models.stack import create_stack, run_stack


def sincos_pos_embed_2d(dim: int, grid: int, cls_token: bool = False) -> np.ndarray:
    """MAE's fixed ``get_2d_sincos_pos_embed``, ``(grid², dim)`` in row-major patch order (a zero row first with
    ``cls_token``). Each half of the channels is a 1-D table ``[sin(p ω_k), cos(p ω_k)]``, ``ω_k = 10000^(−k/(d/4))``,
    ``k < d/4``: the first half for the patch's column ``p`` (MAE's ``grid[0]`` of ``meshgrid(w, h)``), the second
    for its row."""
    if dim % 4:
        raise ConfigError(f"a 2-D sin-cos position embedding needs a width divisible by 4, got {dim}")

    def one_d(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    w, h = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64))
    emb = np.concatenate([one_d(dim // 2, w), one_d(dim // 2, h)], axis=1)
    if cls_token:
        emb = np.concatenate([np.zeros((1, dim)), emb], axis=0)
    return emb.astype(np.float32)


def random_masking(key: jax.Array, batch: int, num_patches: int, mask_ratio: float):
    """MAE's per-sample random masking: ``(ids_keep (B, len_keep), mask (B, L), ids_restore (B, L))``.

    ``mask`` is 1 for removed patches and 0 for kept ones, in the original patch order; ``ids_restore`` undoes the
    shuffle (``take_along_axis(shuffled, ids_restore)`` is the original order).
    """
    len_keep = num_kept(num_patches, mask_ratio)
    noise = jax.random.uniform(key, (batch, num_patches))
    ids_shuffle = jnp.argsort(noise, axis=1)
    ids_restore = jnp.argsort(ids_shuffle, axis=1)
    ids_keep = ids_shuffle[:, :len_keep]
    mask = jnp.concatenate([jnp.zeros((batch, len_keep)), jnp.ones((batch, num_patches - len_keep))], axis=1)
    mask = jnp.take_along_axis(mask, ids_restore, axis=1)
    return ids_keep, mask, ids_restore


def patchify(images: jnp.ndarray, patch: int) -> jnp.ndarray:
    """NHWC images → ``(B, L, patch² · C)`` in PatchEmbed's row-major patch order, pixels ``(p, q, c)``."""
    b, h, w, c = images.shape
    x = images.reshape(b, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // patch) * (w // patch), patch * patch * c)


def unpatchify(patches: jnp.ndarray, patch: int, channels: int) -> jnp.ndarray:
    """Inverse of ``patchify`` (square images)."""
    b, n, _ = patches.shape
    side = int(round(n ** 0.5))
    x = patches.reshape(b, side, side, patch, patch, channels).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, side * patch, side * patch, channels)


def pixel_targets(images: jnp.ndarray, patch: int, norm_pix_loss: bool):
    """``(targets, mean, std)``: patches, normalised per patch with ``norm_pix_loss`` (mean 0, std 1 otherwise)."""
    target = patchify(images.astype(jnp.float32), patch)
    if not norm_pix_loss:
        return target, jnp.zeros_like(target[..., :1]), jnp.ones_like(target[..., :1])
    mean = target.mean(axis=-1, keepdims=True)
    var = target.var(axis=-1, keepdims=True, ddof=1)              # torch's Tensor.var: unbiased
    std = jnp.sqrt(var + 1e-6)
    return (target - mean) / std, mean, std


def masked_patch_loss(pred: jnp.ndarray, target: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Per-image loss ``Σ_j mask_j mean_k (p̂_jk − t_jk)² / Σ_j mask_j`` ``(B,)``: removed patches only."""
    per_patch = jnp.mean(jnp.square(pred.astype(jnp.float32) - target), axis=-1)
    return jnp.sum(per_patch * mask, axis=1) / jnp.sum(mask, axis=1)


class MaskedAutoencoder(nnx.Module):
    """MAE with a DeiT III encoder. ``model.loss(images, key)`` → per-image reconstruction loss ``(B,)``;
    ``model.reconstruct(images, key)`` → the masked input and the reconstruction, as NHWC images."""

    __repr__ = one_line_repr

    def __init__(self, cfg: MAEConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        (d, dd), (dt, pdt) = (cfg.embed_dim, cfg.decoder_embed_dim), compute_dtypes(cfg)
        init_value = resolve_init_value(cfg.branch_scaling, cfg.init_values, cfg.depth)
        # encoder: VisionTransformer's parameters (names and shapes) without the head
        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, d, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.cls_token = param(nnx.initializers.normal(stddev=1e-6)(rngs.params(), (1, 1, d), pdt), "token",
                               (None, None, "embed"))
        self.pos_embed = param(jnp.asarray(sincos_pos_embed_2d(d, cfg.grid_size)[None], pdt), "position",
                               (None, None, "embed"))

        def make_block(block_rngs):
            return Block(d, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, attention="standard",
                         attention_impl=cfg.attention_impl, branch_scaling=cfg.branch_scaling,
                         init_value=init_value, norm_eps=cfg.norm_eps,
                         dtype=dt, param_dtype=pdt, rngs=block_rngs)

        self.blocks = create_stack(make_block, cfg.depth, cfg.scan_layers, rngs)
        self.norm = layer_norm(d, eps=cfg.norm_eps, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.drop_path_rates = tuple(float(r) for r in drop_path_rates(cfg.drop_path_rate, cfg.depth,
                                                                         cfg.drop_path_rule))
        # decoder (MAE: plain pre-norm blocks); its stem, tokens, final norm and prediction stay replicated
        self.decoder_embed = dense(d, dd, (None, None), dtype=dt, param_dtype=pdt, rngs=rngs)
        self.mask_token = param(nnx.initializers.normal(stddev=0.02)(rngs.params(), (1, 1, dd), pdt), "token",
                                (None, None, None))
        self.decoder_pos_embed = param(jnp.asarray(sincos_pos_embed_2d(dd, cfg.grid_size, True)[None], pdt),
                                       "position", (None, None, None))
        self.decoder_blocks = nnx.List([
            Block(dd, cfg.decoder_num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=True, attention="standard",
                  attention_impl=cfg.attention_impl, branch_scaling="none", norm_eps=cfg.norm_eps, dtype=dt,
                  param_dtype=pdt, rngs=rngs)
            for _ in range(cfg.decoder_depth)])
        self.decoder_norm = layer_norm(dd, eps=cfg.norm_eps, axis=None, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.decoder_pred = dense(dd, cfg.patch_dim, (None, None), dtype=dt, param_dtype=pdt, rngs=rngs)
        self.deterministic = False

    def forward_encoder(self, images: jnp.ndarray, ids_keep: jnp.ndarray, key: jax.Array | None = None):
        """The encoded ``[cls, visible patches]`` ``(B, 1 + len_keep, dim)`` float32, after the final norm."""
        cfg = self.cfg
        x = embed_patches(self, images)
        x = jnp.take_along_axis(x, ids_keep[:, :, None], axis=1)
        x = jnp.concatenate([class_tokens(self, x.shape[0]), x], axis=1)
        x = run_stack(self.blocks, x, depth=cfg.depth, scan_layers=cfg.scan_layers, remat=cfg.remat,
                      key=None if self.deterministic else key, drop_path_rates=self.drop_path_rates)
        return self.norm(x.astype(DTYPES[cfg.dtype])).astype(jnp.float32)

    def forward_decoder(self, latent: jnp.ndarray, ids_restore: jnp.ndarray) -> jnp.ndarray:
        """Predicted pixels of every patch ``(B, L, patch² · C)`` float32 from the encoded visible tokens."""
        cfg = self.cfg
        x = self.decoder_embed(latent.astype(DTYPES[cfg.dtype])).astype(jnp.float32)
        b, n_vis, dd = x.shape
        masks = jnp.broadcast_to(self.mask_token[...].astype(jnp.float32), (b, cfg.num_patches + 1 - n_vis, dd))
        patches = jnp.concatenate([x[:, 1:], masks], axis=1)
        patches = jnp.take_along_axis(patches, ids_restore[:, :, None], axis=1)
        x = jnp.concatenate([x[:, :1], patches], axis=1) + self.decoder_pos_embed[...].astype(jnp.float32)
        for block in self.decoder_blocks:
            x = block(x)
        x = self.decoder_norm(x.astype(DTYPES[cfg.dtype]))
        return self.decoder_pred(x).astype(jnp.float32)[:, 1:]

    def predict(self, images: jnp.ndarray, key: jax.Array):
        """``(pred, mask)``: predicted patches and MAE's mask (1 = removed) from masking key ``fold_in(key, 0)``;
        stochastic depth (train mode) uses ``fold_in(key, 1)``."""
        cfg = self.cfg
        ids_keep, mask, ids_restore = random_masking(jax.random.fold_in(key, 0), images.shape[0], cfg.num_patches,
                                                     cfg.mask_ratio)
        latent = self.forward_encoder(images, ids_keep, jax.random.fold_in(key, 1))
        return self.forward_decoder(latent, ids_restore), mask

    def loss(self, images: jnp.ndarray, key: jax.Array) -> jnp.ndarray:
        """Per-image reconstruction loss ``(B,)`` on the masked patches (see the module docstring)."""
        pred, mask = self.predict(images, key)
        target, _, _ = pixel_targets(images, self.cfg.patch_size, self.cfg.norm_pix_loss)
        return masked_patch_loss(pred, target, mask)

    def reconstruct(self, images: jnp.ndarray, key: jax.Array):
        """``(masked, reconstruction, pasted)`` NHWC images: the input with removed patches zeroed, the decoder's
        prediction (de-normalised with each patch's own mean and std under ``norm_pix_loss``, as MAE's
        visualisation), and the prediction with the visible patches pasted back."""
        cfg = self.cfg
        pred, mask = self.predict(images, key)
        target, mean, std = pixel_targets(images, cfg.patch_size, cfg.norm_pix_loss)
        pixels = patchify(images.astype(jnp.float32), cfg.patch_size)
        recon = pred * std + mean
        keep = (1.0 - mask)[:, :, None]
        to_image = lambda p: unpatchify(p, cfg.patch_size, cfg.in_chans)      # noqa: E731
        return to_image(pixels * keep), to_image(recon), to_image(pixels * keep + recon * (1.0 - keep))

    def __call__(self, images: jnp.ndarray, key: jax.Array) -> jnp.ndarray:
        return self.loss(images, key)
