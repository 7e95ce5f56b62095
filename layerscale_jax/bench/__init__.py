"""Benchmarks: the training step side by side with timm, FLOPs and MFU, and the performance suite of issue 7.

    python -m layerscale_jax.bench train_step --model deit3_small_patch16_224 --batch 16 --dtype float32 --vs-timm
    python -m layerscale_jax.bench all            # the whole CPU suite → benchmarks/results/<machine>_<date>.json

Everything here imports only jax, flax, optax and the model code (torch/timm lazily, for ``--vs-timm``), so it
runs on a bare accelerator machine without TensorFlow, grain or ml_collections. The one exception is the
``pipeline`` entry, which imports ``layerscale_jax.data`` lazily.

Modules: ``timing`` (the warm-up + median protocol, matmul peak, memory, machine facts), ``flops`` (the analytic
FLOP count), ``step`` (the functional train step and its measurement), ``timm_side`` (the PyTorch counterpart),
``suite`` (the further benchmarks and ``all``), ``trainer`` (the trainer's own step and its optimizer against the
model-only step and plain AdamW; needs ml_collections, and the data package for ``train_step --config``).
"""
