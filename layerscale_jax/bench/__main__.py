"""``python -m layerscale_jax.bench SUBCOMMAND ...``; user errors: one line, exit status 2 (layerscale_jax/cli.py)."""
import sys

from layerscale_jax.runtime import reexec_with_fast_malloc

reexec_with_fast_malloc()      # before anything allocates: a malloc that keeps XLA's CPU buffers (runtime/malloc.py)

from layerscale_jax.bench.cli import main  # noqa: E402
from layerscale_jax.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
