"""The optimizer's cost grows with the parameter leaves, never with layer groups × leaves.

Two costs are counted, not timed, at two depths of a tiny ViT with layer decay and a frozen parameter:

- the pytree nodes of the optimizer state, which every call of the jitted train step flattens and rebuilds on the
  host (one ``optax.partition`` label per layer group made this ``O(groups × leaves)``: the measured cause of the
  14–31× slowdown);
- the operations of the update's lowered StableHLO program (what XLA compiles and runs).

The time itself, against plain ``optax`` AdamW at depths 12–96, is a benchmark: ``python -m layerscale_jax.bench
optimizer``.
"""
import functools

import jax
import optax
from flax import nnx
import pytest

from layerscale_jax import create_model, optim

TINY = dict(img_size=8, patch_size=4, embed_dim=8, num_heads=2, num_classes=3)
DEPTHS = (4, 12)
SLACK = 1.05  # per-model constants (stem, head, step counts) make the ratio a little smaller than the leaves'


@functools.lru_cache(maxsize=None)
def update_cost(depth: int, scan_layers: bool) -> dict:
    model = nnx.eval_shape(lambda: create_model("deit3_small_patch16_224", depth=depth, scan_layers=scan_layers,
                                                **TINY))
    config = optim.default_config()
    config.update(layer_decay=0.75, freeze=("cls_token",), name="adamw", grad_clip_norm=1.0)
    tx = optim.build(config, model, total_steps=10).tx
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    state = jax.eval_shape(tx.init, params)

    def update(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    text = jax.jit(update).lower(params, state, params).as_text()
    ops = sum(1 for line in text.splitlines() if " = " in line and "stablehlo." in line)
    return {"leaves": len(jax.tree.leaves(params)), "state_nodes": jax.tree.structure(state).num_nodes,
            "ops": ops}


@pytest.mark.slow
def test_optimizer_state_tree_grows_like_the_parameter_leaves():
    low, high = (update_cost(d, False) for d in DEPTHS)
    leaf_ratio = high["leaves"] / low["leaves"]
    assert high["state_nodes"] / low["state_nodes"] <= SLACK * leaf_ratio, (low, high)
    assert high["state_nodes"] <= 4 * high["leaves"] + 16, high  # mu, nu and their containers per leaf


@pytest.mark.slow
def test_update_program_operations_grow_like_the_parameter_leaves():
    low, high = (update_cost(d, False) for d in DEPTHS)
    assert high["ops"] / low["ops"] <= SLACK * high["leaves"] / low["leaves"], (low, high)


@pytest.mark.slow
def test_scanned_layout_update_does_not_grow_with_depth():
    low, high = (update_cost(d, True) for d in DEPTHS)
    assert high["leaves"] == low["leaves"]
    assert high["state_nodes"] == low["state_nodes"] and high["ops"] == low["ops"], (low, high)
