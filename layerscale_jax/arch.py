"""Architecture configs and the model registry's names, without jax: what a model is, checked, before any array.

``ArchConfig`` (every family's options, timm's constructor vocabulary) and its families ``ViTConfig``,
``CaiTConfig`` and ``MAEConfig`` are frozen dataclasses validated when they are made, so a config that exists is a
model that can be built. ``model_config(name, **overrides)`` is a registered name's config with overrides;
``models.registry`` builds the ``nnx`` module of each family from it (``create_model``, ``create_from_config``).

Nothing here imports jax: config files (``configs/*.py``) and the command line's checks use it before jax starts.
Dtypes are names (``"float32"``, ``"bfloat16"``, ``"float16"``); the models resolve them to ``jnp`` dtypes
(``models.base.DTYPES``). The option names of the layers (branch scalings, drop-path rules, attention
implementations, remat policies) live here too, so the layers and the configs share one list.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from layerscale_jax.errors import ConfigError
from layerscale_jax.settings import boolean, check_fields, choice, integer, number

DTYPE_NAMES = ("float32", "bfloat16", "float16")

# layers.scaling: the residual-branch multipliers (see its docstring for each).
BRANCH_SCALINGS = ("none", "layerscale", "scalar", "scalar_zero", "rezero", "skipinit")
# layers.drop_path: per-block stochastic-depth rates, ``linear`` (0 → rate over depth) or ``constant``.
DROP_PATH_RULES = ("linear", "constant")
# layers.attention: how softmax(q kᵀ / √d_h) v is computed (the same function every way; only the speed differs).
ATTENTION_IMPLEMENTATIONS = ("auto", "einsum", "xla", "cudnn")
# models.stack: named rematerialisation policies (what the backward pass may keep instead of recomputing).
REMAT_NAMES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")


def canonical_dtype(field: str, value: Any) -> str:
    """A dtype's name: ``"bfloat16"``, or the name of a dtype object such as ``jnp.bfloat16``."""
    if not isinstance(value, str):
        import numpy as np               # a dtype object comes from code that has numpy (and jax) loaded already
        try:
            value = np.dtype(value).name
        except TypeError:
            raise ConfigError(f"{field}={value!r} is not one of {DTYPE_NAMES}") from None
    return choice(field, value, DTYPE_NAMES)


def validate_branch_scaling(branch_scaling: str, init_values: float | str | None) -> None:
    choice("branch_scaling", branch_scaling, BRANCH_SCALINGS)
    if branch_scaling in ("layerscale", "scalar"):
        if isinstance(init_values, str):
            if init_values != "auto":
                raise ConfigError(f"init_values={init_values!r}: expected a float or 'auto'")
        elif init_values is None or not float(init_values) > 0:
            raise ConfigError(
                f"init_values={init_values!r}: {branch_scaling} needs a positive initial value (or 'auto')")


def validate_attention_impl(value) -> None:
    choice("attention_impl", value, ATTENTION_IMPLEMENTATIONS)


def validate_remat(remat: str) -> None:
    choice("remat", remat, REMAT_NAMES)


@dataclasses.dataclass(frozen=True)
class ArchConfig:
    """Architecture options shared by every family (timm's constructor vocabulary).

    img_size, patch_size, in_chans: input geometry (NHWC images of ``img_size × img_size × in_chans``).
    num_classes: classifier outputs. embed_dim, depth, num_heads, mlp_ratio, qkv_bias: the transformer.
    branch_scaling: ``none | layerscale | scalar | rezero | skipinit`` (see ``layers.scaling``).
    init_values: ε for ``layerscale``/``scalar`` (a float, or ``"auto"`` for the CaiT depth rule).
    drop_path_rate, drop_path_rule: stochastic depth, ``linear`` (0 → rate over depth) or ``constant``.
    norm_eps: LayerNorm epsilon. dtype: compute dtype. param_dtype: parameter dtype (LayerScale is always float32);
    both a name of ``DTYPE_NAMES`` (a dtype object such as ``jnp.bfloat16`` is accepted and stored by its name).
    scan_layers: stack the blocks and scan over them. remat: rematerialisation policy name.
    """
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    branch_scaling: str = "layerscale"
    init_values: float | str = 1e-6
    drop_path_rate: float = 0.0
    drop_path_rule: str = "linear"
    norm_eps: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype("dtype", self.dtype))
        object.__setattr__(self, "param_dtype", canonical_dtype("param_dtype", self.param_dtype))
        if isinstance(self.init_values, (int, float)):
            object.__setattr__(self, "init_values", float(self.init_values))
        self.validate()

    def validate(self) -> None:
        for field in ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads"):
            integer(field, getattr(self, field), 1)
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}")
        if self.img_size % self.patch_size:
            raise ConfigError(f"img_size={self.img_size} is not divisible by patch_size={self.patch_size}")
        number("mlp_ratio", self.mlp_ratio, 0.0, low_open=True)
        number("drop_path_rate", self.drop_path_rate, 0.0, 1.0, high_open=True)
        choice("drop_path_rule", self.drop_path_rule, DROP_PATH_RULES)
        number("norm_eps", self.norm_eps, 0.0, low_open=True)
        validate_branch_scaling(self.branch_scaling, self.init_values)
        validate_remat(self.remat)

    @property
    def grid_size(self) -> int:
        return self.img_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size ** 2


GLOBAL_POOLS = ("token", "avg")


@dataclasses.dataclass(frozen=True)
class ViTConfig(ArchConfig):
    """``ArchConfig`` plus: global_pool (``token`` | ``avg``); attention_impl, how attention is computed
    (``auto`` | ``einsum`` | ``xla`` | ``cudnn``, ``layers.attention``: the same function, only the speed differs);
    patch_dims: 2 for NHWC images cut into ``patch_size × patch_size`` patches, 1 for 1-D signals ``(batch,
    img_size, in_chans)`` (mnist1d) cut into patches of ``patch_size`` samples — ``img_size`` is then the signal's
    length and there are ``img_size / patch_size`` patches; everything after the patch embedding is unchanged."""
    global_pool: str = "token"
    attention_impl: str = "auto"
    patch_dims: int = 2

    def validate(self) -> None:
        super().validate()
        validate_attention_impl(self.attention_impl)
        choice("global_pool", self.global_pool, GLOBAL_POOLS)
        if self.patch_dims not in (1, 2) or isinstance(self.patch_dims, bool):
            raise ConfigError(f"patch_dims={self.patch_dims!r} must be 1 (1-D signals) or 2 (images)")

    @property
    def num_patches(self) -> int:
        return self.grid_size ** self.patch_dims


@dataclasses.dataclass(frozen=True)
class CaiTConfig(ArchConfig):
    """``ArchConfig`` plus: depth_token_only (class-attention blocks), mlp_ratio_token_only."""
    depth_token_only: int = 2
    mlp_ratio_token_only: float = 4.0
    drop_path_rule: str = "constant"
    init_values: float | str = 1e-5

    def validate(self) -> None:
        super().validate()
        integer("depth_token_only", self.depth_token_only, 1)
        number("mlp_ratio_token_only", self.mlp_ratio_token_only, 0.0, low_open=True)


def num_kept(num_patches: int, mask_ratio: float) -> int:
    """MAE's ``len_keep = int(L * (1 - mask_ratio))``."""
    return int(num_patches * (1 - mask_ratio))


@dataclasses.dataclass(frozen=True)
class MAEConfig(ArchConfig):
    """``ArchConfig`` (the encoder) plus the decoder and the pre-training objective.

    decoder_embed_dim, decoder_depth, decoder_num_heads: the decoder (MAE: 512, 8, 16 for ViT-B/L/H).
    mask_ratio: the fraction of patches removed per image, in (0, 1) (MAE: 0.75).
    norm_pix_loss: regress per-patch normalised pixels (MAE's best setting) instead of the raw inputs.
    attention_impl: how encoder and decoder compute attention (``auto`` | ``einsum`` | ``xla`` | ``cudnn``,
    ``layers.attention``).
    ``num_classes`` is not used by the pre-training model (it has no head); it names the classifier the encoder is
    meant for.
    """
    attention_impl: str = "auto"
    decoder_embed_dim: int = 512
    decoder_depth: int = 8
    decoder_num_heads: int = 16
    mask_ratio: float = 0.75
    norm_pix_loss: bool = True

    def validate(self) -> None:
        super().validate()
        validate_attention_impl(self.attention_impl)
        for field in ("decoder_embed_dim", "decoder_depth", "decoder_num_heads"):
            integer(field, getattr(self, field), 1)
        if self.decoder_embed_dim % self.decoder_num_heads:
            raise ConfigError(f"decoder_embed_dim={self.decoder_embed_dim} is not divisible by "
                              f"decoder_num_heads={self.decoder_num_heads}")
        ratio = self.mask_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < ratio < 1.0:
            raise ConfigError(f"mask_ratio={ratio!r} must lie in the open interval (0, 1)")
        if num_kept(self.num_patches, ratio) < 1:
            raise ConfigError(f"mask_ratio={ratio!r} keeps no patch of the {self.num_patches} per image")
        boolean("norm_pix_loss", self.norm_pix_loss)

    @property
    def patch_dim(self) -> int:
        return self.patch_size * self.patch_size * self.in_chans


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered name: its family's config class and the defaults that make it timm's model of that name."""
    name: str
    config_cls: type
    defaults: dict[str, Any]

    def make_config(self, overrides: dict[str, Any]) -> ArchConfig:
        check_fields(overrides, [f.name for f in dataclasses.fields(self.config_cls)], "", f"model {self.name!r}")
        return self.config_cls(**{**self.defaults, **overrides})


_REGISTRY: dict[str, ModelEntry] = {}


def register(name: str, config_cls: type, **defaults) -> None:
    _REGISTRY[name] = ModelEntry(name, config_cls, defaults)


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def get_entry(name: str) -> ModelEntry:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=5, cutoff=0.4)
        hint = f"; closest registered names: {close}" if close else f"; registered: {list_models()}"
        raise ConfigError(f"unknown model name {name!r}{hint}")
    return _REGISTRY[name]


def model_config(name: str, **overrides) -> ArchConfig:
    """The architecture config ``create_model(name, **overrides)`` builds (validated, nothing allocated)."""
    return get_entry(name).make_config(overrides)


# DeiT III (timm's deit3_*): LayerScale init 1e-6 as in timm, qkv bias, LayerNorm eps 1e-6, linear drop-path rule.
_DEIT3 = {
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "medium": dict(embed_dim=512, depth=12, num_heads=8),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
    "huge": dict(embed_dim=1280, depth=32, num_heads=16),
}
for _size, _patch, _img in [("small", 16, 224), ("small", 16, 384), ("medium", 16, 224), ("base", 16, 224),
                            ("base", 16, 384), ("large", 16, 224), ("large", 16, 384), ("huge", 14, 224)]:
    register(f"deit3_{_size}_patch{_patch}_{_img}", ViTConfig, patch_size=_patch, img_size=_img, init_values=1e-6,
             **_DEIT3[_size])

# CaiT (timm's cait_*): the official per-model LayerScale init (xxs36 does not follow the depth rule).
_CAIT = {
    "xxs24": dict(embed_dim=192, depth=24, num_heads=4, init_values=1e-5),
    "xxs36": dict(embed_dim=192, depth=36, num_heads=4, init_values=1e-5),
    "xs24": dict(embed_dim=288, depth=24, num_heads=6, init_values=1e-5),
    "s24": dict(embed_dim=384, depth=24, num_heads=8, init_values=1e-5),
    "s36": dict(embed_dim=384, depth=36, num_heads=8, init_values=1e-6),
    "m36": dict(embed_dim=768, depth=36, num_heads=16, init_values=1e-6),
    "m48": dict(embed_dim=768, depth=48, num_heads=16, init_values=1e-6),
}
for _size, _img in [("xxs24", 224), ("xxs24", 384), ("xxs36", 224), ("xxs36", 384), ("xs24", 384), ("s24", 224),
                    ("s24", 384), ("s36", 384), ("m36", 384), ("m48", 448)]:
    register(f"cait_{_size}_{_img}", CaiTConfig, patch_size=16, img_size=_img, **_CAIT[_size])

# MAE pre-training (He et al. 2021) of a DeiT III encoder: MAE's decoder (512 wide, 8 blocks, 16 heads) for B/L/H.
for _size, _patch in [("small", 16), ("base", 16), ("large", 16), ("huge", 14)]:
    register(f"mae_deit3_{_size}_patch{_patch}_224", MAEConfig, patch_size=_patch, img_size=224, init_values=1e-6,
             decoder_embed_dim=512, decoder_depth=8, decoder_num_heads=16, mask_ratio=0.75, norm_pix_loss=True,
             **_DEIT3[_size])
