"""``python -m layerscale_jax.bench SUBCOMMAND ...`` — see ``python -m layerscale_jax.bench -h``."""
from __future__ import annotations

import sys

from layerscale_jax.runtime import reexec_with_huge_page_malloc

# Before anything allocates: huge pages for XLA's per-step CPU buffers (see layerscale_jax/runtime.py).
reexec_with_huge_page_malloc()

from layerscale_jax.bench.cli import main  # noqa: E402
from layerscale_jax.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))                  # user errors: one line, exit status 2 (layerscale_jax/cli.py)
