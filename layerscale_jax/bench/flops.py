"""The analytic FLOP count of a training step (matmuls only, 2 FLOPs per multiply-add), per model family.

Forward, per image, with ``N`` tokens, width ``D``, MLP width ``M``, ``h`` heads, patch ``P``, ``C`` channels:

    patch embedding   2 · n_patches · P²C · D
    ViT block         2N·D·3D (qkv) + 2·N²·D (q kᵀ) + 2·N²·D (A v) + 2N·D² (proj) + 2·2N·D·M (MLP)
    talking heads     + 2 · 2·N²·h² (the two head-mixing maps, CaiT)
    class attention   2·D² (q, class token) + 2·2(N+1)·D² (k, v) + 2·2(N+1)·D (scores, A v) + 2D² (proj)
                      + 2·2·D·M (MLP on the class token)
    head              2·D·classes

Training = forward + backward ≈ 3 × forward: the backward of a matmul is two matmuls of the same size (input and
weight gradients). The patch embedding gets only its weight gradient (the images need none), so it counts 2 ×.
This is the "model FLOPs" of MFU; rematerialisation adds recomputed FLOPs that the count deliberately leaves out.
XLA's cost analysis of the compiled step also counts elementwise work (softmax, GELU, LayerNorm, the optimizer),
which is why the cross-check allows it to be a few percent higher.
"""
from __future__ import annotations


def _vit_block_fwd(n: int, d: int, m: int) -> int:
    return 2 * n * d * 3 * d + 2 * 2 * n * n * d + 2 * n * d * d + 2 * 2 * n * d * m


def forward_flops_per_image(cfg) -> dict:
    """Forward matmul FLOPs of one image, split into ``stem`` (patch embedding) and ``rest``."""
    from layerscale_jax.models.cait import CaiTConfig

    d, p, c = cfg.embed_dim, cfg.patch_size, cfg.in_chans
    n_patches = cfg.num_patches
    m = int(d * cfg.mlp_ratio)
    stem = 2 * n_patches * p * p * c * d
    head = 2 * d * cfg.num_classes
    if isinstance(cfg, CaiTConfig):
        n, h = n_patches, cfg.num_heads
        sa = cfg.depth * (_vit_block_fwd(n, d, m) + 2 * 2 * n * n * h * h)
        m_tok = int(d * cfg.mlp_ratio_token_only)
        ca = cfg.depth_token_only * (2 * d * d + 2 * 2 * (n + 1) * d * d + 2 * 2 * (n + 1) * d + 2 * d * d
                                     + 2 * 2 * d * m_tok)
        return {"stem": stem, "rest": sa + ca + head}
    n = n_patches + 1
    return {"stem": stem, "rest": cfg.depth * _vit_block_fwd(n, d, m) + head}


def train_step_flops(cfg, batch: int) -> int:
    """Model FLOPs of one training step (forward + backward) on ``batch`` images."""
    f = forward_flops_per_image(cfg)
    return batch * (2 * f["stem"] + 3 * f["rest"])


def forward_flops(cfg, batch: int) -> int:
    f = forward_flops_per_image(cfg)
    return batch * (f["stem"] + f["rest"])
