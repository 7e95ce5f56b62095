"""DeiT III-style Vision Transformer with LayerScale (Touvron et al., "DeiT III: Revenge of the ViT", 2022).

    z_0 = [x_cls, PatchEmbed(image) + E_pos]        (position embedding on patch tokens only, added before the
                                                      class token is concatenated, as DeiT III does)
    z_l = Block_l(z_{l-1}),  l = 1..depth            (pre-norm blocks with a scaled residual branch)
    y   = Head(LN(z_L)[:, 0])                        (``global_pool="token"``)
    y   = Head(LN_fc(mean(z_L[:, 1:])))              (``global_pool="avg"``: timm's ``fc_norm`` after pooling)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from layerscale_jax.arch import ViTConfig
from layerscale_jax.layers.blocks import Block
from layerscale_jax.layers.common import PatchEmbed, dense, layer_norm, trunc_normal_02
from layerscale_jax.layers.drop_path import drop_path_rates
from layerscale_jax.layers.params import param
from layerscale_jax.layers.partitioning import constrain
from layerscale_jax.layers.scaling import resolve_init_value
from layerscale_jax.models.base import DTYPES, class_tokens, compute_dtypes, embed_patches, one_line_repr
from layerscale_jax.models.stack import create_stack, run_stack

class VisionTransformer(nnx.Module):
    """DeiT III / ViT. ``model(images, key=None)``: NHWC float images (``patch_dims=1``: ``(batch, length,
    channels)`` signals) → float32 logits ``(batch, num_classes)``.

    ``key`` drives stochastic depth in train mode (``model.train()``); ``model.eval()`` makes it deterministic.
    """

    __repr__ = one_line_repr

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, (dt, pdt) = cfg.embed_dim, compute_dtypes(cfg)
        init_value = resolve_init_value(cfg.branch_scaling, cfg.init_values, cfg.depth)
        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, d, dims=cfg.patch_dims, dtype=dt, param_dtype=pdt,
                                      rngs=rngs)
        # timm: nn.init.normal_(cls_token, std=1e-6) (the official DeiT III code: trunc_normal 0.02)
        self.cls_token = param(nnx.initializers.normal(stddev=1e-6)(rngs.params(), (1, 1, d), pdt), "token",
                               (None, None, "embed"))
        self.pos_embed = param(trunc_normal_02(rngs.params(), (1, cfg.num_patches, d), pdt), "position",
                               (None, None, "embed"))

        def make_block(block_rngs):
            return Block(d, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, attention="standard",
                         attention_impl=cfg.attention_impl, branch_scaling=cfg.branch_scaling,
                         init_value=init_value, norm_eps=cfg.norm_eps,
                         dtype=dt, param_dtype=pdt, rngs=block_rngs)

        self.blocks = create_stack(make_block, cfg.depth, cfg.scan_layers, rngs)
        avg = cfg.global_pool == "avg"
        self.norm = None if avg else layer_norm(d, eps=cfg.norm_eps, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.fc_norm = layer_norm(d, eps=cfg.norm_eps, dtype=dt, param_dtype=pdt, rngs=rngs) if avg else None
        self.head = dense(d, cfg.num_classes, ("embed", "classes"), dtype=dt, param_dtype=pdt, rngs=rngs)
        self.drop_path_rates = tuple(float(r) for r in drop_path_rates(cfg.drop_path_rate, cfg.depth,
                                                                         cfg.drop_path_rule))
        self.deterministic = False

    def forward_features(self, images: jnp.ndarray, key: jax.Array | None = None) -> jnp.ndarray:
        """Tokens after the block stack, ``(batch, 1 + num_patches, dim)`` float32 (before the final norm)."""
        return self.forward_features_with_stats(images, key)[0]

    def forward_features_with_stats(self, images: jnp.ndarray, key: jax.Array | None = None):
        """``(tokens, {"blocks": (depth, 2)})``: ``forward_features`` and each block's branch-to-stream ratios."""
        cfg = self.cfg
        x = embed_patches(self, images)
        x = jnp.concatenate([class_tokens(self, x.shape[0]), x], axis=1)
        x, stats = run_stack(self.blocks, x, depth=cfg.depth, scan_layers=cfg.scan_layers, remat=cfg.remat,
                             key=None if self.deterministic else key, drop_path_rates=self.drop_path_rates,
                             return_stats=True)
        return x, {"blocks": stats}

    def forward_head(self, x: jnp.ndarray) -> jnp.ndarray:
        if self.cfg.global_pool == "avg":
            pooled = self.fc_norm(x[:, 1:].mean(axis=1).astype(DTYPES[self.cfg.dtype]))
        else:
            pooled = self.norm(x[:, 0].astype(DTYPES[self.cfg.dtype]))
        return self.head(constrain(pooled, ("batch", None))).astype(jnp.float32)

    def __call__(self, images: jnp.ndarray, key: jax.Array | None = None) -> jnp.ndarray:
        return self.forward_head(self.forward_features(images, key))
