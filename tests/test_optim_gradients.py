"""SAM / ASAM, gradient accumulation and the parameter EMA, on small closed-form problems."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layerscale_jax import optim
from layerscale_jax.layers.params import ROLES, param

A = {"w": jnp.array([1.0, 2.0, 3.0]), "b": jnp.array([[0.5, -1.0]])}


def quadratic(params, offset=0.0):
    """L = ½ Σ a·w² + offset, ∇L = a·w; aux echoes the params' sum so we can see where it was evaluated."""
    loss = sum(0.5 * jnp.sum(A[k] * params[k] ** 2) for k in params) + offset
    aux = {"sum": sum(jnp.sum(p) for p in params.values())}
    return (loss, aux), {k: A[k] * params[k] for k in params}


PARAMS = {"w": jnp.array([0.3, -0.2, 0.1]), "b": jnp.array([[1.0, 2.0]])}


def global_norm(tree):
    return np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(tree)))


def test_sam_gradient_is_taken_at_the_perturbed_point_and_loss_at_the_original():
    rho = 0.05
    (loss, aux), grads = jax.jit(lambda p: optim.sam_gradients(quadratic, p, 1.0, rho=rho))(PARAMS)
    (loss0, aux0), g = jax.jit(quadratic)(PARAMS, 1.0)
    norm = global_norm(g)
    for k in PARAMS:
        expected = A[k] * (PARAMS[k] + rho * g[k] / norm)
        np.testing.assert_allclose(grads[k], expected, rtol=1e-6)
    assert loss == loss0 and aux["sum"] == aux0["sum"]


def variables(values: dict, roles: dict) -> dict:
    """Parameters as the models make them: ``nnx.Param``s carrying their role (``layers.params``)."""
    return {k: param(v, roles[k], (None,) * v.ndim) for k, v in values.items()}


# A kernel and a bias (ASAM treats them differently), a zero in each; stored under names that say nothing, since the
# role, not the name, decides.
NAMED = variables({"first": jnp.array([0.3, -0.2, 0.0]), "second": jnp.array([[1.0, 0.0]])},
                  {"first": "weight", "second": "bias"})


def named_quadratic(params):
    """L = ½ Σ a·w² over a kernel and a bias; the gradient has the parameters' structure, as ``jax.grad``'s does."""
    a = {"first": A["w"], "second": A["b"]}
    loss = sum(0.5 * jnp.sum(a[k] * params[k][...] ** 2) for k in params)
    return (loss, {}), {k: params[k].replace(a[k] * params[k][...]) for k in params}


@pytest.mark.parametrize("eta", [0.01, 0.0, 0.3])
def test_asam_perturbs_kernels_by_abs_w_plus_eta_squared_and_biases_unscaled(eta):
    """Official ASAM (SamsungLabs/ASAM): T_w = |w| + η on 'weight' tensors, T_w = 1 on biases;
    ε = ρ T_w² g / ‖T_w g‖, written out by hand here."""
    rho = 0.5
    (_, _), grads = jax.jit(lambda p: optim.sam_gradients(named_quadratic, p, rho=rho, adaptive=True,
                                                          eta=eta))(NAMED)
    w = {k: np.asarray(v[...], np.float64) for k, v in NAMED.items()}
    a = {"first": np.array([1.0, 2.0, 3.0]), "second": np.array([[0.5, -1.0]])}
    g = {k: a[k] * w[k] for k in w}
    t = {"first": np.abs(w["first"]) + eta, "second": np.ones_like(w["second"])}
    norm = global_norm({k: t[k] * g[k] for k in g})
    for k in w:
        eps = rho * t[k] ** 2 * g[k] / norm
        np.testing.assert_allclose(grads[k][...], a[k] * (w[k] + eps), rtol=1e-6, atol=1e-12)


def test_asam_normalises_by_role_kernels_and_norm_scales_only():
    """T_w = |w| + η for the roles PyTorch calls ``weight`` (kernels, LayerNorm scales); 1 for every other role."""
    ones = jnp.array([2.0, -3.0])
    for role_name in ROLES:
        t = optim.gradients.asam_operator(param(ones, role_name, (None,)), 0.5)
        expected = [2.5, 3.5] if role_name in ("weight", "norm") else 1.0
        np.testing.assert_allclose(np.broadcast_to(t, (2,)), np.broadcast_to(expected, (2,)))
    with pytest.raises(ValueError, match="role"):
        optim.gradients.asam_operator(ones, 0.5)


def test_asam_eta_moves_a_weight_that_is_exactly_zero():
    """With η > 0 a zero kernel entry (e.g. a zero-initialised gate) is perturbed along its gradient; with η = 0 not."""
    params = variables({"kernel": jnp.array([0.0, 1.0])}, {"kernel": "weight"})

    def loss_and_grad(p):          # L = Σ (w − c)², gradient non-zero at w = 0; ∇ at the perturbed point reveals ε
        c = jnp.array([1.0, 0.5])
        w = p["kernel"]
        return (jnp.sum((w[...] - c) ** 2), {}), {"kernel": w.replace(2.0 * (w[...] - c))}

    for eta, moved in ((0.01, True), (0.0, False)):
        (_, _), grads = optim.sam_gradients(loss_and_grad, params, rho=0.1, adaptive=True, eta=eta)
        assert (float(grads["kernel"][...][0]) != -2.0) is moved


def test_negative_sam_eta_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="sam_eta=-0.1"):
        optim.sam_gradients(quadratic, PARAMS, rho=0.1, adaptive=True, eta=-0.1)


def test_sam_with_zero_rho_is_the_plain_gradient_and_jits():
    sam = jax.jit(lambda p: optim.sam_gradients(quadratic, p, rho=0.0))
    (_, _), grads = sam(PARAMS)
    jax.tree.map(np.testing.assert_allclose, grads, quadratic(PARAMS)[1])


def test_sam_leaves_frozen_params_unperturbed():
    rho = 0.1
    sam = jax.jit(lambda p: optim.sam_gradients(quadratic, p, rho=rho, trainable={"w": True, "b": False}))
    (_, _), grads = sam(PARAMS)
    g = jax.jit(quadratic)(PARAMS)[1]
    np.testing.assert_allclose(grads["b"], g["b"])
    np.testing.assert_allclose(grads["w"], A["w"] * (PARAMS["w"] + rho * g["w"] / global_norm(g["w"])), rtol=1e-6)


def test_negative_rho_is_rejected():
    with pytest.raises(ValueError, match="sam_rho=-0.1"):
        optim.sam_gradients(quadratic, PARAMS, rho=-0.1)


# ---- accumulation ------------------------------------------------------------------------------------------

def regression(params, batch):
    """Mean squared error of a linear model; aux carries the mean prediction and an integer count."""
    def loss_fn(p):
        pred = batch["x"] @ p["w"] + p["b"]
        return jnp.mean((pred - batch["y"]) ** 2), {"pred": jnp.mean(pred), "n": jnp.sum(batch["y"] > 0)}
    return jax.value_and_grad(loss_fn, has_aux=True)(params)


def data(n=12):
    rng = np.random.default_rng(0)
    return ({"w": jnp.asarray(rng.standard_normal((3,)), jnp.float32), "b": jnp.float32(0.5)},
            {"x": jnp.asarray(rng.standard_normal((n, 3)), jnp.float32),
             "y": jnp.asarray(rng.standard_normal((n,)), jnp.float32)})


@pytest.mark.parametrize("k", [2, 3, 4])
def test_accumulated_gradient_equals_full_batch_gradient(k):
    params, batch = data()
    (loss, aux), grads = jax.jit(lambda p, b: optim.accumulate_gradients(regression, p, b, k))(params, batch)
    (loss_full, aux_full), grads_full = jax.jit(regression)(params, batch)
    np.testing.assert_allclose(loss, loss_full, rtol=1e-5)
    np.testing.assert_allclose(aux["pred"], aux_full["pred"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(aux["n"] * k, aux_full["n"])  # the mean over micro-batches of the per-batch count
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, grads_full)


def test_each_micro_batch_gets_its_own_key():
    params, batch = data(4)

    def noisy(p, b, key):
        return (jnp.float32(0), {"u": jax.random.uniform(key)}), p

    key = jax.random.key(3)
    (_, aux), _ = jax.jit(lambda p, b, k: optim.accumulate_gradients(noisy, p, b, 2, key=k))(params, batch, key)
    draw = jax.jit(jax.vmap(lambda i, k: jax.random.uniform(jax.random.fold_in(k, i)), in_axes=(0, None)))
    expected = np.mean(draw(jnp.arange(2), key))
    np.testing.assert_allclose(aux["u"], expected, rtol=1e-6)


def test_micro_batches_that_do_not_divide_the_batch_are_rejected():
    params, batch = data(10)
    with pytest.raises(ValueError, match="accum_steps=4 does not divide the batch size 10"):
        optim.accumulate_gradients(regression, params, batch, 4)
    with pytest.raises(ValueError, match="accum_steps=0"):
        optim.accumulate_gradients(regression, params, batch, 0)


# ---- EMA ---------------------------------------------------------------------------------------------------

def test_ema_update_moves_towards_params_and_keeps_dtype():
    ema = {"a": jnp.zeros(2, jnp.bfloat16), "b": jnp.ones(3)}
    new = optim.ema_update(ema, {"a": jnp.ones(2, jnp.bfloat16), "b": jnp.zeros(3)}, 0.75)
    np.testing.assert_allclose(np.asarray(new["a"], np.float32), 0.25)
    np.testing.assert_allclose(new["b"], 0.75)
    assert new["a"].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="ema_decay=1.5"):
        optim.ema_update(ema, ema, 1.5)


def test_sam_with_accumulation_is_m_sharpness_per_micro_batch():
    """SAM inside accumulation (as the train step composes them): each micro-batch is perturbed by its own ε, i.e.
    m-sharpness with m = batch / k (Foret et al. §4.1), checked against a NumPy least-squares computation."""
    from layerscale_jax.optim.gradients import accumulate_gradients, sam_gradients
    rng = np.random.default_rng(0)
    x, y, w = rng.normal(size=(8, 3)), rng.normal(size=8), rng.normal(size=3)
    rho, k = 0.3, 2

    def loss_and_grad(params, batch):
        return jax.value_and_grad(lambda p: (0.5 * jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2), ()),
                                  has_aux=True)(params)

    def np_grad(w_, xs, ys):
        return xs.T @ (xs @ w_ - ys) / len(ys)

    def np_sam(xs, ys):
        g = np_grad(w, xs, ys)
        return np_grad(w + rho * g / np.linalg.norm(g), xs, ys)

    micro = [(x[i::k], y[i::k]) for i in range(k)]            # accumulate_gradients' strided split
    expected = np.mean([np_sam(xs, ys) for xs, ys in micro], axis=0)
    _, grads = accumulate_gradients(lambda p, b: sam_gradients(loss_and_grad, p, b, rho=rho),
                                    {"w": jnp.asarray(w)}, {"x": jnp.asarray(x), "y": jnp.asarray(y)}, k)
    np.testing.assert_allclose(grads["w"], expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(grads["w"], np_sam(x, y), rtol=1e-3)   # not one ε from the whole batch
