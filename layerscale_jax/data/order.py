"""The train order: which record each row of each global batch reads.

The global stream is a sequence of positions q = 0, 1, 2, ...; position q is record `perm_e[q mod N]` of epoch
e = q // N, where perm_e is a permutation of the N train records seeded by (seed, e), so every epoch visits
every record once, reshuffled per epoch, and batches run on across epoch boundaries (an infinite stream has no remainder
to drop). Global batch j is positions [j G, (j + 1) G): its row i is position j G + i. A process reads only the
rows of each global batch that its devices hold: `rows`, sorted ``(start, stop)`` blocks derived from the batch
sharding by the train loop (`data.sharding.process_batch_rows`; any number of blocks, as a TPU topology or a
multi-slice mesh lays them out; processes whose devices hold the same rows, e.g. tensor parallelism spanning
processes, read the same data), by default the p-th of P equal slices [p b, (p + 1) b), b = G / P. Its local batch
is those rows in increasing order. The batch an example lands in, and its row there, therefore do not depend on
the number of processes or the device layout.
"""

import collections
import dataclasses
import threading

import numpy as np

from layerscale_jax.data.sharding import normalize_rows, row_indices
from layerscale_jax.errors import ConfigError


class Order:
    """Position q -> record key: perm_e[q mod N] with perm_e seeded by (seed, e). Keeps a few epochs cached.

    perm_e is a uniform permutation of the N records, or, with `block` > 0 (`data.read_block`), a read plan for
    sharded storage: the records in blocks of `block` consecutive keys (consecutive records of one ArrayRecord shard),
    the blocks in a random order, and the records of every `window` consecutive blocks of that order shuffled
    together (`data.read_window`). A process reads consecutive positions of each global batch (its rows), so a batch
    of b rows touches at most ~2 `window` blocks, b / `window` records from each, instead of b records spread over
    every shard. Each epoch still visits every record once, and the plan is a function of (seed, epoch) alone.
    """

    _KEEP = 4

    def __init__(self, num_records, seed, block=0, window=1):
        self.n, self.seed, self.block, self.window = num_records, seed, block, window
        self._perms = collections.OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"n": self.n, "seed": self.seed, "block": self.block, "window": self.window}

    def __setstate__(self, state):
        self.__init__(state["n"], state["seed"], state["block"], state["window"])

    def _plan(self, epoch):
        rng = np.random.default_rng([self.seed, 0, epoch])
        if not self.block:
            return rng.permutation(self.n)
        starts = rng.permutation(np.arange(0, self.n, self.block))
        order = (starts[:, None] + np.arange(self.block)).ravel()
        order = order[order < self.n]                     # the last block may be short
        span = self.block * self.window
        full = self.n - self.n % span
        order[:full] = rng.permuted(order[:full].reshape(-1, span), axis=1).ravel()
        order[full:] = rng.permutation(order[full:])
        return order

    def _perm(self, epoch):
        with self._lock:
            perm = self._perms.get(epoch)
            if perm is None:
                perm = self._plan(epoch)
                self._perms[epoch] = perm
                if len(self._perms) > self._KEEP:
                    self._perms.popitem(last=False)
            return perm

    def keys(self, positions):
        epochs = positions // self.n
        out = np.empty_like(positions)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm(int(e))[positions[sel] % self.n]
        return out


@dataclasses.dataclass
class Geometry:
    """This process reads the rows `rows` (sorted ``(start, stop)`` blocks) of every global batch; `index` holds
    their global row indices in local order."""
    global_batch: int
    rows: tuple

    def __post_init__(self):
        self.index = row_indices(self.rows)
        self.per_process = len(self.index)

    def positions(self, j):
        return j * self.global_batch + self.index


def process_rows(global_batch_size, process_index, process_count, rows):
    """The rows of each global batch that this process reads: sorted, merged ``(start, stop)`` blocks.

    ``rows`` is given by the train loop, derived from the batch sharding (``data.sharding.process_batch_rows``): any
    number of blocks, in any order; when the mesh's batch axes do not span the processes, several processes read the
    same rows. Otherwise process ``p`` of ``P`` reads ``[p b, (p + 1) b)``, ``b = G / P`` (default: this JAX process
    of all of them).
    """
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ConfigError(f"global_batch_size must be a positive int, got {global_batch_size!r}")
    if rows is not None:
        if process_index is not None or process_count is not None:
            raise ConfigError("give either rows or process_index/process_count, not both")
        return normalize_rows(rows, global_batch_size)
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not isinstance(process_count, int) or process_count < 1:
        raise ConfigError(f"process_count must be a positive int, got {process_count!r}")
    if not isinstance(process_index, int) or not 0 <= process_index < process_count:
        raise ConfigError(f"process_index must be in [0, {process_count}), got {process_index!r}")
    if global_batch_size % process_count:
        raise ConfigError(
            f"global_batch_size={global_batch_size} is not divisible by process_count={process_count}"
        )
    b = global_batch_size // process_count
    return ((process_index * b, (process_index + 1) * b),)
