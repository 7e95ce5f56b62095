"""``build(config, model, total_steps=...)``: the optax transformation for a model, with layer-wise LR decay,
weight-decay and freeze masks, in either block layout.

The update, for a trainable parameter ``w`` in layer group ``i`` with multiplier ``s_i = decay ** (L_max − i)``
(BEiT, Bao et al. 2021; MAE, He et al. 2021):

    g  ← clip_by_global_norm(g, grad_clip_norm)        (over the trainable parameters)
    u  ← base(g)                                        (Adam moments / LAMB / SGD momentum)
    u  ← u + wd · w                                      (decoupled, only where ``weight_decay_mask`` is true)
    Δw = −lr(t) · s_i · u                               (torch AdamW: ``w ← w − lr·s·(m̂/(√v̂+eps) + wd·w)``)

Structure — ``optax.partition`` (``multi_transform``) with two labels, then a multiplier tree:

    chain(zero_frozen,                                   (only with optim.freeze: frozen gradients are
                                                          zeroed, so they stay out of the clipping norm)
          clip_by_global_norm,
          partition({"trainable": chain(base, scale_by_learning_rate(lr), scale_by_multiplier(s)),
                     "frozen":    set_to_zero()}))        (frozen params: zero updates, no optimizer state)

``s`` is a static tree of numpy multipliers built once from the model: a float per parameter (its group's
``s_i``; parameters at 1.0 are not multiplied at all), or a ``(depth,)`` vector along the leading layer axis of a
parameter stacked for ``jax.lax.scan`` (``s_i`` for layer i, 0 for a frozen layer). The two layouts therefore give
the same updates for the same weights and gradients.

Why one base optimizer and a multiplier instead of one ``optax.partition`` label per layer group (the usual way to
write layer decay in optax): ``optax.partition`` wraps each label's chain in ``optax.masked``, whose state mirrors
the *whole* parameter tree with an ``optax.MaskedNode`` at every leaf outside the label. With one label per group the
optimizer state has ``O(groups × leaves)`` pytree nodes — with unrolled layers both grow with depth (8.9k nodes at
depth 12, 122k at depth 48 for 1.4k arrays) — and every call of the jitted step flattens and rebuilds that tree on
the host, a cost quadratic in depth while the compiled program stays about the same size. The multiplier
gives the same numbers, because every base transformation here acts per parameter tensor before the learning rate
is applied:

    Adam / AdamW:  u = m̂ / (√v̂ + eps) + wd · w        elementwise in (g, w) — a per-tensor factor s_i commutes
    SGD:           u = trace(g + wd · w)                elementwise
    LAMB:          u ← u · ‖w‖ / ‖u‖                    per tensor (per layer for a stacked parameter), computed
                                                        before ``s_i`` is applied, exactly as within one group

and the step count, hence the bias correction and ``lr(t)``, is the same in every group. Global-norm clipping
happens before the partition in both designs. The cost is one base optimizer over the parameter tree plus at
most one multiply per leaf, which XLA fuses into the update, and a state with two step counts besides the moments:
linear in depth and as fast as ``optax.chain(optax.clip_by_global_norm(c), optax.adamw(...))`` (measured by
``python -m layerscale_jax.bench optimizer``; ``tests/test_optim_cost.py`` checks that the state's tree and the
compiled update's operation count grow with the leaves, not with groups × leaves).
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import numpy as np
import optax
from flax import nnx

from layerscale_jax.models import groups
from layerscale_jax.optim import transforms
from layerscale_jax.optim.config import OptimSettings, validate_config
from layerscale_jax.optim.param_rules import layer_decay_scales, trainable_mask, weight_decay_mask
from layerscale_jax.optim.schedules import make_schedule

TRAINABLE = "trainable"
FROZEN = "frozen"


@dataclasses.dataclass(frozen=True)
class GroupRow:
    """One line of the layer table: a layer group, its LR multiplier and its parameter counts."""
    group: int
    lr_scale: float
    params: int
    trainable: int
    decayed: int
    members: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class OptimizerBundle:
    """What ``build`` returns.

    tx: ``optax.GradientTransformation`` over the pytree ``nnx.state(model, nnx.Param)`` (or its pure dict);
        call ``tx.update(grads, opt_state, params)`` — weight decay and LAMB need ``params``.
    schedule: ``step → peak learning rate`` (before layer scales), for logging.
    lr_scales, wd_mask, trainable_mask, group_ids, labels: trees shaped like ``nnx.state(model, nnx.Param)``
        (``(depth,)`` arrays for stacked parameters; ``labels`` are the ``optax.partition`` labels,
        ``"trainable"`` or ``"frozen"``; layer decay is the ``lr_scales`` multiplier, not a label).
    rows: the per-group table, also rendered by ``table()``.
    """
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    lr_scales: Any
    wd_mask: Any
    trainable_mask: Any
    group_ids: Any
    labels: Any
    rows: tuple[GroupRow, ...]
    config: OptimSettings

    def table(self) -> str:
        """The per-layer table the trainer logs at start: group, LR multiplier, parameter counts, members."""
        c = self.config
        total = sum(r.params for r in self.rows)
        trainable = sum(r.trainable for r in self.rows)
        decayed = sum(r.decayed for r in self.rows)
        layer_decay = "no layer decay" if c.layer_decay == 1 else (
            f"layer decay {c.layer_decay:g} ({c.layer_decay_convention}"
            f"{f', min scale {c.layer_decay_min_scale:g}' if c.layer_decay_min_scale else ''})")
        lines = [f"optimizer {c.name}, lr {c.learning_rate:g} ({c.schedule}, warmup {c.warmup_steps}), "
                 f"weight decay {c.weight_decay:g}, {layer_decay}",
                 f"{len(self.rows)} layer groups, {total:,} params, {trainable:,} trainable, "
                 f"{decayed:,} with weight decay",
                 f"{'group':>5}  {'lr scale':>10}  {'params':>12}  {'trainable':>12}  members"]
        for r in self.rows:
            members = ", ".join(r.members)
            lines.append(f"{r.group:>5}  {r.lr_scale:>10.4g}  {r.params:>12,}  {r.trainable:>12,}  {members}")
        return "\n".join(lines)


def _table(tree) -> dict[tuple, Any]:
    """A params-shaped tree → ``{path: leaf}``."""
    flat: dict[tuple, Any] = {}
    groups.map_params(lambda path, leaf: flat.__setitem__(path, leaf), tree)
    return flat


def _base_optimizer(config, schedule, decays: dict, stacked: dict) -> optax.GradientTransformation:
    wd = float(config.weight_decay)
    decay = [transforms.add_weight_decay(wd, decays)] if wd > 0 else []
    if config.name == "adamw":
        parts = [optax.scale_by_adam(config.b1, config.b2, config.eps), *decay]
    elif config.name == "lamb":
        parts = [optax.scale_by_adam(config.b1, config.b2, config.eps), *decay,
                 transforms.scale_by_trust_ratio(decays, stacked)]
    else:  # sgd: torch.optim.SGD — L2 into the gradient, then heavy-ball momentum
        parts = [*decay, *([optax.trace(decay=config.momentum)] if config.momentum > 0 else [])]
    return optax.chain(*parts, optax.scale_by_learning_rate(schedule))


def _member(path: tuple) -> str:
    if len(path) > 1 and isinstance(path[1], int):
        return f"{path[0]}.{path[1]}"
    return str(path[0])


def _rows(model, ids: dict, scales: dict, decays: dict, trainable: dict) -> tuple[GroupRow, ...]:
    shapes: dict[tuple, tuple] = {}
    groups.map_params(lambda path, x: shapes.__setitem__(path, tuple(x.shape)), nnx.state(model, nnx.Param))
    acc = defaultdict(lambda: {"scale": None, "params": 0, "trainable": 0, "decayed": 0, "members": []})
    for path, shape in shapes.items():
        layers = groups.layer_paths(model, path)
        per_layer = int(np.prod(shape[1:] if groups.is_stacked(model, path) else shape))
        for k, layer_path in enumerate(layers):
            index = k if groups.is_stacked(model, path) else ()
            gid = int(np.asarray(ids[path])[index])
            row = acc[gid]
            row["scale"] = float(np.asarray(scales[path])[index])
            row["params"] += per_layer
            row["trainable"] += per_layer * bool(np.asarray(trainable[path])[index])
            row["decayed"] += per_layer * bool(decays[path])
            if _member(layer_path) not in row["members"]:
                row["members"].append(_member(layer_path))
    return tuple(GroupRow(g, r["scale"], r["params"], r["trainable"], r["decayed"], tuple(sorted(r["members"])))
                 for g, r in sorted(acc.items()))


def build(config: OptimSettings, model: nnx.Module, *, total_steps: int) -> OptimizerBundle:
    """The optimizer for ``model`` (concrete or abstract) from an optimizer section (``OptimSettings``; a
    ``ConfigDict`` such as ``default_config()`` is made one)."""
    config = validate_config(config, total_steps)
    schedule = make_schedule(config, total_steps)
    convention = config.layer_decay_convention
    group_ids = groups.layer_group_ids(model, convention)
    lr_scales = layer_decay_scales(model, config.layer_decay, convention, config.layer_decay_min_scale)
    wd_mask = weight_decay_mask(model)
    train_mask = trainable_mask(model, config.freeze)

    ids, scales, decays, trainable = (_table(t) for t in (group_ids, lr_scales, wd_mask, train_mask))
    stacked = {path: groups.is_stacked(model, path) for path in ids}

    labels_by_path: dict[tuple, str] = {}
    multipliers: dict[tuple, Any] = {}
    for path in ids:
        keep = np.asarray(trainable[path])
        if not keep.any():
            labels_by_path[path] = FROZEN
            continue
        labels_by_path[path] = TRAINABLE
        multiplier = np.asarray(scales[path], np.float32) * keep.astype(np.float32)
        multipliers[path] = multiplier if stacked[path] else float(multiplier)

    trainable_chain = [_base_optimizer(config, schedule, decays, stacked)]
    if any(np.any(m != 1.0) for m in multipliers.values()):
        trainable_chain.append(transforms.scale_by_multiplier(multipliers))
    partition = {TRAINABLE: optax.chain(*trainable_chain), FROZEN: optax.set_to_zero()}

    def param_labels(params):
        return groups.map_params(lambda path, _: transforms.lookup(labels_by_path, path, "optax.partition"),
                                 params)

    parts = []
    if any(not np.asarray(v).all() for v in trainable.values()):
        parts.append(transforms.zero_frozen(trainable))  # frozen gradients take no part in the clipping norm
    if config.grad_clip_norm > 0:
        parts.append(optax.clip_by_global_norm(float(config.grad_clip_norm)))
    parts.append(optax.partition(partition, param_labels))
    tx = optax.chain(*parts)

    labels = groups.map_params(lambda path, _: labels_by_path[path], group_ids)
    rows = _rows(model, ids, scales, decays, trainable)
    return OptimizerBundle(tx=tx, schedule=schedule, lr_scales=lr_scales, wd_mask=wd_mask,
                           trainable_mask=train_mask, group_ids=group_ids, labels=labels, rows=rows, config=config)
