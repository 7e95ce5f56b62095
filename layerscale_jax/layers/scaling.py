"""Residual-branch scaling: LayerScale and the schemes it is compared with.

LayerScale (Touvron et al., "Going deeper with Image Transformers", CaiT, 2021) multiplies the output of every
residual branch of a pre-norm block by a learnable diagonal matrix:

    x'  = x  + diag(λ1) · SA(LN(x))
    x'' = x' + diag(λ2) · FFN(LN(x'))

with every λ initialised to a small constant ε (ε = 0.1 up to depth 18, 1e-5 at depth 24, 1e-6 deeper), so a deep
stack starts close to the identity.

The branch-scaling kinds offered for like-for-like ablations (``branch_scaling=`` on every model), for the two
branches ``f₁ = SA`` and ``f₂ = FFN`` of a block:

- ``none``         plain pre-norm residual ``x + f(LN(x))``.
- ``layerscale``   ``x + diag(λ) · f(LN(x))``, λ ∈ R^D initialised to ε (CaiT).
- ``scalar``       ``x + α · f(LN(x))``, one learnable scalar α per branch initialised to ε (the per-layer scalar
                   the CaiT paper compares LayerScale with: "normalisation kept, scalar").
- ``scalar_zero``  ``x + α · f(LN(x))``, one scalar α per branch initialised to 0, LayerNorm kept: the same
                   family with a zero start.
- ``rezero``       ``x + α · f(x)``, no LayerNorm, ONE scalar α per block shared by its two branches, initialised
                   to 0 (Bachlechner et al., "ReZero is All You Need", 2020: "a single additional learned
                   parameter per layer"; the official ``RZTXEncoderLayer`` multiplies both sublayers by the same
                   ``resweight``).
- ``skipinit``     ``x + α · f(x)``, no normalisation, one scalar α per branch at the end of the branch,
                   initialised to 0 (De & Smith, "Batch Normalization Biases Residual Blocks Towards the Identity
                   Function in Deep Networks", 2020: the zero-initialised multiplier *replaces* the normalisation).

Fixup and T-Fixup (the CaiT paper's other "no normalisation" baselines) are not offered: both are initialisation
rules tied to a particular architecture (T-Fixup rescales the value/output/FFN weights by ``(9N)^(-1/4)`` and the
input embedding by a data-dependent factor, and is defined for encoder-decoder Transformers without a class token),
not a branch multiplier, so they cannot be expressed as a ``branch_scaling`` without a second initialisation path
through every model.

The multiplier is stored in float32 and is folded into the branch's output layer (``factor()``, used by
``layers.blocks`` through ``layers.common.linear``); the branch output joins the float32 residual stream.
"""
from __future__ import annotations

from typing import Union

import jax.numpy as jnp
from flax import nnx

from layerscale_jax.layers.params import param

ZERO_INIT_SCALINGS = ("scalar_zero", "rezero", "skipinit")          # α = 0 by definition
NO_LAYERNORM_SCALINGS = ("rezero", "skipinit")                     # the branch LayerNorm is removed

InitValues = Union[float, str, None]


def cait_init_value(depth: int) -> float:
    """The CaiT rule for ε from the network depth: 0.1 for depth ≤ 18, 1e-5 for depth ≤ 24, 1e-6 deeper."""
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


def resolve_init_value(branch_scaling: str, init_values: InitValues, depth: int) -> float:
    """The initial value of the branch multiplier for ``branch_scaling`` (``"auto"`` applies the CaiT rule)."""
    if branch_scaling in ZERO_INIT_SCALINGS:
        return 0.0
    if branch_scaling == "none":
        return 1.0
    if init_values == "auto":
        return cait_init_value(depth)
    return float(init_values)


class LayerScale(nnx.Module):
    """Per-channel learnable diagonal ``diag(λ)``, λ ∈ R^D initialised to ε, kept in float32."""

    def __init__(self, dim: int, init_value: float):
        self.gamma = param(jnp.full((dim,), init_value, dtype=jnp.float32), "layerscale", ("embed",))

    def factor(self) -> jnp.ndarray:
        """λ, folded into the branch's output layer (``layers.common.linear``)."""
        return self.gamma[...]


class ScalarScale(nnx.Module):
    """One learnable scalar α for the whole branch (``scalar``, ``scalar_zero``, ReZero, SkipInit), kept in float32."""

    def __init__(self, init_value: float):
        self.alpha = param(jnp.full((), init_value, dtype=jnp.float32), "gate", ())

    def factor(self) -> jnp.ndarray:
        """α, folded into the branch's output layer (``layers.common.linear``)."""
        return self.alpha[...]


class Identity(nnx.Module):
    """No scaling (``none``): no factor, the branch output is left as it is."""

    def factor(self) -> None:
        return None


def make_branch_scale(branch_scaling: str, dim: int, init_value: float) -> nnx.Module:
    if branch_scaling == "layerscale":
        return LayerScale(dim, init_value)
    if branch_scaling in ZERO_INIT_SCALINGS:
        return ScalarScale(0.0)        # zero at init by definition, whatever init_value says
    if branch_scaling == "scalar":
        return ScalarScale(init_value)
    return Identity()


def keeps_layernorm(branch_scaling: str) -> bool:
    """ReZero and SkipInit remove the branch LayerNorm; every other kind keeps the pre-norm."""
    return branch_scaling not in NO_LAYERNORM_SCALINGS


def shares_scale_across_branches(branch_scaling: str) -> bool:
    """ReZero has one α per block, used by both branches (the block then holds ``ls1`` only)."""
    return branch_scaling == "rezero"
