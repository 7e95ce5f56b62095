"""Benchmarks: the train step against timm and big_vision's ViT architecture, FLOPs and MFU, the CPU suite.

    python -m layerscale_jax.bench train_step --model deit3_small_patch16_224 --batch 16 --vs-timm --vs-peer
    python -m layerscale_jax.bench all      # the CPU suite → benchmarks/results/<machine>_<date>.json
    python -m layerscale_jax.bench report benchmarks/results/<machine>_<date>.json     # the README table

Modules, each importing only those before it: ``timing`` (the timing core), ``flops``, ``timm_worker`` (timm's side,
a worker process on the CPU), ``peer`` (big_vision's ViT in linen), ``step`` (the train step and its measurement),
``profile``, ``trainer`` (the trainer's step and optimizer), ``report`` (printer and README table; no jax),
``entries`` (every benchmark, and ``all``), ``cli``. Only jax, flax, optax and numpy at import time.
"""
