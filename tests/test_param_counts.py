"""Parameter counts of every registered model equal timm's (fixture: scripts/make_param_count_fixture.py).

Counted on abstract models (``nnx.eval_shape``: shapes only, nothing allocated), with the blocks stacked so that
one block is traced per model.
"""
from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from layerscale_jax import create_model, list_models

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "timm_param_counts.json").read_text())
PUBLISHED = {"deit3_small_patch16_224": 22_059_496, "cait_xxs24_224": 11_956_264}


def param_count(name: str) -> int:
    model = nnx.eval_shape(lambda: create_model(name, scan_layers=True))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_fixture_covers_every_registered_model():
    # MAE pre-training models (mae_*: encoder + decoder) have no timm counterpart
    assert sorted(FIXTURE["counts"]) == [n for n in list_models()
                                         if n not in FIXTURE["not_in_timm"] and not n.startswith("mae_")]


@pytest.mark.parametrize("name", sorted(FIXTURE["counts"]))
def test_param_count_matches_timm(name):
    assert param_count(name) == FIXTURE["counts"][name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_the_published_count(name):
    assert FIXTURE["counts"][name] == PUBLISHED[name]
    assert param_count(name) == PUBLISHED[name]
