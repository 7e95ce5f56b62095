"""CaiT: Class-attention in image Transformers (Touvron et al., "Going deeper with Image Transformers", 2021).

    z_0 = PatchEmbed(image) + E_pos                              (no class token in the first stage)
    z_l = Block_l(z_{l-1}),  l = 1..depth                        (talking-heads SA blocks with LayerScale)
    c_0 = x_cls ;  c_j = CABlock_j(c_{j-1}, z_depth), j = 1, 2   (class attention: only the class token is updated)
    y   = Head(LN([c_2, z_depth])[:, 0])

The official code uses a constant stochastic-depth rate in the first stage and none in the class-attention blocks.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from layerscale_jax.arch import CaiTConfig
from layerscale_jax.layers.blocks import Block, ClassAttentionBlock
from layerscale_jax.layers.common import PatchEmbed, dense, layer_norm, trunc_normal_02
from layerscale_jax.layers.drop_path import drop_path_rates
from layerscale_jax.layers.params import param
from layerscale_jax.layers.partitioning import constrain
from layerscale_jax.layers.scaling import resolve_init_value
from layerscale_jax.models.base import DTYPES, class_tokens, compute_dtypes, embed_patches, one_line_repr
from layerscale_jax.models.stack import create_stack, run_stack


class CaiT(nnx.Module):
    """CaiT. ``model(images, key=None)``: NHWC float images → float32 logits ``(batch, num_classes)``."""

    __repr__ = one_line_repr

    def __init__(self, cfg: CaiTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, (dt, pdt) = cfg.embed_dim, compute_dtypes(cfg)
        init_value = resolve_init_value(cfg.branch_scaling, cfg.init_values, cfg.depth)
        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, d, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.cls_token = param(trunc_normal_02(rngs.params(), (1, 1, d), pdt), "token", (None, None, "embed"))
        self.pos_embed = param(trunc_normal_02(rngs.params(), (1, cfg.num_patches, d), pdt), "position",
                               (None, None, "embed"))

        def make_block(block_rngs):
            return Block(d, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                         attention="talking_heads", branch_scaling=cfg.branch_scaling, init_value=init_value,
                         norm_eps=cfg.norm_eps, dtype=dt, param_dtype=pdt, rngs=block_rngs)

        self.blocks = create_stack(make_block, cfg.depth, cfg.scan_layers, rngs)
        self.blocks_token_only = nnx.List([
            ClassAttentionBlock(d, cfg.num_heads, mlp_ratio=cfg.mlp_ratio_token_only, qkv_bias=cfg.qkv_bias,
                                branch_scaling=cfg.branch_scaling, init_value=init_value, norm_eps=cfg.norm_eps,
                                dtype=dt, param_dtype=pdt, rngs=rngs)
            for _ in range(cfg.depth_token_only)])
        self.norm = layer_norm(d, eps=cfg.norm_eps, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.head = dense(d, cfg.num_classes, ("embed", "classes"), dtype=dt, param_dtype=pdt, rngs=rngs)
        self.drop_path_rates = tuple(float(r) for r in drop_path_rates(cfg.drop_path_rate, cfg.depth,
                                                                         cfg.drop_path_rule))
        self.deterministic = False

    def forward_features(self, images: jnp.ndarray, key: jax.Array | None = None) -> jnp.ndarray:
        """``[class token, patch tokens]`` after both stages, ``(batch, 1 + num_patches, dim)`` float32."""
        return self.forward_features_with_stats(images, key)[0]

    def forward_features_with_stats(self, images: jnp.ndarray, key: jax.Array | None = None):
        """``(tokens, {"blocks": (depth, 2), "blocks_token_only": (depth_token_only, 2)})``: ``forward_features``
        and each block's branch-to-stream ratios."""
        cfg = self.cfg
        x = embed_patches(self, images)
        x, stats = run_stack(self.blocks, x, depth=cfg.depth, scan_layers=cfg.scan_layers, remat=cfg.remat,
                             key=None if self.deterministic else key, drop_path_rates=self.drop_path_rates,
                             return_stats=True)
        cls = class_tokens(self, x.shape[0])
        token_only_stats = []
        for block in self.blocks_token_only:
            cls, block_stats = block.forward(cls, x)
            token_only_stats.append(block_stats)
        return jnp.concatenate([cls, x], axis=1), {"blocks": stats, "blocks_token_only": jnp.stack(token_only_stats)}

    def forward_head(self, x: jnp.ndarray) -> jnp.ndarray:
        pooled = self.norm(x[:, 0].astype(DTYPES[self.cfg.dtype]))
        return self.head(constrain(pooled, ("batch", None))).astype(jnp.float32)

    def __call__(self, images: jnp.ndarray, key: jax.Array | None = None) -> jnp.ndarray:
        return self.forward_head(self.forward_features(images, key))
