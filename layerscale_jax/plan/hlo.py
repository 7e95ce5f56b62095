"""What a compiled program computes, moves and communicates per step, read from its HLO text (``compiled.as_text()``).

A module is parsed into its computations and instructions, and each computation gets the number of times it runs per
step: 1 for the entry, a ``while`` body its trip count times its caller's (XLA's ``known_trip_count`` where the
compiler wrote it, else read from the loop condition ``i < N`` and the induction variable's initial constant, which
is how libtpu leaves a ``scan``), a fusion's computation its caller's. Per step and per device, then:

    FLOPs       2 · output elements · contracted elements of every ``dot``, ``convolution`` (taps over a base-dilated
                input divided by the dilation: the zeros it inserts are not work) and cuBLAS GEMM custom call; the
                elementwise work is left out
    HBM bytes   every instruction outside fusions reads its operands and writes its result once; a fusion reads only
                the slices its ``dynamic-slice``s take of an operand (a scan reading layer i of stacked weights) and
                writes only the update of a ``dynamic-update-slice`` root (in place); tuples, bitcasts, parameters,
                loops and collectives move nothing here
    collectives each collective once (an async pair by its ``-start``; a collective cloned into several fused
                computations by its channel), with the arrays it produces, its replica groups and its trip count;
                libtpu's cross-slice reductions are host-transfer ``send``s marked ``_xla_megascale_transfer_type``

This is a count, not a simulation: it reads what the compiler wrote, so it follows its fusion and rematerialisation
decisions; it cannot see caches, on-chip buffers (TPU's VMEM) or the overlap the scheduler achieves.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Sequence

import numpy as np

COLLECTIVE_OPS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%?([\w.\-]+) = ")
_COMMENT = re.compile(r"/\*.*?\*/")             # e.g. /*index=5*/ inside a long tuple shape
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_CHANNEL = re.compile(r"channel_id=(\d+)")
_NAME = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"\b(calls|to_apply|body|condition|branch_computations|true_computation|false_computation)="
                    r"(\{[^}]*\}|%[\w.\-]+)")
# XLA's TPU compiler turns an all-gather or reduce-scatter that feeds or follows a matmul into a loop of
# collective-permutes overlapped with partial matmuls ("windowed einsum", a collective matmul); the loop's body
# computation names which of the two it replaces.
_COLLECTIVE_MATMUL = {"windowed_dot_general_body_ag": "all-gather", "windowed_dot_general_body_rs": "reduce-scatter"}
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8, "token": 0, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
# Instructions that move no HBM bytes of their own: views, control flow (their computations are counted), and the
# collectives (counted as communication).
_NO_MEMORY = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
              "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "copy-done", "send",
              "send-done", "recv", "recv-done", "async-done", "async-update"}
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")


def arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """``(dtype, dims)`` of every array in an HLO type, e.g. ``(f32[8,16]{1,0}, u32[])``."""
    return [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in _ARRAY.findall(type_text)]


def type_bytes(type_text: str) -> int:
    return sum(math.prod(dims) * _BYTES.get(dtype, 4) for dtype, dims in arrays(type_text))


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text) - 1


@dataclasses.dataclass
class Instruction:
    name: str
    type: str                    # the result's type text
    opcode: str
    operands: tuple[str, ...]    # operand instruction names
    args: str                    # the text between the opcode's parentheses (a parameter's number, ...)
    attrs: str                   # the text after them
    computation: str
    root: bool = False


@dataclasses.dataclass
class Module:
    """A parsed HLO module: ``computations`` in text order (callees before callers), each a list of instructions."""
    computations: dict[str, list[Instruction]]
    entry: str
    num_partitions: int

    def __post_init__(self):
        self.by_name = {i.name: i for body in self.computations.values() for i in body}
        self.called_as: dict[str, str] = {}          # computation → "fused", "reducer" or "control"
        for body in self.computations.values():
            for instr in body:
                for attr, callee in self.calls(instr):
                    kind = ("fused" if instr.opcode == "fusion" else
                            "reducer" if attr == "to_apply" and instr.opcode != "call" else "control")
                    self.called_as.setdefault(callee, kind)

    @staticmethod
    def calls(instr: Instruction) -> list[tuple[str, str]]:
        return [(attr, name) for attr, target in _CALLS.findall(instr.attrs) for name in _NAME.findall(target)]

    def type_of(self, name: str) -> str:
        return self.by_name[name].type if name in self.by_name else ""


def parse(text: str) -> Module:
    """The computations and instructions of a module's HLO text (a fragment without headers counts as the entry)."""
    computations: dict[str, list[Instruction]] = {}
    current, entry, partitions = "", "", 1
    found = re.search(r"num_partitions=(\d+)", text)
    if found:
        partitions = int(found.group(1))
    for raw in text.splitlines():
        if raw and not raw[0].isspace() and raw.rstrip().endswith("{"):
            words = raw.split()
            current = words[1 if raw.startswith("ENTRY") else 0].lstrip("%")
            entry = current if raw.startswith("ENTRY") else entry
            computations.setdefault(current, [])
            continue
        match = _INSTRUCTION.match(raw)
        if not match:
            continue
        line = _COMMENT.sub("", raw)
        match = _INSTRUCTION.match(line)
        rest = line[match.end():]
        if rest.startswith("("):
            end = _closing(rest, 0)
            type_text, rest = rest[:end + 1], rest[end + 1:].lstrip()
        else:
            type_text, _, rest = rest.partition(" ")
        opcode = re.match(r"[\w\-]+", rest)
        if not opcode or rest[opcode.end():opcode.end() + 1] != "(":
            continue
        open_at = opcode.end()
        close_at = _closing(rest, open_at)
        args = rest[open_at + 1:close_at]
        computations.setdefault(current, []).append(Instruction(
            match.group(2), type_text, opcode.group(0), tuple(_NAME.findall(args)), args, rest[close_at + 1:],
            current, bool(match.group(1))))
    return Module(computations, entry or current, partitions)


# -- how often each computation runs ------------------------------------------------------------------------------

def _int_constants(module: Module, computation: str) -> list[int]:
    """Integer constants in a computation and the fusions it calls (a loop condition's bound)."""
    found = []
    for instr in module.computations.get(computation, []):
        if instr.opcode == "constant" and re.match(r"[su]\d+\[\]", instr.type):
            found.append(int(instr.args))
        for _, callee in module.calls(instr):
            found += _int_constants(module, callee)
    return found


def _directions(module: Module, computation: str) -> list[str]:
    out = []
    for instr in module.computations.get(computation, []):
        out += re.findall(r"direction=(\w+)", instr.attrs) if instr.opcode == "compare" else []
        for _, callee in module.calls(instr):
            out += _directions(module, callee)
    return out


def _initial_value(module: Module, loop: Instruction, condition: str) -> int:
    """The induction variable's initial value: the loop's init tuple element the condition reads, where it is a
    constant (or a copy of one); 0 otherwise."""
    index = next((re.search(r"index=(\d+)", i.attrs) for i in module.computations.get(condition, [])
                  if i.opcode == "get-tuple-element"), None)
    init = module.by_name.get(loop.operands[0]) if loop.operands else None
    if index is None or init is None or init.opcode != "tuple" or int(index.group(1)) >= len(init.operands):
        return 0
    value = module.by_name.get(init.operands[int(index.group(1))])
    while value is not None and value.opcode == "copy" and value.operands:
        value = module.by_name.get(value.operands[0])
    return int(value.args) if value is not None and value.opcode == "constant" and value.args.lstrip("-").isdigit() \
        else 0


def trip_count(module: Module, loop: Instruction) -> int | None:
    """How often a ``while`` runs its body: XLA's ``known_trip_count``, else the bound of a condition ``i < N``
    (``i <= N``: one more) from the initial value; None when the condition has another form."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attrs)
    if known:
        return int(known.group(1))
    condition = next((c for a, c in module.calls(loop) if a == "condition"), None)
    bounds, directions = _int_constants(module, condition), _directions(module, condition)
    if len(bounds) != 1 or len(directions) != 1 or directions[0] not in ("LT", "LE"):
        return None
    return max(bounds[0] - _initial_value(module, loop, condition) + (directions[0] == "LE"), 0)


def multipliers(module: Module) -> tuple[dict[str, float], list[str]]:
    """``({computation: runs per step}, [loops whose trip count could not be read (counted once)])``. The entry
    and computations nothing calls run once; a ``conditional``'s branches each count as run."""
    runs = {name: 0.0 for name in module.computations}
    called = {callee for body in module.computations.values() for i in body for _, callee in module.calls(i)}
    for name in runs:
        if name not in called:
            runs[name] = 1.0
    unknown = []
    for name in reversed(list(module.computations)):             # callers are printed after their callees
        for instr in module.computations[name]:
            factor = 1.0
            if instr.opcode == "while":
                trips = trip_count(module, instr)
                if trips is None:
                    unknown.append(instr.name)
                factor = 1.0 if trips is None else float(trips)
            for attr, callee in module.calls(instr):
                if callee in runs:
                    runs[callee] += runs[name] * (factor if attr in ("body", "condition") else 1.0)
    return runs, unknown


# -- FLOPs and HBM bytes ------------------------------------------------------------------------------------------

def _dims(type_text: str) -> tuple[int, ...]:
    found = arrays(type_text)
    return found[0][1] if found else ()


def _contracted(module: Module, instr: Instruction, dims_attr: str) -> int:
    lhs = _dims(module.type_of(instr.operands[0])) if instr.operands else ()
    found = re.search(dims_attr + r"=\{([\d,]*)\}", instr.attrs)
    return math.prod(lhs[int(d)] for d in found.group(1).split(",") if d) if found and lhs else 1


def instruction_flops(module: Module, instr: Instruction) -> float:
    """Matmul FLOPs of one execution of ``instr`` (0 for anything but a dot, convolution or GEMM call)."""
    if instr.opcode == "dot":
        return 2.0 * math.prod(_dims(instr.type)) * _contracted(module, instr, "lhs_contracting_dims")
    if instr.opcode == "convolution" and len(instr.operands) >= 2:
        labels = re.search(r"dim_labels=\w+_(\w+)->", instr.attrs)
        rhs = _dims(module.type_of(instr.operands[1]))
        if not labels or not rhs or "o" not in labels.group(1):
            return 0.0
        taps = math.prod(rhs) / rhs[labels.group(1).index("o")]
        dilation = re.search(r"lhs_dilate=([\dx]+)", instr.attrs)
        spread = math.prod(int(d) for d in dilation.group(1).split("x")) if dilation else 1
        return 2.0 * math.prod(_dims(instr.type)) * taps / spread
    if instr.opcode == "custom-call" and any(f'"{t}"' in instr.attrs for t in _GEMM_TARGETS):
        config = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', instr.attrs)
        lhs = _dims(module.type_of(instr.operands[0])) if instr.operands else ()
        contracted = math.prod(lhs[int(d)] for d in re.findall(r"\d+", config.group(1))) if config and lhs else 1
        return 2.0 * math.prod(_dims(instr.type)) * contracted
    return 0.0


def _users(body: list[Instruction]) -> dict[str, list[tuple[Instruction, int]]]:
    users: dict[str, list[tuple[Instruction, int]]] = {}
    for instr in body:
        for position, operand in enumerate(instr.operands):
            users.setdefault(operand, []).append((instr, position))
    return users


def _fused(module: Module, fusion: Instruction) -> list[Instruction]:
    callee = next((c for a, c in module.calls(fusion) if a == "calls"), None)
    return module.computations.get(callee, [])


def _read_bytes(module: Module, body: list[Instruction], name: str, full: int) -> int:
    """Bytes a fused computation reads of its parameter ``name`` (``full`` bytes in all): only the slices it takes
    (``dynamic-slice``, ``slice``, ``gather``), nothing of a buffer it updates in place or passes through to its
    output, what a nested fusion reads of it; all of it for any other use."""
    users = _users(body)
    pending, read = list(users.get(name, [])), 0
    while pending:
        user, position = pending.pop()
        if user.opcode == "bitcast":
            pending += users.get(user.name, [])
        elif user.opcode in ("dynamic-slice", "slice", "gather") and position == 0:
            read += type_bytes(user.type)
        elif (user.opcode == "dynamic-update-slice" and position == 0) or (user.opcode == "tuple" and user.root):
            continue
        elif user.opcode == "fusion":
            nested = _fused(module, user)
            param = next((i.name for i in nested if i.opcode == "parameter" and i.args == str(position)), None)
            read += full if param is None else _read_bytes(module, nested, param, full)
        else:
            return full
    return min(read, full)


def _written_bytes(module: Module, body: dict[str, Instruction], value: Instruction) -> int:
    """Bytes a fusion writes for one of its outputs: the update of an in-place ``dynamic-update-slice`` (also
    inside a nested fusion), nothing for an input passed through, else the output."""
    while value.opcode == "bitcast" and value.operands and value.operands[0] in body:
        value = body[value.operands[0]]
    if value.opcode == "parameter":
        return 0
    if value.opcode == "dynamic-update-slice" and len(value.operands) > 1:
        return type_bytes(module.type_of(value.operands[1]))
    if value.opcode == "fusion":
        nested = {i.name: i for i in _fused(module, value)}
        root = next((i for i in nested.values() if i.root), None)
        if root is not None and root.opcode != "tuple":
            return min(_written_bytes(module, nested, root), type_bytes(value.type))
    return type_bytes(value.type)


def instruction_bytes(module: Module, instr: Instruction) -> int:
    """HBM bytes one execution of ``instr`` (outside a fusion) reads and writes; see the module docstring."""
    if instr.opcode in _NO_MEMORY or instr.opcode.endswith(("-start", "-done")) and instr.opcode != "copy-start" \
            or instr.opcode in COLLECTIVE_OPS:
        return 0
    operands = [type_bytes(module.type_of(o)) for o in instr.operands]
    if instr.opcode == "copy-start":
        return 2 * (operands[0] if operands else 0)
    if instr.opcode == "dynamic-slice":
        return 2 * type_bytes(instr.type)
    if instr.opcode == "dynamic-update-slice" and len(operands) > 1:
        return 2 * operands[1]
    if instr.opcode != "fusion":
        return sum(operands) + type_bytes(instr.type)
    if instr.name.startswith(("all-reduce-scatter", "async-collective")):
        return 0                                 # a collective (TPU's fused forms): counted as communication
    body = _fused(module, instr)
    params = {int(i.args): i.name for i in body if i.opcode == "parameter" and i.args.isdigit()}
    read = sum(_read_bytes(module, body, params[k], size) if k in params else size for k, size in enumerate(operands))
    named = {i.name: i for i in body}
    root = next((i for i in body if i.root), None)
    if root is None:
        return read + type_bytes(instr.type)
    outputs = [named.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
    if any(o is None for o in outputs):
        return read + type_bytes(instr.type)
    return read + sum(_written_bytes(module, named, o) for o in outputs)


@dataclasses.dataclass(frozen=True)
class Work:
    """One step's work per device: matmul FLOPs and HBM bytes, loops counted by their trip counts."""
    flops: float
    hbm_bytes: float
    unknown_loops: tuple[str, ...] = ()


def step_work(module: Module | str) -> Work:
    """The FLOPs and HBM bytes of one run of the module's entry (see the module docstring)."""
    module = parse(module) if isinstance(module, str) else module
    runs, unknown = multipliers(module)
    flops = memory = 0.0
    for name, body in module.computations.items():
        kind = module.called_as.get(name, "control")
        if runs[name] == 0 or kind == "reducer":
            continue
        for instr in body:
            flops += runs[name] * instruction_flops(module, instr)
            if kind == "control":
                memory += runs[name] * instruction_bytes(module, instr)
    return Work(flops, memory, tuple(unknown))


# -- collectives --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program: its HLO op, the shapes of the arrays it produces (per device), and
    ``kind``, what it does — its op, or for TPU forms the collective it implements: an all-gather or reduce-scatter
    done as a collective-permute loop (``form="collective matmul"``), a reduce-scatter fused with its reduction
    (``form="all-reduce-scatter fusion"``), a cross-slice all-reduce done as host transfers
    (``form="megascale send"``), an all-gather done as an all-reduce of zero-padded shards
    (``form="zero-padded all-reduce"``: it moves what an all-reduce of the whole array moves); ``form="async"`` for
    a ``-start``/``-done`` pair. ``trips``: how often it runs per
    step (its loops' trip counts); ``groups``: the device groups it runs over (partition ids; the source → target
    pairs of a permute), empty where the program does not say (a megascale send)."""
    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    kind: str = ""
    form: str = ""
    trips: float = 1.0
    groups: tuple[tuple[int, ...], ...] = ()

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

    @property
    def group_size(self) -> int:
        return max((len(g) for g in self.groups), default=0)

    def link_bytes(self, group_size: int | None = None) -> float:
        """Bytes each device sends per run, by the ring algorithm over a group of ``p`` devices (Patarasuk & Yuan
        2009, "Bandwidth optimal all-reduce algorithms"): all-reduce 2(p−1)/p of the array (a reduce-scatter, then
        an all-gather), all-gather and all-to-all (p−1)/p of the result, reduce-scatter (p−1) × its shard, a
        permute its array once. ``p`` unknown: the array once (twice for an all-reduce)."""
        p = group_size or self.group_size
        algorithm = self.op if self.form == "zero-padded all-reduce" else self.kind
        if algorithm == "collective-permute" or self.form == "collective matmul":
            return float(self.bytes)
        if not p:
            return float(self.bytes) * (2 if algorithm == "all-reduce" else 1)
        if algorithm == "all-reduce":
            return 2.0 * (p - 1) / p * self.bytes
        if self.kind == "reduce-scatter":
            return float(p - 1) * self.bytes
        return (p - 1) / p * self.bytes


def replica_groups(attrs: str, num_partitions: int) -> tuple[tuple[int, ...], ...]:
    """The device groups of a collective's ``replica_groups`` (explicit ``{{0,1},{2,3}}``, iota ``[2,4]<=[8]`` or
    ``[2,4]<=[4,2]T(1,0)``, mesh ``mesh['a'=2,'b'=4] {'b'}``; empty: all devices) or ``source_target_pairs``."""
    pairs = re.search(r"source_target_pairs=\{((?:\{[\d,]*\},?)*)\}", attrs)
    if pairs:
        return tuple(tuple(int(x) for x in p.split(",") if x) for p in re.findall(r"\{([\d,]*)\}", pairs.group(1)))
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\](?: \{([^}]*)\})?", attrs)
    if mesh:
        axes = [(name, int(size)) for name, size in re.findall(r"'([^']+)'=(\d+)", mesh.group(1))]
        over = set(re.findall(r"'([^']+)'", mesh.group(2) or "")) or {a for a, _ in axes}
        ids = np.arange(math.prod(s for _, s in axes)).reshape([s for _, s in axes] or [1])
        moved = sorted(range(len(axes)), key=lambda i: axes[i][0] in over)      # the group's axes last
        size = math.prod(s for a, s in axes if a in over)
        return tuple(tuple(int(x) for x in g) for g in ids.transpose(moved).reshape(-1, size))
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
    if iota:
        shape = [int(x) for x in iota.group(1).split(",")]
        ids = np.arange(math.prod(int(x) for x in iota.group(2).split(","))).reshape(
            [int(x) for x in iota.group(2).split(",")])
        if iota.group(3):
            ids = ids.transpose([int(x) for x in iota.group(3).split(",")])
        return tuple(tuple(int(x) for x in g) for g in ids.reshape(shape[0], -1))
    explicit = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", attrs)
    if explicit and explicit.group(1).strip():
        return tuple(tuple(int(x) for x in g.split(",") if x) for g in re.findall(r"\{([\d,]*)\}", explicit.group(1)))
    return (tuple(range(num_partitions)),)


def _is_zero(module: Module, name: str, body: dict | None = None) -> bool:
    """Whether a value is all zeros: a zero constant, or a broadcast of one (through copies and bitcasts)."""
    i = (body or module.by_name).get(name)
    while i is not None and i.opcode in ("copy", "bitcast") and i.operands:
        i = (body or module.by_name).get(i.operands[0])
    if i is not None and i.opcode == "broadcast" and i.operands:
        return _is_zero(module, i.operands[0], body)
    try:
        return i is not None and i.opcode == "constant" and float(i.args) == 0.0
    except ValueError:
        return False


def zero_padded(module: Module, name: str) -> bool:
    """Whether a value is its shard written into a zero buffer (``dynamic-update-slice`` of zeros, fused or not):
    what libtpu all-reduces to gather a sharded array (the sum of the zero-padded shards is the whole)."""
    i = module.by_name.get(name)
    while i is not None and i.opcode in ("copy", "bitcast") and i.operands:
        i = module.by_name.get(i.operands[0])
    if i is None:
        return False
    if i.opcode == "dynamic-update-slice":
        return _is_zero(module, i.operands[0])
    if i.opcode != "fusion":
        return False
    callee = next((c for a, c in module.calls(i) if a == "calls"), None)
    body = {x.name: x for x in module.computations.get(callee, [])}
    root = next((x for x in body.values() if x.root), None)
    while root is not None and root.opcode in ("copy", "bitcast") and root.operands:
        root = body.get(root.operands[0])
    if root is None or root.opcode != "dynamic-update-slice":
        return False
    base = body.get(root.operands[0])
    if base is not None and base.opcode == "parameter" and base.args.isdigit() and int(base.args) < len(i.operands):
        return _is_zero(module, i.operands[int(base.args)])
    return _is_zero(module, root.operands[0], body)


def _megascale(instr: Instruction) -> str | None:
    """The collective a libtpu host-transfer ``send`` implements across slices, e.g. ``all-reduce``."""
    found = re.search(r'_xla_megascale_transfer_type="(\w+)"', instr.attrs)
    return found.group(1).lower().replace("_", "-") if instr.opcode == "send" and found else None


def collectives(compiled_hlo: str | Module) -> list[Collective]:
    """The collectives in a compiled program's HLO text (``jax.jit(f).lower(...).compile().as_text()``), each
    instruction once: an async pair by its ``-start`` (counting the arrays it produces, not the operands and
    context it also carries), a collective cloned into several fused computations (TPU's async collective fusions)
    once by its channel, a megascale ``send`` (libtpu's cross-slice collective) as the collective it implements; an
    all-reduce's zero-padded operands (``zero_padded``) as an all-gather, its others as an all-reduce.
    ``trips``: how often it runs per step."""
    module = parse(compiled_hlo) if isinstance(compiled_hlo, str) else compiled_hlo
    runs, _ = multipliers(module)
    found: dict[tuple, Collective] = {}
    for name, body in module.computations.items():
        for instr in body:
            op, start = instr.opcode, instr.opcode.endswith("-start")
            base = op[:-len("-start")] if start else op
            form, groups_from = ("async" if start else ""), instr
            megascale = _megascale(instr)
            if megascale:
                base, form = megascale, "megascale send"
            elif op == "fusion" and instr.name.startswith("all-reduce-scatter"):
                base, form = "reduce-scatter", "all-reduce-scatter fusion"
                callee = next((c for a, c in module.calls(instr) if a == "calls"), None)
                groups_from = next((i for i in module.computations.get(callee, []) if "replica_groups" in i.attrs),
                                   instr)
            elif base not in COLLECTIVE_OPS:
                continue
            channel = _CHANNEL.search(instr.attrs)
            key = (base, form == "megascale send", channel.group(1)) if channel else (instr.name,)
            kind, shape = base, instr.type
            items = arrays(shape)
            if megascale:
                items = items[:1]                                   # (data, u32[] context, token[])
            elif start:                       # (operands..., results..., u32[] contexts): keep the results
                items = [a for a in items if a[1]] or items
                if base in ("all-gather", "collective-permute") and len(items) > 1:
                    items = items[len(items) // 2:]
            body_name = next((k for k in _COLLECTIVE_MATMUL if k in name), None)
            if base == "collective-permute" and body_name:
                kind, form = _COLLECTIVE_MATMUL[body_name], "collective matmul"
            groups = () if megascale else replica_groups(groups_from.attrs, module.num_partitions)
            parts = [(kind, form, items)]
            if base == "all-reduce" and not megascale and len(instr.operands) == len(items):
                padded = [zero_padded(module, o) for o in instr.operands]
                parts = [(k, f, [a for a, p in zip(items, padded) if p == flag]) for k, f, flag in
                         (("all-gather", "zero-padded all-reduce", True), (kind, form, False))]
            for part, (k, f, chosen) in enumerate(p for p in parts if p[2]):
                c = Collective(base, tuple(s for _, s in chosen), tuple(d for d, _ in chosen), k, f, runs[name],
                               groups)
                if (key, part) not in found or found[(key, part)].trips < c.trips:
                    found[(key, part)] = c
    return list(found.values())


def collectives_by_kind(found: Sequence[Collective]) -> dict[str, dict[str, float]]:
    """``{kind: {"instructions", "count", "bytes"}}`` over ``found`` (``collectives``), kinds sorted by name:
    ``count`` and ``bytes`` per step (each instruction × its trips), ``instructions`` each once."""
    table: dict[str, dict[str, float]] = {}
    for c in found:
        row = table.setdefault(c.kind, {"instructions": 0, "count": 0, "bytes": 0})
        row["instructions"] += 1
        row["count"] += c.trips
        row["bytes"] += c.bytes * c.trips
    return dict(sorted(table.items()))
