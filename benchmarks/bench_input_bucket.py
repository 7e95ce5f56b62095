"""Records per second one host's train pipeline reads from a bucket with latency, and what the read plan changes.

    python benchmarks/bench_input_bucket.py [--latency-ms 0 20 50] [--prefetch 2 8] [--batches 12] [--out FILE]

The bucket is modelled, not reached: a source of the project's synthetic 375x500 quality-90 JPEGs
(`data.synthetic_jpeg_shape`) stored as ArrayRecord-like shards of `--shard-size` records, where one read request
fetches one run of consecutive records of one shard (ArrayRecord as TFDS writes ImageNet: one record per chunk, so
records that are not neighbours are separate requests), each request waits `L` ms (in `time.sleep`, which releases
the GIL, as waiting on the network does), and the requests of one batch read run `--parallel` at a time (grain's
ArrayRecord source reads shards on a thread pool, 64 threads by default). The pipeline is the train path of
`configs/imagenet_deit3.py`'s kind with a random-resized crop: decode + crop (bicubic) + flip, 224 px, the block
read plan of the ImageNet configs (`data.read_block`, `data.read_window`, `data.config.use_sharded_input`), in
one process with `--prefetch` threads (`data.num_workers = 0`). Global batch `--global-batch`, this host's share
`--host-batch` (host 0 of global/host hosts). The batches built ahead during the warm-up are taken before the
clock starts, so every timed batch is built while timed.

Printed and saved, per latency and prefetch: records/s (wall clock), read requests and shards per host batch for
the plan and for a uniform permutation (`data.read_block = 0`, counted on the same batches' keys, not timed).
Results go to benchmarks/results/input_bucket_<machine>_<date>.json.
"""

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from layerscale_jax.data import config as config_lib, sources  # noqa: E402
from layerscale_jax.data.order import Order  # noqa: E402


class BucketSource(sources.SyntheticSource):
    """Synthetic JPEG records behind the modelled bucket (module docstring)."""

    def __init__(self, *args, latency_s, shard_size, parallel, **kwargs):
        super().__init__(*args, **kwargs)
        self.latency_s, self.shard_size, self.parallel = latency_s, shard_size, parallel

    def read(self, keys):
        time.sleep(self.latency_s * -(-requests(keys, self.shard_size) // self.parallel))
        return super().read(keys)


def requests(keys, shard_size):
    """Read requests for `keys`: runs of consecutive keys within one shard."""
    ordered = np.sort(np.asarray(keys, np.int64))
    breaks = (np.diff(ordered) != 1) | (np.diff(ordered // shard_size) != 0)
    return int(len(ordered) > 0) + int(breaks.sum())


def plan_counts(num_records, global_batch, host_batch, shard_size, block, window, batches):
    """Mean read requests and shards per host batch, host 0, for the plan (block, window)."""
    order = Order(num_records, 0, block, window)
    reqs, shards = [], []
    for j in range(batches):
        keys = order.keys(j * global_batch + np.arange(host_batch))
        reqs.append(requests(keys, shard_size))
        shards.append(len(np.unique(keys // shard_size)))
    return {"requests_per_batch": float(np.mean(reqs)), "shards_per_batch": float(np.mean(shards))}


def measure(latency_ms, prefetch, args):
    from layerscale_jax.data import default_data_config, make_train_iterator

    cfg = default_data_config("synthetic")
    cfg.image_size, cfg.num_train, cfg.synthetic_jpeg_shape = 224, args.num_records, (375, 500)
    config_lib.use_sharded_input(cfg, workers=0)
    cfg.prefetch = prefetch
    cfg.augment.update(random_resized_crop=True, hflip=True, three_augment=False, color_jitter=0.0)
    settings = config_lib.validate_data_config(cfg)
    train, test, k, c = sources.open_sources(settings)
    bucket = BucketSource("train", args.num_records, 224, 3, settings.num_classes, (375, 500),
                          latency_s=latency_ms / 1e3, shard_size=args.shard_size, parallel=args.parallel)
    original = sources.open_sources
    sources.open_sources = lambda s: (bucket, test, k, c)
    try:
        it = make_train_iterator(cfg, global_batch_size=args.global_batch, seed=0,
                                 rows=((0, args.host_batch),))
        for _ in range(args.warmup + prefetch):   # and the batches built ahead: the timed ones are built while timed
            next(it)
        t0 = time.perf_counter()
        for _ in range(args.batches):
            next(it)
        seconds = time.perf_counter() - t0
        it.close()
    finally:
        sources.open_sources = original
    return {"latency_ms": latency_ms, "prefetch": prefetch, "records_per_s": args.batches * args.host_batch / seconds,
            "seconds": seconds}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latency-ms", type=float, nargs="+", default=[0, 20, 50])
    p.add_argument("--prefetch", type=int, nargs="+", default=[2, 8])
    p.add_argument("--global-batch", type=int, default=2048)
    p.add_argument("--host-batch", type=int, default=64, help="this host's rows of each global batch")
    p.add_argument("--shard-size", type=int, default=1251, help="records per shard (ImageNet train: 1024 x ~1251)")
    p.add_argument("--num-records", type=int, default=1_281_167)
    p.add_argument("--parallel", type=int, default=64, help="read requests in flight per batch read")
    p.add_argument("--batches", type=int, default=16, help="timed batches (make it several times the prefetch)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=None, help="'-': print only")
    args = p.parse_args(argv)
    from layerscale_jax.bench import timing
    from layerscale_jax.bench.entries import results_name

    machine, load_start = timing.machine_info(), timing.load_average()
    counts = {name: plan_counts(args.num_records, args.global_batch, args.host_batch, args.shard_size, block, window,
                                200)
              for name, (block, window) in {"uniform": (0, 1), "plan": (config_lib.SHARDED_READ_BLOCK,
                                                                      config_lib.SHARDED_READ_WINDOW)}.items()}
    for name, c in counts.items():
        print(f"{name}: {c['requests_per_batch']:.1f} read requests, {c['shards_per_batch']:.1f} shards per host batch "
              f"of {args.host_batch}", flush=True)
    rows = []
    for latency in args.latency_ms:
        for prefetch in args.prefetch:
            rows.append({**measure(latency, prefetch, args), "load_average": timing.load_average()})
            r = rows[-1]
            print(f"latency {latency:g} ms, prefetch {prefetch}: {r['records_per_s']:.0f} records/s "
                  f"(load {r['load_average'][0]})", flush=True)
    result = {"benchmark": "input_bucket", "command": " ".join([os.path.relpath(__file__, REPO), *sys.argv[1:]]),
              "date": str(datetime.date.today()), "machine": machine, "load_average_start": load_start,
              "load_average_end": timing.load_average(), "settings": vars(args), "read_plan": counts, "runs": rows}
    if args.out != "-":
        out = args.out or os.path.join(REPO, "benchmarks", "results",
                                       f"input_bucket_{results_name(machine)}_{datetime.date.today()}.json")
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
