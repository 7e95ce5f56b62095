"""Benchmarks: the training step side by side with timm, FLOPs and MFU, and the CPU performance suite.

    python -m layerscale_jax.bench train_step --model deit3_small_patch16_224 --batch 16 --dtype float32 --vs-timm
    python -m layerscale_jax.bench all            # the whole CPU suite → benchmarks/results/<machine>_<date>.json
    python -m layerscale_jax.bench report benchmarks/results/<machine>_<date>.json     # the README table

Modules, each importing only the ones before it: ``timing`` (the timing core: repeat protocol, matmul peak,
memory, machine facts, fresh processes), ``flops`` (the analytic FLOP count), ``timm_worker`` (timm's side, in a
worker process on the CPU), ``step`` (the functional train step and its measurement), ``profile`` (time per XLA
operation), ``trainer`` (the trainer's own step and optimizer; training stack imported lazily), ``report`` (the
generic printer and the README table; no jax), ``entries`` (every benchmark as a registered entry, and ``all``),
``cli``. Everything imports only jax, flax, optax and the model code (torch/timm lazily), so it runs on a bare
accelerator machine without TensorFlow, grain or ml_collections; ``pipeline`` imports ``layerscale_jax.data`` and
``optimizer``/``trainer_step`` the training stack lazily.
"""
