"""What each parameter is, carried on the parameter: its role and its logical axes (``nnx.Variable`` metadata).

Every ``nnx.Param`` of the models is created with two metadata fields, set where the parameter is made:

``role``          what the parameter is; it decides how the parameter trains:

                  ==============  ==========================================================  ============
                  role            parameters                                                  weight decay
                  ==============  ==========================================================  ============
                  ``weight``      Dense and Conv kernels                                      yes
                  ``adapter``     LoRA's A and B                                              yes
                  ``bias``        Dense, Conv and LayerNorm biases                            no
                  ``norm``        LayerNorm scales                                            no
                  ``layerscale``  LayerScale's λ ∈ R^D (``x + diag(λ) f(LN(x))``)            no
                  ``gate``        a scalar branch multiplier α (scalar, ReZero, SkipInit)     no
                  ``token``       the class token, MAE's mask token                           no
                  ``position``    position embeddings                                         no
                  ==============  ==========================================================  ============

                  ASAM's normalisation ``T_w = |w| + η`` applies to ``weight`` and ``norm`` (the tensors PyTorch
                  calls ``weight``).

``logical_axes``  one logical axis name (or ``None``) per dimension, MaxText-style: ``embed`` (the model width),
                  ``heads`` (attention heads × head dim), ``mlp`` (the MLP's hidden units), ``classes``, and
                  ``layers``, the leading axis of a scanned stack (``models.stack``). ``train.sharding`` maps the
                  names to mesh axes with the config's sharding rules.

The weight-decay mask, ASAM, the sharding, the optimizer-state sharding and the timm export read these fields (the
diagnostics ask each block for its ``branch_scales()``), never a parameter's name: a parameter renamed or a layer
added keeps its treatment, and a parameter made without a role is an error where the mask is built."""
from __future__ import annotations

from typing import Any, Callable

import jax
from flax import nnx

ROLES = ("weight", "adapter", "bias", "norm", "layerscale", "gate", "token", "position")
DECAYED_ROLES = ("weight", "adapter")
LAYER_AXIS = "layers"


def metadata(role: str, axes: tuple) -> dict[str, Any]:
    """The metadata of a parameter with ``role`` and logical ``axes`` (for ``kernel_metadata=`` and the like)."""
    if role not in ROLES:
        raise ValueError(f"role={role!r} is not one of {ROLES}")
    return {"role": role, "logical_axes": tuple(axes)}


def param(value: jax.Array, role: str, axes: tuple) -> nnx.Param:
    """``nnx.Param(value)`` carrying ``role`` and logical ``axes`` (one per dimension of ``value``)."""
    if len(axes) != value.ndim:
        raise ValueError(f"logical axes {axes} for a parameter of shape {value.shape}")
    return nnx.Param(value, **metadata(role, axes))


def is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def role(variable: nnx.Variable) -> str | None:
    return variable.get_metadata().get("role")


def logical_axes(variable: nnx.Variable) -> tuple | None:
    return variable.get_metadata().get("logical_axes")


def add_layer_axis(module: nnx.Module) -> None:
    """Prepend ``layers`` to the logical axes of every parameter of a stack built with ``nnx.vmap`` (each parameter
    gained a leading layer axis)."""
    for _, node in nnx.iter_graph(module):
        if is_variable(node) and logical_axes(node) is not None:
            node.set_metadata(logical_axes=(LAYER_AXIS,) + logical_axes(node))


def map_variables(fn: Callable[[tuple, nnx.Variable], Any], state) -> Any:
    """``fn(path, variable)`` for every Variable of an ``nnx.State``, each result in the Variable's place (the
    tree keeps the state's structure and metadata, so ``jax.tree.map(f, params, result)`` works)."""
    def visit(path, variable):
        if not is_variable(variable):
            raise TypeError(f"{jax.tree_util.keystr(path)}: expected an nnx.Variable (an nnx.State of the model's "
                            f"parameters, whose metadata says what each is), got {type(variable).__name__}")
        return variable.replace(fn(path, variable))

    return jax.tree_util.tree_map_with_path(visit, state, is_leaf=is_variable)
