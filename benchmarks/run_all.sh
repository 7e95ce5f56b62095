#!/usr/bin/env bash
# The whole CPU benchmark suite → benchmarks/results/<machine>_<date>.json (see benchmarks/README.md).
#   bash benchmarks/run_all.sh [--quick] [--max-load 1.5 --max-wait-s 900]
# PYTHON picks the interpreter; use one with torch + timm for the side-by-side entries.
set -eu
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m layerscale_jax.bench all "$@"
