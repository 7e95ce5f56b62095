"""Stochastic depth (Huang et al., "Deep Networks with Stochastic Depth", 2016).

At train time each sample's whole residual branch is kept with probability ``keep = 1 - rate`` and scaled by
``1 / keep`` so its expectation is unchanged: ``DropPath(b)_n = b_n · m_n / keep`` with ``m_n ~ Bernoulli(keep)``.
At eval it is the identity.

Per-block rates: ``linear`` grows from 0 at the first block to ``drop_path_rate`` at the last (timm, scenic);
``constant`` uses ``drop_path_rate`` in every block (official CaiT / DeiT III code).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layerscale_jax.arch import DROP_PATH_RULES
from layerscale_jax.errors import ConfigError

def drop_path_rates(drop_path_rate: float, depth: int, rule: str) -> np.ndarray:
    """Per-block drop rates, shape ``(depth,)``."""
    if rule == "linear":
        return np.linspace(0.0, drop_path_rate, depth, dtype=np.float32)
    if rule == "constant":
        return np.full((depth,), drop_path_rate, dtype=np.float32)
    raise ConfigError(f"drop_path_rule={rule!r} is not one of {DROP_PATH_RULES}")


def drop_path(x: jnp.ndarray, rate, key: jax.Array | None) -> jnp.ndarray:
    """Drop whole samples of ``x`` (batch on axis 0) with probability ``rate``; ``rate`` may be traced."""
    keep = 1.0 - jnp.asarray(rate, jnp.float32)
    mask_shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    mask = jax.random.bernoulli(key, keep, mask_shape)
    return jnp.where(mask, x / keep.astype(x.dtype), jnp.zeros((), x.dtype))


class DropPath(nnx.Module):
    """Stochastic depth on a residual branch; identity when ``deterministic`` (set by ``model.eval()``)."""

    def __init__(self, rate: float = 0.0):
        self.rate = float(rate)
        self.deterministic = False

    def __call__(self, x: jnp.ndarray, key: jax.Array | None, rate=None) -> jnp.ndarray:
        rate = self.rate if rate is None else rate
        if self.deterministic or (isinstance(rate, (float, int)) and rate == 0.0):
            return x
        if key is None:
            raise ConfigError(
                f"DropPath with rate {rate} in train mode needs a PRNG key: call model(images, key=...) "
                "or switch to eval mode with model.eval()")
        return drop_path(x, rate, key)
