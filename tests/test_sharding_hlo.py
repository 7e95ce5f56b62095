"""What the compiled train and eval steps communicate, read from their HLO: FSDP moves weights and gradients only,
tensor parallelism splits attention by heads (Megatron: one all-reduce per branch in the forward pass), and a tensor
size that would split a head is refused before anything compiles."""
import math

import jax
import jax.numpy as jnp
import pytest

from layerscale_jax.data.sharding import batch_sharding
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.plan import hlo as hlo_lib
from layerscale_jax.train import sharding as shard_lib
from layerscale_jax.train.config import validate_experiment_config

from test_train import tiny_config

BATCH, IMG, PATCH, DIM, HEADS, DEPTH = 8, 16, 4, 64, 4, 2
TOKENS = 1 + (IMG // PATCH) ** 2


def trainer_for(mesh_shape, heads=HEADS, dim=DIM, **model):
    config = tiny_config("steps=4")
    config.model.update(img_size=IMG, patch_size=PATCH, embed_dim=dim, num_heads=heads, depth=DEPTH, **model)
    config.data.image_size = IMG
    config.train.batch_size = config.train.eval_batch_size = BATCH
    config.train.mesh = mesh_shape
    mesh = shard_lib.make_mesh(config.train.mesh, jax.devices()[:math.prod(mesh_shape.values())])
    return loop_lib.create_trainer(validate_experiment_config(config), mesh), mesh


def batch_spec(mesh, eval_=False):
    sharding = batch_sharding(mesh)
    spec = {"image": jax.ShapeDtypeStruct((BATCH, IMG, IMG, 3), jnp.float32, sharding=sharding),
            "label": jax.ShapeDtypeStruct((BATCH,), jnp.int32, sharding=sharding)}
    if eval_:
        spec["mask"] = jax.ShapeDtypeStruct((BATCH,), jnp.bool_, sharding=sharding)
    return spec


def train_collectives(trainer, mesh):
    return hlo_lib.collectives(trainer.train_step.lower(trainer.abstract_state, batch_spec(mesh))
                                 .compile().as_text())


def largest_parameter(trainer):
    return max(math.prod(x.shape) for x in jax.tree.leaves(trainer.abstract_state["params"]))


def test_collectives_are_read_from_hlo_text():
    line = ("  %all-reduce.1 = (f32[], bf16[64,256]{1,0}, f32[2]{0}, f32[3]{0}, f32[4]{0}, /*index=5*/f32[5]{0}) "
            "all-reduce(f32[] %a, bf16[64,256]{1,0} %b, ...), channel_id=1")
    (found,) = hlo_lib.collectives(line)
    assert found.op == "all-reduce" and found.shapes == ((), (64, 256), (2,), (3,), (4,), (5,))
    assert found.bytes == 4 + 2 * 64 * 256 + 4 * (2 + 3 + 4 + 5)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [{"data": 1, "fsdp": 4, "tensor": 1}, {"data": 2, "fsdp": 2, "tensor": 1}],
                         ids=["fsdp4", "data2_fsdp2"])
def test_fsdp_step_moves_weights_and_gradients_only(mesh_shape):
    trainer, mesh = trainer_for(mesh_shape)
    found = train_collectives(trainer, mesh)
    limit = largest_parameter(trainer)
    assert any(c.op == "all-gather" for c in found)                      # the sharded weights are gathered
    too_big = [c for c in found if c.largest > limit]
    assert not too_big, f"collectives larger than the largest parameter ({limit} elements): {too_big}"
    image_gathers = [c for c in found if c.op == "all-gather" and any(len(s) == 4 and s[0] == BATCH
                                                                      for s in c.shapes)]
    assert not image_gathers, image_gathers


@pytest.mark.slow
@pytest.mark.parametrize("heads, dim, tensor", [(4, 64, 4), (6, 96, 2)], ids=["4heads_tensor4", "6heads_tensor2"])
def test_tensor_parallel_attention_is_split_by_heads(heads, dim, tensor):
    trainer, mesh = trainer_for({"data": 1, "fsdp": 1, "tensor": tensor}, heads=heads, dim=dim)
    activation = BATCH * TOKENS * dim
    gathers = [c for c in train_collectives(trainer, mesh) if c.op == "all-gather" and c.largest >= BATCH * TOKENS]
    assert not gathers, f"activations gathered: {gathers}"
    # Forward pass: one all-reduce of the (batch·tokens, dim) stream per branch, i.e. two per block.
    evaluation = hlo_lib.collectives(trainer.eval_step.lower(trainer.abstract_state["params"],
                                                               batch_spec(mesh, eval_=True)).compile().as_text())
    stream_reduces = [c for c in evaluation if c.op == "all-reduce" and c.largest == activation]
    assert len(stream_reduces) == 2 * DEPTH, evaluation
    assert not [c for c in evaluation if c.op == "all-gather" and c.largest >= BATCH * TOKENS], evaluation


@pytest.mark.parametrize("scan_layers", [False, True], ids=["layers", "scanned"])
def test_tensor_size_that_would_split_a_head_is_refused_naming_the_model_and_the_sizes_that_work(scan_layers):
    """DeiT-S's 6 heads on tensor=4 would all-gather every block's qkv activations."""
    with pytest.raises(ValueError, match=r"^model deit3_small_patch16_224: num_heads=6 \(blocks.attn\) is not "
                                         r"divisible by train.mesh.tensor=4 .* this model: 1, 2, 3, 6$"):
        trainer_for({"data": 1, "fsdp": 1, "tensor": 4}, heads=6, dim=96, scan_layers=scan_layers)


def test_tensor_size_that_does_not_divide_the_mlp_width_is_refused():
    with pytest.raises(ValueError, match=r"mlp width 258 \(blocks.mlp.fc1\) is not divisible by "
                                         r"train.mesh.tensor=4 .* this model: 1, 2$"):
        trainer_for({"data": 1, "fsdp": 1, "tensor": 4}, mlp_ratio=258 / 64)
