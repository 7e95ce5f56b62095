"""The train input as the loop consumes it (``Batches``): global batches of the rows this process reads, positioned
where a checkpoint left the iterator, with the time the loop waited for them; and the check that hosts reading the
same rows (``tensor`` across hosts, ``data.skip_bad_records``) skipped the same bad records (``replica_mismatch``).
"""
from __future__ import annotations

import collections
import time

from layerscale_jax import data as data_lib
from layerscale_jax.data.sharding import process_batch_rows, read_plan
from layerscale_jax.errors import UserError
from layerscale_jax.storage.checkpoint import gather_from_all


class Batches:
    """The train input: global batches of this process's rows, the iterator positioned where a checkpoint left it
    (``data_state``), the first fetched at once (the step is compiled on it before the first step), and the time
    the loop waited for them. With ``data.skip_bad_records``, processes that read the same rows (``tensor`` across
    hosts) must skip the same records: ``check_replicas``."""

    def __init__(self, data, train, mesh, data_state=None):
        """``data``: the data section (``DataSettings``), ``train``: the train section (its batch size and seed),
        ``mesh``: the device mesh the global batches are laid out on."""
        self.mesh, self.size = mesh, train.batch_size
        try:
            self.iterator = data_lib.make_train_iterator(data, global_batch_size=train.batch_size, seed=train.seed,
                                                         rows=process_batch_rows(mesh, train.batch_size))
            if data_state is not None:
                self.iterator.set_state(data_state)
            plan = read_plan(mesh.devices, mesh.axis_names, train.batch_size)
            replicated = data.skip_bad_records and len({repr(rows) for rows in plan.values()}) < len(plan)
            self.plan = plan if replicated else None
            self.waited = 0.0                     # seconds spent waiting for batches since the last take_wait
            self.waited_total = 0.0               # ... since the start (the goodput account's input_wait)
            self.first = self._fetch()
        except MemoryError as err:                # numpy's "Unable to allocate 8.00 TiB ..." (a 35-line traceback)
            raise UserError(f"train.batch_size={train.batch_size}: this host's memory cannot hold the batch ({err}); "
                            "lower train.batch_size") from None

    def _fetch(self) -> dict:
        waited_from = time.perf_counter()     # the step is dispatched asynchronously: time spent here is time the
        batch = data_lib.to_global_batch(next(self.iterator), self.mesh, self.size)   # input kept the loop waiting
        waited = time.perf_counter() - waited_from
        self.waited += waited
        self.waited_total += waited
        return batch

    def __next__(self) -> dict:
        if self.first is None:
            return self._fetch()
        batch, self.first = self.first, None
        return batch

    def take_wait(self) -> float:
        waited, self.waited = self.waited, 0.0
        return waited

    @property
    def bad_records(self) -> int:
        return self.iterator.bad_records

    def get_state(self):
        return self.iterator.get_state()

    def check_replicas(self, step: int) -> None:
        """Processes that read the same rows must have skipped the same bad records (one batch shard, one content)."""
        problem = replica_mismatch(self.plan, gather_from_all(self.bad_records)) if self.plan is not None else None
        if problem is not None:
            raise UserError(f"by step {step}, {problem}: their copies of the dataset differ, so one batch shard got "
                            "different examples on different hosts; give every host the same dataset files (e.g. "
                            "one data.data_dir on gs://) and resume from the last checkpoint")

    def close(self) -> None:
        self.iterator.close()

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def replica_mismatch(plan: dict, skipped: list[int]) -> str | None:
    """Processes reading the same rows of every batch (``plan``: ``data.sharding.read_plan``; with ``tensor`` across
    hosts) feed one batch shard, so with ``data.skip_bad_records`` they must have skipped the same records: the same
    content gives the same decisions. ``skipped``: each process's count, in process order. The mismatch in words (a
    dataset copy that differs between hosts), or None."""
    groups = collections.defaultdict(list)
    for process, rows in plan.items():
        groups[repr(rows)].append(process)
    for processes in groups.values():
        if len({skipped[p] for p in processes}) > 1:
            counts = ", ".join(f"process {p}: {skipped[p]}" for p in processes)
            return f"processes that read the same rows skipped different numbers of bad records ({counts})"
    return None
