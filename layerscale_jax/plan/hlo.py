"""What a compiled program communicates, read from its HLO text (``compiled.as_text()``): each collective, the
arrays it produces and the collective it implements (TPU's collective matmuls and all-reduce-scatter fusions)."""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Sequence

COLLECTIVE_OPS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\(?[^=]*?\)?) ("
                         + "|".join(COLLECTIVE_OPS) + r"|fusion)(-start)?\(")
_COMMENT = re.compile(r"/\*.*?\*/")             # e.g. /*index=5*/ inside a long tuple shape
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_CHANNEL = re.compile(r"channel_id=(\d+)")
# XLA's TPU compiler turns an all-gather or reduce-scatter that feeds or follows a matmul into a loop of
# collective-permutes overlapped with partial matmuls ("windowed einsum", a collective matmul); the loop's body
# computation names which of the two it replaces.
_COLLECTIVE_MATMUL = {"windowed_dot_general_body_ag": "all-gather", "windowed_dot_general_body_rs": "reduce-scatter"}
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8}


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program: its HLO op, the shapes of the arrays it produces (per device), and
    ``kind``, what it does — its op, or for TPU forms the collective it implements: an all-gather or reduce-scatter
    done as a collective-permute loop (``form="collective matmul"``), a reduce-scatter fused with its reduction
    (``form="all-reduce-scatter fusion"``); ``form="async"`` for a ``-start``/``-done`` pair."""
    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    kind: str = ""
    form: str = ""

    def __post_init__(self):
        if not self.kind:
            object.__setattr__(self, "kind", self.op)

    @property
    def largest(self) -> int:
        """Elements of the largest array it produces."""
        return max((math.prod(s) for s in self.shapes), default=0)

    @property
    def bytes(self) -> int:
        return sum(math.prod(s) * _BYTES.get(d, 4) for s, d in zip(self.shapes, self.dtypes))


def collectives(compiled_hlo: str) -> list[Collective]:
    """The collectives in a compiled program's HLO text (``jax.jit(f).lower(...).compile().as_text()``), each
    instruction once: an async pair by its ``-start`` (counting the arrays it produces, not the operands and
    context it also carries), a collective cloned into several fused computations (TPU's async collective fusions)
    once by its channel. A loop's body counts once, however often it runs."""
    found, seen, computation = [], set(), ""
    for raw in compiled_hlo.splitlines():
        if raw and not raw[0].isspace() and raw.rstrip().endswith("{"):
            computation = raw.split()[1 if raw.startswith("ENTRY") else 0].lstrip("%")
            continue
        line = _COMMENT.sub("", raw)
        match = _COLLECTIVE.search(line)
        if not match:
            continue
        name, shape, op, start = match.groups()
        form = "async" if start else ""
        if op == "fusion":
            if not name.startswith("all-reduce-scatter"):
                continue
            op, form = "reduce-scatter", "all-reduce-scatter fusion"
        channel = _CHANNEL.search(line)
        if channel:
            key = (op, channel.group(1))
            if key in seen:
                continue
            seen.add(key)
        arrays = [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in _ARRAY.findall(shape)]
        if start:                       # (operands..., results..., u32[] contexts): keep the results
            arrays = [a for a in arrays if a[1]] or arrays
            if op in ("all-gather", "collective-permute") and len(arrays) > 1:
                arrays = arrays[len(arrays) // 2:]
        kind = op
        body = next((k for k in _COLLECTIVE_MATMUL if k in computation), None)
        if op == "collective-permute" and body:
            kind, form = _COLLECTIVE_MATMUL[body], "collective matmul"
        found.append(Collective(op, tuple(s for _, s in arrays), tuple(d for d, _ in arrays), kind, form))
    return found


def collectives_by_kind(found: Sequence[Collective]) -> dict[str, dict[str, int]]:
    """``{kind: {"count", "bytes"}}`` over ``found`` (``collectives``), kinds sorted by name."""
    table: dict[str, dict[str, int]] = {}
    for c in found:
        row = table.setdefault(c.kind, {"count": 0, "bytes": 0})
        row["count"] += 1
        row["bytes"] += c.bytes
    return dict(sorted(table.items()))
