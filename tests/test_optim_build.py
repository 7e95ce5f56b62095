"""``optim.build``: the update equals a hand-written AdamW with per-layer rates, both block layouts give the same
updates, frozen params get zero updates and no state, schedules, and bad configs fail naming the option."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from layerscale_jax import create_model, optim
from layerscale_jax.models.layout import stack_blocks

TINY = dict(img_size=8, patch_size=4, embed_dim=8, depth=2, num_heads=2, num_classes=3)
TINY_CAIT = dict(TINY, depth_token_only=1)


def config(**overrides):
    c = optim.default_config()
    c.update(overrides)
    return c


@functools.lru_cache(maxsize=None)
def tiny(name="deit3_small_patch16_224", scan_layers=False):
    """An abstract tiny model (building the optimizer needs no weights)."""
    kwargs = TINY_CAIT if name.startswith("cait") else TINY
    return nnx.eval_shape(lambda: create_model(name, scan_layers=scan_layers, **kwargs))


def random_like(tree, seed):
    """A tree like ``tree`` (``nnx.State`` or dict) of standard-normal float32 numpy arrays."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), tree)


def run_steps(bundle, params, grads_per_step):
    """Apply the optimizer for a few steps; return the update of every step (each function compiled once)."""
    update, apply = jax.jit(bundle.tx.update), jax.jit(optax.apply_updates)
    state = jax.jit(bundle.tx.init)(params)
    updates = []
    for grads in grads_per_step:
        u, state = update(grads, state, params)
        params = apply(params, u)
        updates.append(u)
    return updates


# ---- an independent reference: numpy AdamW (torch semantics) with per-layer learning rates --------------------

def numpy_adamw(params, grads_per_step, lr_at, scale_of, decays, b1=0.9, b2=0.999, eps=1e-8, wd=0.05):
    """``params``/grads: {name: np.ndarray}. torch AdamW: w ← w·(1 − lr·s·wd) − lr·s·m̂/(√v̂ + eps)."""
    w = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    updates = []
    for t, grads in enumerate(grads_per_step, start=1):
        step = {}
        for k, g in grads.items():
            g = g.astype(np.float64)
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat, v_hat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
            lr = lr_at(t - 1) * scale_of(k)
            new = w[k] * (1 - lr * wd * decays(k)) - lr * m_hat / (np.sqrt(v_hat) + eps)
            step[k], w[k] = new - w[k], new
        updates.append(step)
    return updates


def flat(tree):
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(x)
            for path, x in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(tree))[0]}


def test_one_step_equals_handwritten_adamw_with_per_layer_rates():
    model = tiny()
    depth, decay, peak, total = TINY["depth"], 0.5, 0.01, 4
    bundle = optim.build(config(learning_rate=peak, weight_decay=0.05, grad_clip_norm=0.0, layer_decay=decay,
                                layer_decay_convention="mae", schedule="cosine"), model, total_steps=total)
    params = random_like(nnx.state(model, nnx.Param), 10)
    grads = [random_like(params, 0), random_like(params, 1)]
    ours = [flat(u) for u in run_steps(bundle, params, grads)]

    def scale_of(name):  # MAE rule, written out: stem 0, blocks.i → i + 1, norm/head → depth + 1
        top = name.split("/")[0]
        layer = 0 if top in ("cls_token", "pos_embed", "patch_embed") else (
            int(name.split("/")[1]) + 1 if top == "blocks" else depth + 1)
        return decay ** (depth + 1 - layer)

    def lr_at(t):
        return 0.5 * peak * (1 + math.cos(math.pi * t / total))

    ref = numpy_adamw(flat(params), [flat(g) for g in grads], lr_at, scale_of,
                      decays=lambda name: name.endswith("kernel"))
    assert ours[0].keys() == ref[0].keys()
    for step_ours, step_ref in zip(ours, ref):
        for name in step_ref:
            np.testing.assert_allclose(step_ours[name], step_ref[name], rtol=1e-5, atol=2e-8, err_msg=name)
    # The layer scales really differ: the stem moves 2**(depth + 1) times less than the head per unit of Adam step.
    assert scale_of("cls_token") == decay ** (depth + 1) and scale_of("head/kernel") == 1.0


# ---- both layouts give the same updates ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name, optimizer", [("deit3_small_patch16_224", "adamw"), ("cait_xxs24_224", "lamb")])
def test_unrolled_and_scanned_layouts_give_identical_updates(name, optimizer):
    unrolled, scanned = tiny(name), tiny(name, scan_layers=True)
    cfg = config(name=optimizer, layer_decay=0.7, layer_decay_convention="timm", grad_clip_norm=0.5,
                 warmup_steps=1, freeze=("blocks/1/.*", "patch_embed/.*"), learning_rate=0.1)
    params_u = random_like(nnx.state(unrolled, nnx.Param), 10)
    grads_u = [random_like(params_u, seed) for seed in range(3)]

    stack = jax.jit(stack_blocks)

    def to_scanned(tree):  # the same numbers in the scanned layout's nnx.State
        state = nnx.state(scanned, nnx.Param)
        nnx.replace_by_pure_dict(state, jax.tree.map(np.asarray, stack(nnx.to_pure_dict(tree))))
        return state

    params_s, grads_s = to_scanned(params_u), [to_scanned(g) for g in grads_u]

    updates_u = run_steps(optim.build(cfg, unrolled, total_steps=10), params_u, grads_u)
    updates_s = run_steps(optim.build(cfg, scanned, total_steps=10), params_s, grads_s)
    for step, (u, s) in enumerate(zip(updates_u, updates_s)):
        expected = stack(nnx.to_pure_dict(u))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8,
                                                            err_msg=f"step {step}"), expected, nnx.to_pure_dict(s))
    last = nnx.to_pure_dict(updates_s[-1])
    assert not np.any(np.asarray(last["blocks"]["attn"]["qkv"]["kernel"][1]))   # frozen layer of a stacked param
    assert np.all(np.asarray(last["blocks"]["attn"]["qkv"]["kernel"][0]) != 0)  # its neighbours train


def test_partition_has_two_labels_and_layer_decay_is_a_multiplier_in_both_layouts():
    for scan in (False, True):
        bundle = optim.build(config(layer_decay=0.7, freeze=("cls_token",)), tiny(scan_layers=scan), total_steps=5)
        labels = nnx.to_pure_dict(bundle.labels)
        assert set(jax.tree.leaves(labels)) == {"trainable", "frozen"}
        assert labels["cls_token"] == "frozen" and labels["head"]["kernel"] == "trainable"
        # One base optimizer for every trainable parameter, whatever the number of layer groups: Adam's mu and nu
        # per trainable leaf plus two step counts (Adam's and the schedule's).
        params = nnx.state(tiny(scan_layers=scan), nnx.Param)
        state = jax.eval_shape(bundle.tx.init, params)
        trainable_leaves = len(jax.tree.leaves(params)) - 1
        assert len(jax.tree.leaves(state)) == 2 * trainable_leaves + 2


# ---- freezing ----------------------------------------------------------------------------------------------

def test_frozen_params_get_zero_updates_and_no_optimizer_state():
    model = tiny()
    bundle = optim.build(config(freeze=("(?!head/).*",)), model, total_steps=5)  # linear probe
    params = random_like(nnx.state(model, nnx.Param), 0)
    (update,) = run_steps(bundle, params, [random_like(params, 0)])
    for name, u in flat(update).items():
        assert np.any(u) if name.startswith("head/") else not np.any(u), name
    state = jax.eval_shape(bundle.tx.init, params)
    head = model.head.kernel.size + model.head.bias.size
    state_floats = sum(x.size for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating))
    assert state_floats == 2 * head  # Adam's mu and nu for the head only


def test_sgd_is_torch_sgd_with_l2_and_momentum():
    model = tiny()
    lr, wd, mom = 0.1, 0.01, 0.9
    bundle = optim.build(config(name="sgd", learning_rate=lr, weight_decay=wd, momentum=mom, schedule="constant",
                                grad_clip_norm=0.0, freeze=("(?!head/).*",)), model, total_steps=5)
    params = random_like(nnx.state(model, nnx.Param), 0)
    grads = [random_like(params, 1), random_like(params, 2)]
    ours = [flat(u) for u in run_steps(bundle, params, grads)]
    w, g1, g2 = (flat(t)["head/kernel"].astype(np.float64) for t in (params, *grads))
    buf = g1 + wd * w                                   # torch: d = g + wd·w ; buf = d (first step)
    step1 = -lr * buf
    buf = mom * buf + g2 + wd * (w + step1)             # buf = m·buf + d
    np.testing.assert_allclose(ours[0]["head/kernel"], step1, rtol=1e-5)
    np.testing.assert_allclose(ours[1]["head/kernel"], -lr * buf, rtol=1e-5)
    assert flat(bundle.trainable_mask)["head/bias"] and not flat(bundle.trainable_mask)["norm/scale"]


def test_freeze_regex_matching_nothing_is_named():
    with pytest.raises(ValueError, match=r"freeze.*'blocks/attn/.\*'.*blocks/0/"):
        optim.build(config(freeze=("blocks/attn/.*",)), tiny(scan_layers=True), total_steps=5)


def test_freeze_names_use_unrolled_paths_in_both_layouts():
    for scan in (False, True):
        mask = nnx.to_pure_dict(optim.trainable_mask(tiny(scan_layers=scan), ["blocks/0/.*", "cls_token"]))
        blocks = mask["blocks"]
        qkv = blocks["attn"]["qkv"]["kernel"] if scan else [blocks[i]["attn"]["qkv"]["kernel"] for i in range(2)]
        assert list(qkv) == [False, True]
        assert mask["cls_token"] is False and mask["pos_embed"] is True


# ---- schedules ---------------------------------------------------------------------------------------------

def test_cosine_schedule_warms_up_then_decays_to_end():
    s = optim.make_schedule(config(learning_rate=1.0, warmup_steps=10, end_learning_rate=0.1), 110)
    np.testing.assert_allclose([s(0), s(5), s(10), s(60), s(110)], [0.0, 0.5, 1.0, 0.55, 0.1], atol=1e-6)


def test_linear_and_constant_schedules():
    lin = optim.make_schedule(config(schedule="linear", learning_rate=1.0, warmup_steps=0), 100)
    np.testing.assert_allclose([lin(0), lin(50), lin(100)], [1.0, 0.5, 0.0], atol=1e-6)
    const = optim.make_schedule(config(schedule="constant", learning_rate=0.3, warmup_steps=3), 3)
    np.testing.assert_allclose([const(0), const(3), const(1000)], [0.0, 0.3, 0.3], atol=1e-7)


# ---- bad configs -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (dict(layer_decay=0.0), "optim.layer_decay=0.0"),
    (dict(layer_decay=1.2), "optim.layer_decay=1.2"),
    (dict(name="adam"), "optim.name='adam'"),
    (dict(schedule="step"), "optim.schedule='step'"),
    (dict(layer_decay_convention="beit"), "optim.layer_decay_convention='beit'"),
    (dict(sam_rho=-0.05), "optim.sam_rho=-0.05"),
    (dict(sam_adaptive=True), "sam_adaptive"),
    (dict(accum_steps=0), "optim.accum_steps=0"),
    (dict(learning_rate=0.0), "optim.learning_rate=0.0"),
    (dict(warmup_steps=5), "optim.warmup_steps=5"),
    (dict(freeze=("nothing/.*",)), "'nothing/.\\*'"),
    (dict(freeze=("blocks/[",)), "does not compile"),
])
def test_bad_config_raises_value_error_naming_the_option(overrides, message):
    with pytest.raises(ValueError, match=message):
        optim.build(config(**overrides), tiny(), total_steps=5)


def test_unknown_config_field_is_rejected():
    cfg = config()
    cfg.layer_deacy = 0.65
    with pytest.raises(ValueError, match="layer_deacy"):
        optim.build(cfg, tiny(), total_steps=5)
