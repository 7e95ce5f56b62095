"""The train pipeline's throughput alone (``measure_pipeline``): images/s and per CPU-second, for benchmarks."""

import time

from layerscale_jax.data.config import validate_data_config
from layerscale_jax.data.pipeline import make_train_iterator


def measure_pipeline(data_config, global_batch_size, num_batches, warmup=2):
    """Images/s of the train pipeline alone (one process, process_index 0 of 1), after `warmup` batches.

    Returns a dict: images_per_s (wall clock), images_per_cpu_s, startup_seconds (iterator creation + warmup),
    num_workers, prefetch, cache, image_shape, ...
    """
    settings = validate_data_config(data_config)
    t0 = time.perf_counter()
    it = make_train_iterator(settings, global_batch_size=global_batch_size, seed=0, process_index=0, process_count=1)
    try:
        for _ in range(warmup):
            next(it)
        start_s = time.perf_counter() - t0
        t1, c1 = time.perf_counter(), time.process_time()
        for _ in range(num_batches):
            batch = next(it)
        seconds, cpu_seconds = time.perf_counter() - t1, time.process_time() - c1
    finally:
        it.close()
    return {
        "name": settings.name,
        "image_size": settings.image_size,
        "image_shape": list(batch["image"].shape[1:]),
        "global_batch_size": global_batch_size,
        "num_batches": num_batches,
        "num_workers": settings.num_workers,
        "prefetch": settings.prefetch,
        "cache": settings.cache,
        "seconds": seconds,
        "startup_seconds": start_s,
        "images_per_s": global_batch_size * num_batches / seconds,
        # CPU time of this process (prefetch threads included, worker processes not): with num_workers=0 this
        # gives images per CPU-second, a load-independent estimate of what one free core sustains.
        "process_cpu_seconds": cpu_seconds,
        "images_per_cpu_s": global_batch_size * num_batches / max(cpu_seconds, 1e-9),
    }
