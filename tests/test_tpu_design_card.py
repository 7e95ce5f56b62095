"""The design card (docs/models.md, "Precision"; docs/multihost.md) checked on programs compiled by libtpu's TPU
compiler for a v5e-4 slice (``plan.compile_for.compile_steps``: the run's own steps), not on XLA:CPU:

- under ``dtype=bfloat16`` every matmul reads bf16 operands, except the backward of the attention logits, whose
  cotangent is the float32 of the logits (the TPU's default precision feeds it to the MXU in one bf16 pass); the
  logits themselves are accumulated into float32 (``preferred_element_type``);
- parameters, LayerScale's λ and the optimizer state are float32 in and out of the step;
- the residual stream between blocks (the layer scan's carry) is float32;
- FSDP gathers bf16 parameters and reduces the gradients over its axis (moving nothing larger than a parameter);
  tensor parallelism over whole heads gathers no activation;
- a scanned depth-96 model compiles to a loop, a program of the size of depth 12's.

Skipped where libtpu is absent. A small LayerScale ViT (width 128, 4 heads, 17 tokens), Mixup off (its Beta
sampler is most of a small program's HLO).
"""
import importlib.util
import math
import re

import jax
import pytest

from test_train import tiny_config

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                 reason="libtpu is not installed (pip install -e '.[tpu]')"),
              pytest.mark.slow]                       # each compile: seconds of CPU
BATCH, WIDTH, HEADS, TOKENS, CHIPS = 16, 128, 4, 17, 4

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = ([a-z]+\d*)\[([\d,]*)\]")
_MATMUL = re.compile(r"^\s*(?:ROOT )?%[\w.\-]+ = ([a-z]+\d*)\[([\d,]*)\]\S* (?:convolution|dot)\(%([\w.\-]+), "
                     r"%([\w.\-]+)\)")
_PARAMETER = re.compile(r"([\w.\-]+): ([a-z]+\d*)\[")


def config(depth=12, mesh=(1, 4, 1)):
    c = tiny_config("steps=4,scan_layers=True")
    c.model.update(img_size=32, patch_size=8, embed_dim=WIDTH, num_heads=HEADS, depth=depth, num_classes=10,
                   dtype="bfloat16", init_values=1e-4)
    c.data.image_size, c.data.num_classes = 32, 10
    c.data.mixup_alpha = c.data.cutmix_alpha = 0.0
    c.train.batch_size = c.train.eval_batch_size = BATCH
    c.train.mesh.data, c.train.mesh.fsdp, c.train.mesh.tensor = mesh
    return c


def compile_steps(eval_step=True, **kwargs):
    from layerscale_jax.plan.compile_for import compile_steps as compile_
    from layerscale_jax.train.config import validate_experiment_config
    return compile_(validate_experiment_config(config(**kwargs)), "v5e-4", eval_step=eval_step)


@pytest.fixture(scope="module")
def fsdp():
    return compile_steps(eval_step=False)          # its tests read the train step only


def matmuls(hlo: str) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """``(output dtype, lhs dtype, rhs dtype, output shape)`` of every dot and convolution of a compiled program."""
    found, types = [], {}
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            types = dict(_PARAMETER.findall(line))        # a new computation: its parameters
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction:
            types[instruction.group(1)] = instruction.group(2)
        matmul = _MATMUL.match(line)
        if matmul:
            out, shape, lhs, rhs = matmul.groups()
            found.append((out, types.get(lhs), types.get(rhs), tuple(int(d) for d in shape.split(",") if d)))
    return found


def test_matmuls_read_bf16_and_the_attention_logits_accumulate_in_float32(fsdp):
    found = matmuls(fsdp.compiled["train"].as_text())
    assert len(found) >= 12, found                          # forward and backward of every layer kind
    per_chip = BATCH // CHIPS
    attention = {(per_chip, HEADS, TOKENS, TOKENS), (per_chip, HEADS, TOKENS, WIDTH // HEADS)}
    not_bf16 = [m for m in found if (m[1], m[2]) != ("bf16", "bf16")]
    assert all(m[3] in attention and "f32" in m[1:3] for m in not_bf16), not_bf16
    assert not [m for m in found if m[1:3] == ("f32", "f32")]
    assert ("f32", "bf16", "bf16", (per_chip, HEADS, TOKENS, TOKENS)) in found      # logits: float32 accumulation
    linear = [m for m in found if len(m[3]) == 2 and m[3][1] in (WIDTH, 3 * WIDTH, 4 * WIDTH)]
    assert linear and all(m[:3] == ("bf16", "bf16", "bf16") for m in linear), linear


def test_parameters_layerscale_and_optimizer_state_are_float32_in_and_out_of_the_step(fsdp):
    compiled = fsdp.compiled["train"]
    state_in = compiled.args_info[0][0]
    state_out = compiled.out_info[0]
    for tree in (state_in, state_out):
        for part in ("params", "opt_state"):
            leaves = jax.tree_util.tree_leaves_with_path(tree[part])
            floats = [(jax.tree_util.keystr(p), leaf) for p, leaf in leaves if jax.numpy.issubdtype(
                _dtype(leaf), jax.numpy.floating)]
            assert floats and all(_dtype(leaf) == jax.numpy.float32 for _, leaf in floats), floats
        gammas = [leaf for p, leaf in jax.tree_util.tree_leaves_with_path(tree["params"]) if "gamma" in str(p)]
        assert len(gammas) == 2 and all(_dtype(g) == jax.numpy.float32 for g in gammas)   # λ of both branches


def _dtype(leaf):
    return getattr(leaf, "dtype", None) or leaf._aval.dtype


def test_the_residual_stream_between_blocks_is_float32(fsdp):
    stream = f"[{BATCH // CHIPS},{TOKENS},{WIDTH}]"
    loops = [line for line in fsdp.compiled["train"].as_text().splitlines()
             if re.search(r" while\(", line) and f"[12,{WIDTH}" in line]          # the layer scans (stacked weights)
    assert len(loops) >= 2, "no forward and backward layer scan found"
    for line in loops:
        assert f"f32{stream}" in line and f"bf16{stream}" not in line, line[:300]


def test_fsdp_gathers_bf16_parameters_and_reduces_gradients_over_the_fsdp_axis(fsdp):
    from layerscale_jax.plan import hlo as hlo_lib
    found = hlo_lib.collectives(fsdp.compiled["train"].as_text())
    weights = [c for c in found if c.kind == "all-gather" and any(len(s) >= 2 and s[-2:] in (
        (WIDTH, 3 * WIDTH), (WIDTH, WIDTH), (WIDTH, 4 * WIDTH), (4 * WIDTH, WIDTH)) for s in c.shapes)]
    assert weights and all(set(c.dtypes) == {"bf16"} for c in weights), weights     # cast to bf16, then gathered
    # The gradients are reduced across the chips: at this size libtpu all-reduces each layer's weight gradients
    # inside the backward scan (each chip keeps its shard); larger steps use reduce-scatter collective matmuls.
    assert {"reduce-scatter", "all-reduce"} & {c.kind for c in found}
    largest = max(math.prod(x.shape) for x in jax.tree.leaves(fsdp.trainer.abstract_state["params"]))
    assert all(c.largest <= largest for c in found), [c for c in found if c.largest > largest]


def test_tensor_parallelism_over_whole_heads_gathers_no_activation():
    from layerscale_jax.plan import hlo as hlo_lib
    steps = compile_steps(mesh=(2, 1, 2))
    activation = (BATCH // 2) * TOKENS
    for name in ("train", "eval"):
        found = hlo_lib.collectives(steps.compiled[name].as_text())
        gathered = [c for c in found if c.kind == "all-gather" and c.largest >= activation]
        assert not gathered, (name, gathered)


def test_a_scanned_depth_96_model_compiles_to_the_program_of_depth_12(fsdp):
    # the compile time that follows from it is measured, not asserted: benchmarks' `depth` entry
    deep = compile_steps(depth=96, eval_step=False)
    shallow_text, deep_text = fsdp.compiled["train"].as_text(), deep.compiled["train"].as_text()
    assert len(deep_text) < 1.05 * len(shallow_text), (len(deep_text), len(shallow_text))
    assert " while(" in deep_text                                                  # a loop over the layers
