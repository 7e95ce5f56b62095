"""The step-time range of ``--compile_for`` (``plan.hlo``, ``plan.step_time``), checked against hand counts: loops
of known trip count compiled on the CPU, a known all-reduce on an 8-device CPU mesh, and HLO text in the forms libtpu
and XLA's GPU compiler write (a loop without ``known_trip_count``, megascale sends, replica-group spellings)."""
import dataclasses
import importlib.util
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from layerscale_jax.plan import hlo
from layerscale_jax.plan.step_time import step_time
from layerscale_jax.plan.targets import CHIPS
from layerscale_jax.train.config import validate_experiment_config

# A chip with round figures, so that each term is a hand division.
ROUND = dataclasses.replace(CHIPS["v5e"], peak_bf16_flop_per_s=1e12, hbm_bytes_per_s=1e9, link_bytes_per_s=1e8,
                            network_bytes_per_s=1e7)


def compiled_text(fn, *args, **jit):
    return jax.jit(fn, **jit).lower(*args).compile().as_text()


def test_a_loop_s_matmuls_count_once_per_trip():
    def f(x, w):
        return jax.lax.fori_loop(0, 7, lambda i, x: jnp.tanh(x @ w), x)

    text = compiled_text(f, jnp.zeros((8, 16)), jnp.zeros((16, 16)))
    work = hlo.step_work(text)
    assert work.flops == 7 * 2 * 8 * 16 * 16 and not work.unknown_loops
    # every trip reads x and w and writes x at least once
    assert work.hbm_bytes >= 7 * (2 * 8 * 16 + 16 * 16) * 4


def test_a_scan_over_stacked_weights_reads_one_layer_per_trip():
    def f(x, stacked):
        return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x, stacked)[0]

    layers, width = 6, 64
    text = compiled_text(f, jnp.zeros((8, width)), jnp.zeros((layers, width, width)))
    work = hlo.step_work(text)
    assert work.flops == layers * 2 * 8 * width * width
    layer = width * width * 4
    # each trip reads its layer; reading the whole stack every trip would alone be layers × layers × layer bytes
    assert layers * layer <= work.hbm_bytes < layers * layers * layer


def test_a_known_all_reduce_in_a_loop_counts_its_trips_and_ring_bytes():
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    rows = NamedSharding(mesh, P("d"))

    def f(x):
        return jax.lax.fori_loop(0, 3, lambda i, acc: acc + jnp.sum(x * i, axis=0), jnp.zeros(1024))

    text = compiled_text(f, jax.ShapeDtypeStruct((8, 1024), jnp.float32, sharding=rows),
                         out_shardings=NamedSharding(mesh, P()))
    (reduce,) = [c for c in hlo.collectives(text) if c.kind == "all-reduce"]
    assert reduce.bytes == 1024 * 4 and reduce.group_size == 4
    table = hlo.collectives_by_kind(hlo.collectives(text))
    assert table["all-reduce"]["count"] == reduce.trips and table["all-reduce"]["bytes"] == reduce.trips * 4096
    time = step_time(text, ROUND)
    sent = reduce.trips * 2 * 3 / 4 * 4096                   # ring all-reduce: 2 (p − 1) / p of the array
    assert time.link_bytes_per_chip == {"ICI": pytest.approx(sent)}
    assert time.seconds["ICI"] == pytest.approx(sent / 1e8)


LIBTPU_LOOP = """\
HloModule jit_step, num_partitions=4

%fused_dot (param_0: bf16[4,8,8], param_1: bf16[2,8], param_2: s32[]) -> bf16[2,8] {
  %param_0 = bf16[4,8,8]{2,1,0} parameter(0)
  %param_2 = s32[] parameter(2)
  %c0 = s32[] constant(0)
  %dynamic-slice.1 = bf16[1,8,8]{2,1,0} dynamic-slice(%param_0, %param_2, %c0, %c0), dynamic_slice_sizes={1,8,8}
  %bitcast.1 = bf16[8,8]{1,0} bitcast(%dynamic-slice.1)
  %param_1 = bf16[2,8]{1,0} parameter(1)
  ROOT %convolution.1 = bf16[2,8]{1,0} convolution(%param_1, %bitcast.1), dim_labels=bf_oi->bf
}

%body (p: (s32[], bf16[2,8], bf16[4,8,8])) -> (s32[], bf16[2,8], bf16[4,8,8]) {
  %p = (s32[], bf16[2,8]{1,0}, /*index=2*/bf16[4,8,8]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = bf16[2,8]{1,0} get-tuple-element(%p), index=1
  %w = bf16[4,8,8]{2,1,0} get-tuple-element(%p), index=2
  %fusion.1 = bf16[2,8]{1,0} fusion(%w, %x, %i), kind=kOutput, calls=%fused_dot
  %all-reduce.1 = bf16[2,8]{1,0} all-reduce(%fusion.1), channel_id=3, replica_groups=[2,2]<=[4], to_apply=%add
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[2,8]{1,0}, bf16[4,8,8]{2,1,0}) tuple(%next, %all-reduce.1, %w)
}

%cond (q: (s32[], bf16[2,8], bf16[4,8,8])) -> pred[] {
  %q = (s32[], bf16[2,8]{1,0}, bf16[4,8,8]{2,1,0}) parameter(0)
  %limit = s32[]{:T(128)} constant(4)
  %j = s32[] get-tuple-element(%q), index=0
  ROOT %lt = pred[] compare(%j, %limit), direction=LT
}

ENTRY %main (a: bf16[2,8], b: bf16[4,8,8], g: f32[16]) -> bf16[2,8] {
  %a = bf16[2,8]{1,0} parameter(0)
  %b = bf16[4,8,8]{2,1,0} parameter(1)
  %g = f32[16]{0} parameter(2)
  %start = s32[] constant(1)
  %init = (s32[], bf16[2,8]{1,0}, bf16[4,8,8]{2,1,0}) tuple(%start, %a, %b)
  %while.1 = (s32[], bf16[2,8]{1,0}, bf16[4,8,8]{2,1,0}) while(%init), condition=%cond, body=%body
  %after-all = token[] after-all()
  %send = (f32[16]{0}, u32[]{:S(2)}, token[]) send(%g, %after-all), channel_id=9, is_host_transfer=true, \
frontend_attributes={_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %send-done = token[] send-done(%send), channel_id=9, is_host_transfer=true
  ROOT %out = bf16[2,8]{1,0} get-tuple-element(%while.1), index=1
}
"""


def test_a_libtpu_loop_s_trip_count_is_read_from_its_condition_and_initial_value():
    module = hlo.parse(LIBTPU_LOOP)
    (loop,) = [i for i in module.computations["main"] if i.opcode == "while"]
    assert hlo.trip_count(module, loop) == 3                            # i = 1, 2, 3 < 4
    runs, unknown = hlo.multipliers(module)
    assert runs["body"] == 3 and runs["fused_dot"] == 3 and runs["main"] == 1 and not unknown


def test_hand_counted_flops_bytes_and_communication_of_a_libtpu_program():
    time = step_time(LIBTPU_LOOP, ROUND, num_slices=2)
    # per trip a [2,8] × [8,8] matmul (as a convolution): 2 · 16 outputs · 8 taps
    assert time.flops_per_chip == 3 * 2 * 16 * 8
    # per trip: the fusion reads its layer's slice (128 B, not the stack's 512), x (32 B) and i (4 B) and writes
    # 32 B; i + 1 reads 8 B and writes 4 B; the condition reads 8 B and writes a 1-byte pred
    assert time.hbm_bytes_per_chip == 3 * (128 + 32 + 4 + 32 + 12) + 3 * 9
    reduce, send = sorted(hlo.collectives(LIBTPU_LOOP), key=lambda c: c.form)
    assert (reduce.kind, reduce.trips, reduce.groups) == ("all-reduce", 3, ((0, 1), (2, 3)))
    assert (send.kind, send.form, send.bytes) == ("all-reduce", "megascale send", 64)
    # ICI: 3 × 2·(2−1)/2 × 32 B; DCN: the 64 B gradient all-reduced over 2 slices, 2·(2−1)/2 × 64 B
    assert time.link_bytes_per_chip == {"ICI": 3 * 32, "DCN": 64}
    assert time.seconds == pytest.approx({"compute": 768 / 1e12, "memory": 651 / 1e9, "ICI": 96 / 1e8,
                                          "DCN": 64 / 1e7})
    assert time.lower == pytest.approx(64 / 1e7) and time.dominant == "DCN"
    assert time.upper == pytest.approx(sum(time.seconds.values()))


def test_collectives_whose_gpus_span_hosts_cross_the_network():
    text = ("%a = f32[256]{0} all-reduce(%x), channel_id=1, replica_groups={{0,2},{1,3}}, to_apply=%add\n"
            "%b = f32[256]{0} all-reduce(%y), channel_id=2, replica_groups={{0,1},{2,3}}, to_apply=%add\n")
    time = step_time(text, dataclasses.replace(ROUND, platform="cuda", link="NVLink", network="network"),
                     processes=[0, 0, 1, 1])
    assert time.link_bytes_per_chip == {"network": 1024, "NVLink": 1024}


@pytest.mark.parametrize("attrs, groups", [
    ("replica_groups={{0,1,2,3}}, dimensions={0}", ((0, 1, 2, 3),)),
    ("replica_groups={{0,2},{1,3}}, to_apply=%add", ((0, 2), (1, 3))),
    ("replica_groups=[2,2]<=[4]", ((0, 1), (2, 3))),
    ("replica_groups=[2,2]<=[2,2]T(1,0)", ((0, 2), (1, 3))),
    ("replica_groups=mesh['data'=2,'fsdp'=2,'tensor'=1] {'fsdp'}", ((0, 1), (2, 3))),
    ("replica_groups=mesh['data'=2,'fsdp'=2,'tensor'=1] {'data'}", ((0, 2), (1, 3))),
    ("replica_groups={}", ((0, 1, 2, 3),)),
    ("source_target_pairs={{0,1},{1,2},{2,3},{3,0}}", ((0, 1), (1, 2), (2, 3), (3, 0))),
])
def test_replica_groups_in_every_spelling(attrs, groups):
    assert hlo.replica_groups(attrs, 4) == groups


@pytest.mark.parametrize("kind, p, factor", [("all-reduce", 4, 1.5), ("all-gather", 4, 0.75),
                                             ("reduce-scatter", 4, 3.0), ("all-to-all", 8, 7 / 8),
                                             ("collective-permute", 2, 1.0)])
def test_ring_algorithm_factors(kind, p, factor):
    c = hlo.Collective(kind, ((256,),), ("f32",), groups=(tuple(range(p)),))
    assert c.link_bytes() == pytest.approx(factor * 1024)


def test_lower_bound_is_the_largest_term_and_upper_their_sum():
    time = step_time(LIBTPU_LOOP, ROUND, num_slices=2)
    assert time.lower == max(time.seconds.values()) and time.upper == pytest.approx(math.fsum(time.seconds.values()))


ZERO_PADDED = """\
%pad (param_0: f32[16], param_1: f32[4], param_2: u32[]) -> f32[16] {
  %param_0 = f32[16]{0} parameter(0)
  %param_1 = f32[4]{0} parameter(1)
  %param_2 = u32[] parameter(2)
  ROOT %dynamic-update-slice.1 = f32[16]{0} dynamic-update-slice(%param_0, %param_1, %param_2)
}

ENTRY %main (shard: f32[4], grad: f32[8]) -> (f32[16], f32[8]) {
  %shard = f32[4]{0} parameter(0)
  %grad = f32[8]{0} parameter(1)
  %zero = f32[] constant(0)
  %zeros = f32[16]{0} broadcast(%zero), dimensions={}
  %offset = u32[] partition-id()
  %padded = f32[16]{0} fusion(%zeros, %shard, %offset), kind=kLoop, calls=%pad
  ROOT %all-reduce.1 = (f32[16]{0}, f32[8]{0}) all-reduce(%padded, %grad), channel_id=1, \
replica_groups=[1,4]<=[4], to_apply=%add
}
"""


def test_an_all_reduce_of_zero_padded_shards_is_the_all_gather_it_implements():
    gather, reduce = hlo.collectives(ZERO_PADDED)
    assert (gather.kind, gather.form, gather.bytes) == ("all-gather", "zero-padded all-reduce", 64)
    assert (reduce.kind, reduce.form, reduce.bytes) == ("all-reduce", "", 32)
    # it moves what an all-reduce of the whole 64-byte buffer moves, not an all-gather's 3/4 of it
    assert gather.link_bytes() == pytest.approx(2 * 3 / 4 * 64)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
def test_a_two_slice_step_reduces_across_slices_over_dcn_and_gathers_with_padded_all_reduces():
    """The tiny config on 2 × v5e-4 (fsdp 4 within a slice, data across the 2): libtpu's cross-slice gradient
    all-reduce is megascale sends, counted on the DCN; within a slice it gathers with zero-padded all-reduces."""
    from layerscale_jax.plan.compile_for import compile_steps
    from layerscale_jax.train.config import with_overrides

    from test_train import tiny_config
    config = with_overrides(tiny_config("scan_layers=True"), {"data.mixup_alpha": 0, "data.cutmix_alpha": 0,
                                                              "train.mesh.data": 1, "train.mesh.fsdp": -1,
                                                              "train.mesh.dcn_data": 2})
    steps = compile_steps(validate_experiment_config(config), "2xv5e-4", eval_step=False)
    text = steps.compiled["train"].as_text()
    found = hlo.collectives(text)
    sends = [c for c in found if c.form == "megascale send"]
    assert sends and all(c.kind == "all-reduce" for c in sends)
    assert any(c.form == "zero-padded all-reduce" for c in found)
    time = step_time(text, CHIPS["v5e"], num_slices=2)
    # a 2-slice all-reduce sends 2 (2 − 1) / 2 = 1 × each array over the DCN, at 25 Gbps a chip
    assert time.link_bytes_per_chip["DCN"] == pytest.approx(sum(c.bytes * c.trips for c in sends))
    assert time.seconds["DCN"] == pytest.approx(time.link_bytes_per_chip["DCN"] / 3.125e9)
