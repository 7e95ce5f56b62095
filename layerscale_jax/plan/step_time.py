"""A step-time range from a compiled step's own HLO and the chip's published figures (``plan.targets.CHIPS``).

Per chip and step (``plan.hlo``: loops counted by their trip counts):

    compute         matmul FLOPs / the chip's dense bf16 peak
    memory          HBM bytes read and written / the chip's HBM bandwidth
    communication   per link, Σ over collectives of trips × the bytes the ring algorithm sends per device for it
                    (``hlo.Collective.link_bytes``) / the link's bandwidth per chip, one direction: a TPU slice's ICI
                    or a GPU host's NVLink for collectives within them, the data-centre network (DCN, per chip) for
                    libtpu's cross-slice transfers, the GPU's network adapter for collectives whose devices span
                    hosts (on the slowest link they cross)

The step cannot be faster than the largest term (everything else hidden behind it: perfect overlap, the **lower
bound**) and should not be slower than their sum (nothing overlapped: the **upper bound**), unless the program
waits on something these terms do not count (latency of many small collectives, the host, input). MFU =
model FLOPs / (chips × peak × step time), so the range of step times gives a range of MFU. The term that sets the
lower bound is named: the one to work on.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from layerscale_jax.plan import hlo as hlo_lib


@dataclasses.dataclass
class StepTime:
    """The terms of one step per chip: ``seconds`` by term (``compute``, ``memory``, and one per link crossed),
    with the FLOPs, HBM bytes and link bytes they come from. ``unknown_loops``: loops whose trip count could not
    be read (counted once); ``notes``: what was left out."""
    flops_per_chip: float
    hbm_bytes_per_chip: float
    link_bytes_per_chip: dict[str, float]
    seconds: dict[str, float]
    unknown_loops: int = 0
    notes: tuple[str, ...] = ()

    @property
    def lower(self) -> float:
        return max(self.seconds.values())

    @property
    def upper(self) -> float:
        return sum(self.seconds.values())

    @property
    def dominant(self) -> str:
        return max(self.seconds, key=self.seconds.get)


def link_of(collective: hlo_lib.Collective, chip, processes: Sequence[int]) -> str:
    """The link a collective crosses: the network for a megascale transfer or a GPU group spanning hosts
    (``processes``: the process of each partition id), else the chip's own link (ICI, NVLink)."""
    if collective.form == "megascale send":
        return chip.network
    if chip.platform == "cuda" and processes:
        for group in collective.groups:
            if len({processes[i] for i in group if i < len(processes)}) > 1:
                return chip.network
    return chip.link


def step_time(compiled_hlo: str, chip, processes: Sequence[int] = (), num_slices: int = 1) -> StepTime:
    """The step-time terms of a compiled step (``compiled.as_text()``) on ``chip`` (a ``targets.Chip``);
    ``processes``: the process index of each device in partition order (the mesh's flat device order), to tell
    GPU collectives within a host from those across; ``num_slices``: the slices a megascale all-reduce spans."""
    module = hlo_lib.parse(compiled_hlo)
    work = hlo_lib.step_work(module)
    link_bytes: dict[str, float] = {}
    for c in hlo_lib.collectives(module):
        link = link_of(c, chip, processes)
        group = num_slices if c.form == "megascale send" else None
        link_bytes[link] = link_bytes.get(link, 0.0) + c.trips * c.link_bytes(group)
    seconds = {"compute": work.flops / chip.peak_bf16_flop_per_s, "memory": work.hbm_bytes / chip.hbm_bytes_per_s}
    notes = []
    for link, moved in link_bytes.items():
        bandwidth = chip.link_bytes_per_s if link == chip.link else chip.network_bytes_per_s
        if bandwidth is None:
            notes.append(f"{link} not counted ({moved / 1e9:.2f} GB per chip): {chip.name} has no published "
                         f"{link} bandwidth")
            continue
        seconds[link] = moved / bandwidth
    if work.unknown_loops:
        notes.append(f"{len(work.unknown_loops)} loop(s) of unknown trip count counted once")
    return StepTime(work.flops, work.hbm_bytes, link_bytes, seconds, len(work.unknown_loops), tuple(notes))
