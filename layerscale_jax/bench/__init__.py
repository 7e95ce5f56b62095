"""Benchmarks (``python -m layerscale_jax.bench -h``; ``benchmarks/README.md``). Modules, each importing only those
before it: ``timing`` (the timing core), ``flops``, ``timm_worker``, ``peer`` (big_vision's ViT in linen), ``step``
(the train step and its measurement), ``op_profile``, ``trainer``, ``report`` (printer and docs/performance.md's
table), ``entries`` (every benchmark, and ``all``), ``cli``. Only jax, flax, optax and numpy at import time;
torch/timm lazily.
"""
