#!/usr/bin/env bash
# GPU check of layerscale-jax: the GPU benchmarks, then the GPU-relevant tests, in under 8 minutes.
#
#   bash benchmarks/gpu_check.sh            # results under $OUT (default: ./gpu_results)
#
# Needs: one NVIDIA GPU, python3 with jax for CUDA, flax, optax (torch + timm for the side-by-side part; pytest for
# the tests). No network, no TensorFlow / grain / ml_collections. The repository is used through PYTHONPATH (no
# install). Every step has its own timeout; a failing step is recorded and the script goes on; the summary
# ($OUT/gpu_check.json) is rewritten after every step, so a killed run still leaves partial results.
#
# Steps (most important first):
#   env          versions, nvidia-smi, jax devices
#   matmul       bf16 / fp32 matmul peak of jax and torch (n = 8192): the MFU denominators
#   b16_bf16     DeiT III-B/16, bf16, batch 256, train step vs timm (attention_impl=xla)  — target MFU >= 50%
#   b16_cudnn    the same with cuDNN's fused attention (attention_impl=cudnn, tokens padded to 198)
#   s16_bf16     DeiT III-S/16, bf16, batch 256, vs timm
#   b16_scan     DeiT III-B/16, bf16, batch 256, scanned layers (compile time and step time)
#   seeds        the depth-ablation model: 8 seeds in one vmapped step vs one after another
#   tests        tests/test_models.py tests/test_layers.py [tests/test_convert.py] on the GPU
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$REPO/gpu_results}"
mkdir -p "$OUT"
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false      # jax and torch share the GPU in the side-by-side runs
export TF_CPP_MIN_LOG_LEVEL=2
PY="${PYTHON:-python3}"
BUDGET_S="${BUDGET_S:-460}"                      # stop starting new steps after this many seconds
SUMMARY="$OUT/gpu_check.json"
# GPU_CHECK_SMALL=1: tiny shapes, only to try the script's flow on a CPU machine.
if [ "${GPU_CHECK_SMALL:-0}" = 1 ]; then
  BATCH=4; MM=512; SHAPE=(--set img_size=32 --set depth=2)
else
  BATCH=256; MM=8192; SHAPE=()
fi

source "$REPO/benchmarks/gpu_steps.sh"

step env 60 "$PY" benchmarks/gpu_env.py

step matmul 90 "$PY" -m layerscale_jax.bench matmul --n "$MM" --json

step b16_bf16 170 "$PY" -m layerscale_jax.bench train_step --model deit3_base_patch16_224 --batch "$BATCH" "${SHAPE[@]}" \
  --set attention_impl=xla --dtype bfloat16 --vs-timm --repeats 5 --json

step b16_cudnn 110 "$PY" -m layerscale_jax.bench train_step --model deit3_base_patch16_224 --batch "$BATCH" \
  "${SHAPE[@]}" --set attention_impl=cudnn --dtype bfloat16 --repeats 5 --json

step s16_bf16 100 "$PY" -m layerscale_jax.bench train_step --model deit3_small_patch16_224 --batch "$BATCH" "${SHAPE[@]}" \
  --set attention_impl=xla --dtype bfloat16 --vs-timm --repeats 5 --json

step b16_scan 90 "$PY" -m layerscale_jax.bench train_step --model deit3_base_patch16_224 --batch "$BATCH" "${SHAPE[@]}" \
  --set attention_impl=xla --dtype bfloat16 --scan --repeats 3 --json

step seeds 60 "$PY" -m layerscale_jax.bench seeds --num-seeds 8 --repeats 5 --json

# The tests, on the GPU (conftest defaults JAX_PLATFORMS to cpu; override it). test_convert only if it imports.
TESTS="tests/test_models.py tests/test_layers.py"
if "$PY" -c "import layerscale_jax.convert" > /dev/null 2>&1; then TESTS="$TESTS tests/test_convert.py"; fi
if "$PY" -c "import pytest" > /dev/null 2>&1; then
  step tests 240 env JAX_PLATFORMS=cuda "$PY" -m pytest -q -x -p no:cacheprovider $TESTS
else
  # No pytest: a minimal stand-in — the same model on GPU and CPU gives the same logits.
  step tests 120 env JAX_PLATFORMS=cuda,cpu "$PY" - <<'EOF'
import json
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from layerscale_jax import create_model
out = {"pytest": "missing: ran the GPU-vs-CPU logits check instead"}
for name in ("deit3_small_patch16_224", "cait_xxs24_224"):
    model = create_model(name, img_size=64, depth=2, num_classes=10, rngs=nnx.Rngs(0))
    model.eval()
    x = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
    gd, st = nnx.split(model)
    f = lambda st, x: nnx.merge(gd, st)(x)
    gpu = np.asarray(jax.jit(f)(st, jnp.asarray(x)))
    cpu_dev = jax.devices("cpu")[0]
    cpu = np.asarray(jax.jit(f)(jax.device_put(st, cpu_dev), jax.device_put(x, cpu_dev)))
    out[name] = float(np.abs(gpu - cpu).max())
out["ok"] = all(v < 1e-2 for k, v in out.items() if k != "pytest")
print(json.dumps(out))
raise SystemExit(0 if out["ok"] else 1)
EOF
fi

echo "== done in $(elapsed)s; summary: $SUMMARY"
"$PY" - "$OUT" <<'EOF' || true
import json, os, sys
out = sys.argv[1]
summary = json.load(open(os.path.join(out, "gpu_check.json")))
table = {}
for name in ("b16_bf16", "b16_cudnn", "s16_bf16", "b16_scan"):
    path = os.path.join(out, f"{name}.json")
    if os.path.exists(path):
        r = json.load(open(path))
        table[name] = {k: r.get(k) for k in ("img_per_s", "step_time_s", "mfu", "compile_s", "peak_memory_bytes",
                                             "timm_img_per_s", "ratio_vs_timm", "timm_mfu",
                                             "matmul_peak_flop_per_s")}
summary["results"] = table
json.dump(summary, open(os.path.join(out, "gpu_check.json"), "w"), indent=1)
for name, r in table.items():
    print(name, json.dumps(r))
EOF
