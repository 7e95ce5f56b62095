#!/usr/bin/env bash
# Which JAX stack runs the train step faster? Times `bench train_step` of one commit under two interpreters (two
# virtualenvs with different jax/jaxlib/flax), alternating OLD, NEW, OLD, NEW ... in fresh processes, and prints each
# run, the CPU, the load average and the median ratio.
#   OLD_PYTHON=/venv-old/bin/python NEW_PYTHON=/venv-new/bin/python \
#     bash benchmarks/compare_stacks.sh COMMIT [ROUNDS] -- [train_step args, e.g. --dtype bfloat16]
# COMMIT is checked out in a temporary git worktree (it must run on both stacks).
set -eu
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT="$1"; shift
ROUNDS=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then ROUNDS="$1"; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
TMP="$(mktemp -d)"
trap 'git -C "$REPO" worktree remove --force "$TMP/tree" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
git -C "$REPO" worktree add --detach "$TMP/tree" "$COMMIT" >/dev/null 2>&1
echo "commit $(git -C "$REPO" rev-parse --short "$COMMIT"); train_step $*"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') ($(nproc) cores)"
for side in OLD NEW; do
  py="${side}_PYTHON"; echo "$side: $("${!py}" -c 'import sys, jax, flax; print(sys.version.split()[0], "jax", jax.__version__, "flax", flax.__version__)')"
done
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$ROUNDS"); do
  for side in OLD NEW; do
    py="${side}_PYTHON"
    t=$(cd "$TMP/tree" && PYTHONPATH="$TMP/tree" "${!py}" -m layerscale_jax.bench train_step --json "$@" 2>/dev/null \
        | tail -1 | "${!py}" -c "import json,sys; print(json.load(sys.stdin)['step_time_s'])")
    echo "$side $t" | tee -a "$TMP/times"
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$NEW_PYTHON" - "$TMP/times" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
t = {s: statistics.median(float(v) for k, v in rows if k == s) for s in ("OLD", "NEW")}
print(f"median step time: old stack {t['OLD'] * 1e3:.1f} ms, new stack {t['NEW'] * 1e3:.1f} ms; "
      f"new/old speed-up {t['OLD'] / t['NEW']:.3f}x")
PY
