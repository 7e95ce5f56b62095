#!/usr/bin/env bash
# Second GPU check (about 3 minutes): the compile-time prediction against the real GPU, cuDNN attention, the fixed test.
#
#   OUT=/path/to/results bash benchmarks/gpu_check_compile.sh      # results under $OUT (default: ./gpu_results)
#
# Needs: one NVIDIA GPU, python3 with jax for CUDA, flax, optax, pytest (no network, no TensorFlow / TFDS / grain /
# ml_collections). The repository is used through PYTHONPATH (no install). Each step has its own timeout; a failing
# step is recorded and the script goes on; $OUT/gpu_check_compile.json is rewritten after every step.
#
# Steps:
#   env        versions, nvidia-smi, jax devices
#   predict    DeiT III-B/16 bf16 batch 256 train step (attention_impl=xla, as benchmarks/results/gpu_h200_2026-12-04
#              measured): memory_analysis() compiled for this GPU, and compiled deviceless from the stored H200 target
#              description (layerscale_jax/plan/gpu_specs/h200.txtpb) on this machine's CPU side, if this jax can
#   attention  the same step with attention_impl=xla and =cudnn (tokens padded 197 -> 198, padded keys masked):
#              first-step loss of each from the same parameters and batch, img/s timed alternately, memory
#   tests      the layer tests that state their precision (TF32 fix) and the attention tests, on the GPU
#
# GPU_CHECK_SMALL=1: tiny shapes, only to try the flow on a CPU machine (the steps that need a GPU fail there).
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$REPO/gpu_results}"
mkdir -p "$OUT"
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export TF_CPP_MIN_LOG_LEVEL=2
PY="${PYTHON:-python3}"
BUDGET_S="${BUDGET_S:-270}"                      # stop starting new steps after this many seconds
SUMMARY="$OUT/gpu_check_compile.json"
if [ "${GPU_CHECK_SMALL:-0}" = 1 ]; then
  SHAPE=(--batch 4 --overrides '{"img_size": 32, "depth": 2}')
  export JAX_PLATFORMS=cpu                       # else the CUDA plugin fails to start, and registers no topology
else
  SHAPE=(--batch 256)
fi

source "$REPO/benchmarks/gpu_steps.sh"

step env 40 "$PY" benchmarks/gpu_env.py

step predict 100 "$PY" benchmarks/gpu_compile_check.py predict --target h200 --real --attention xla "${SHAPE[@]}"

step attention 110 "$PY" benchmarks/gpu_compile_check.py attention --impls xla,cudnn --repeats 5 "${SHAPE[@]}"

step tests 90 env JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" "$PY" -m pytest -q -x -p no:cacheprovider tests/test_layers.py \
  -k "folded_scale or attention"

echo "== done in $(elapsed)s; summary: $SUMMARY"
