"""Building blocks: branch scaling (LayerScale and alternatives), stochastic depth, attention, blocks."""
from layerscale_jax.arch import BRANCH_SCALINGS
from layerscale_jax.layers.attention import Attention, ClassAttention, TalkingHeadsAttention
from layerscale_jax.layers.blocks import Block, ClassAttentionBlock
from layerscale_jax.layers.common import Mlp, PatchEmbed
from layerscale_jax.layers.drop_path import DROP_PATH_RULES, DropPath, drop_path, drop_path_rates
from layerscale_jax.layers.scaling import LayerScale, ScalarScale, cait_init_value, resolve_init_value

__all__ = [
    "Attention", "ClassAttention", "TalkingHeadsAttention", "Block", "ClassAttentionBlock", "Mlp", "PatchEmbed",
    "DROP_PATH_RULES", "DropPath", "drop_path", "drop_path_rates", "BRANCH_SCALINGS", "LayerScale", "ScalarScale",
    "cait_init_value", "resolve_init_value",
]
