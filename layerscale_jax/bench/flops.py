"""The analytic FLOP count of a training step (matmuls only, 2 FLOPs per multiply-add), per model family.

Forward, per image, with ``N`` tokens, width ``D``, MLP width ``M``, ``h`` heads, patch ``P``, ``C`` channels:

    patch embedding   2 · n_patches · P²C · D
    ViT block         2N·D·3D (qkv) + 2·N²·D (q kᵀ) + 2·N²·D (A v) + 2N·D² (proj) + 2·2N·D·M (MLP)
    talking heads     + 2 · 2·N²·h² (the two head-mixing maps, CaiT)
    class attention   2·D² (q, class token) + 2·2(N+1)·D² (k, v) + 2·2(N+1)·D (scores, A v) + 2D² (proj)
                      + 2·2·D·M (MLP on the class token)
    head              2·D·classes
    MAE               the encoder's blocks on the ``1 + n_keep`` visible tokens, no head; the decoder: embed
                      2·(1 + n_keep)·D·D_d, blocks of width D_d on N + 1 tokens, prediction 2·(N + 1)·D_d·P²C

Training ≈ 3 × forward (a matmul's backward is two matmuls of its size); the patch embedding gets only its weight
gradient, so it counts 2 ×. These are MFU's "model FLOPs": remat's recomputation is left out, and XLA's cost
analysis (which also counts softmax, GELU, LayerNorm and the optimizer) is a few percent higher.
"""
from __future__ import annotations


def train_step_flops(cfg, batch: int, class_token: bool = True) -> int:
    """Model FLOPs of one training step on ``batch`` images; ``class_token=False``: a ViT whose blocks see the
    patch tokens only (big_vision's ``pool_type="gap"``, the ``--vs-peer`` model)."""
    from layerscale_jax.arch import CaiTConfig, MAEConfig, num_kept

    d, n = cfg.embed_dim, cfg.num_patches
    stem = 2 * n * cfg.patch_size ** 2 * cfg.in_chans * d

    def block(n, d=d):
        m = int(d * cfg.mlp_ratio)
        return 2 * n * d * 3 * d + 2 * 2 * n * n * d + 2 * n * d * d + 2 * 2 * n * d * m

    rest = 2 * d * cfg.num_classes
    if isinstance(cfg, MAEConfig):
        visible, dd = 1 + num_kept(n, cfg.mask_ratio), cfg.decoder_embed_dim
        rest = (cfg.depth * block(visible) + 2 * visible * d * dd + cfg.decoder_depth * block(n + 1, dd)
                + 2 * (n + 1) * dd * cfg.patch_size ** 2 * cfg.in_chans)
    elif isinstance(cfg, CaiTConfig):
        m_cls = int(d * cfg.mlp_ratio_token_only)
        rest += cfg.depth * (block(n) + 2 * 2 * n * n * cfg.num_heads ** 2) + cfg.depth_token_only * (
            2 * d * d + 2 * 2 * (n + 1) * d * d + 2 * 2 * (n + 1) * d + 2 * d * d + 2 * 2 * d * m_cls)
    else:
        rest += cfg.depth * block(n + int(class_token))
    return batch * (2 * stem + 3 * rest)
