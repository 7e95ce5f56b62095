"""Input-pipeline throughput (the pipeline alone, no train step): images/s for digits, synthetic and 224 px JPEGs.

    python benchmarks/bench_data.py [--json] [--workers 0 2] [--data_dir DIR]

Cases:
  digits        the offline default (8x8x1, cached in memory, 1 px random translation), batch 256.
  synthetic     raw uint8 32x32x3 random images generated per record, no augmentation, batch 256.
  jpeg224_base  synthetic JPEGs of 375x500 (ImageNet-like size, quality 90), each decoded as far as its crop needs,
                random-resized crop to 224 px and flip; batch 64 (big_vision's base path; against a tf.data
                pipeline on the same bytes: benchmarks/bench_input_peer.py).
  jpeg224       the same + 3-Augment and colour jitter 0.3: the full DeiT III train augmentation.
Each case runs with every `--workers` count (grain worker processes; 0 = in the calling process with `prefetch`
background threads). Wall-clock images/s depend on what else runs on the machine; with 0 workers, images per
CPU-second of the process is a load-independent estimate of one free core. The throughput of the train step itself
is measured by the train-loop benchmark; compare the two.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from layerscale_jax.data import default_data_config, measure_pipeline  # noqa: E402


def cases(data_dir):
    digits = default_data_config("digits")
    digits.data_dir = data_dir
    synthetic = default_data_config("synthetic")
    synthetic.num_train = 4096
    jpeg = default_data_config("synthetic")
    jpeg.image_size = 224
    jpeg.num_train = 4096
    jpeg.synthetic_jpeg_shape = (375, 500)
    jpeg.augment.random_resized_crop = True
    jpeg.augment.hflip = True
    jpeg.augment.three_augment = True
    jpeg.augment.color_jitter = 0.3
    base = jpeg.copy_and_resolve_references()
    base.augment.three_augment, base.augment.color_jitter = False, 0.0
    return [("digits", digits, 256, 100), ("synthetic", synthetic, 256, 40), ("jpeg224_base", base, 64, 6),
            ("jpeg224", jpeg, 64, 6)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="grain worker counts to try")
    parser.add_argument("--data_dir", default=None, help="TFDS data dir for digits (default: TFDS's)")
    parser.add_argument("--cases", nargs="+", default=None, help="subset of: digits synthetic jpeg224_base jpeg224")
    args = parser.parse_args(argv)
    results = []
    for name, cfg, batch, num_batches in cases(args.data_dir):
        if args.cases and name not in args.cases:
            continue
        for workers in args.workers:
            cfg.num_workers = workers
            r = measure_pipeline(cfg, batch, num_batches)
            r["case"] = name
            results.append(r)
            if not args.json:
                print(
                    f"{name:10s} workers={workers} prefetch={r['prefetch']} batch={batch:4d} "
                    f"shape={tuple(r['image_shape'])}: {r['images_per_s']:10.1f} images/s "
                    f"({r['images_per_cpu_s']:10.1f} per CPU-s of the main process; "
                    f"startup {r['startup_seconds']:.1f} s)",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
