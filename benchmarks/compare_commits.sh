#!/usr/bin/env bash
# Did a change make the train step faster? Times `bench train_step` at two commits, alternating A, B, A, B ...
# in fresh processes (so machine-load changes hit both alike), and prints each run and the median ratio.
#   bash benchmarks/compare_commits.sh BASE [HEAD] [ROUNDS] -- [train_step args, e.g. --batch 16]
# PYTHON picks the interpreter (default python3). BASE is checked out in a temporary git worktree.
set -eu
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="$1"; shift
HEAD="HEAD"; ROUNDS=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then HEAD="$1"; shift; fi
if [ $# -gt 0 ] && [ "$1" != "--" ]; then ROUNDS="$1"; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
TMP="$(mktemp -d)"
trap 'git -C "$REPO" worktree remove --force "$TMP/base" >/dev/null 2>&1; git -C "$REPO" worktree remove --force "$TMP/head" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
git -C "$REPO" worktree add --detach "$TMP/base" "$BASE" >/dev/null 2>&1
git -C "$REPO" worktree add --detach "$TMP/head" "$HEAD" >/dev/null 2>&1
for i in $(seq "$ROUNDS"); do
  for side in base head; do
    t=$(cd "$TMP/$side" && PYTHONPATH="$TMP/$side" "${PYTHON:-python3}" -m layerscale_jax.bench train_step --json "$@" 2>/dev/null \
        | tail -1 | "${PYTHON:-python3}" -c "import json,sys; print(json.load(sys.stdin)['step_time_s'])")
    echo "$side $t" | tee -a "$TMP/times"
  done
done
"${PYTHON:-python3}" - "$TMP/times" "$BASE" "$HEAD" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
t = {s: statistics.median(float(v) for k, v in rows if k == s) for s in ("base", "head")}
print(f"median step time: {sys.argv[2]} {t['base'] * 1e3:.1f} ms, {sys.argv[3]} {t['head'] * 1e3:.1f} ms; "
      f"speed-up {t['base'] / t['head']:.3f}x")
PY
