"""Our JPEG train input path against a big_vision-style tf.data pipeline, on the same JPEG bytes.

    python benchmarks/bench_input_peer.py [--workers 1 2] [--batches 20] [--rounds 3] [--emit uint8|float32]
                                          [--size 224] [--baseline DIR] [--out FILE]

Records: the project's synthetic JPEG source (`data.synthetic_jpeg_shape`, default 375x500: smooth random images
plus N(0, 12) noise, quality 90, `sources.SyntheticSource`), batch 64, 224 px (`--size`). Both sides emit the same
batch (checked: every contender's dtype and shape must agree, or the run stops):
  --emit uint8 (default)   uint8 [batch, size, size, 3], as big_vision's `decode_and_crop_jpeg` recipe leaves it:
                           ours without its normalisation stage (`make_train_iterator(normalize=False)`: the batch
                           is only copied out of grain's hand-over), tf.data without a float op after the cast
                           to uint8: neither side pays for normalisation (a train loop that takes uint8 does it on
                           its device; ours today normalises on the host, as `--emit float32` measures);
  --emit float32           both normalise on the CPU, (x / 255 - mean) / std into float32: what ours hands the
                           train loop today (`data.execution.Normalize`), and the same formula on tf.data's side.
Contenders, each run in a fresh process, all contenders once per round (rounds alternate, so a change of load hits
all alike):

  ours_base        grain + PIL (`data.make_train_iterator`): random-resized crop (scale 0.08-1, ratio 3/4-4/3,
                   bicubic, antialiased: DeiT III's, `data.augment.interpolation="bicubic"`, the default),
                   horizontal flip.
  ours_bilinear    the same with `data.augment.interpolation="bilinear"`: big_vision's crop with TensorFlow's own ops
                   (`decode_and_crop_jpeg` of the window, bilinear resize without antialias, cast to uint8) in the
                   grain map, so it does what tfdata_base does.
  ours_deit3       ours_base + 3-Augment + colour jitter 0.3 (the DeiT III train path).
  ours_base_threads, ours_bilinear_threads, ours_deit3_threads
                   the same paths as the config default runs them: no worker process (`data.num_workers=0`), W
                   threads of the calling process build batches (`data.prefetch=W`); PIL releases the GIL while it
                   decodes and resizes.
  tfdata_base      big_vision's `decode_jpeg_and_inception_crop` recipe written with tf.data: the crop window drawn by
                   `stateless_sample_distorted_bounding_box` (area 0.08-1, ratio 3/4-4/3) from
                   `extract_jpeg_shape`, decoded alone by `decode_and_crop_jpeg`, resized bilinearly (no antialias:
                   big_vision's default) and cast back to uint8 (big_vision's resize op), flipped (normalised
                   only with `--emit float32`);
                   `map(num_parallel_calls=W)` on a private thread pool of W threads, `batch`, `prefetch(2)`.
  tfdata_bicubic   the same with our resize filter (bicubic, antialiased), so the two sides do equal work.
  tfdata_deit3     tfdata_bicubic + DeiT III's 3-Augment and colour jitter 0.3 written with TensorFlow ops, the work
                   ours_deit3 does: per image one of grayscale, solarize (threshold 128) or a Gaussian blur
                   (σ ~ U(0.1, 2), separable, 13 taps), then brightness, contrast (against the mean luma) and
                   saturation blends with factors ~ U(0.7, 1.3), in float32 and cast to uint8 once at the end (ours
                   rounds to uint8 after each op, as torchvision's PIL path does; the order of the three blends,
                   random per image in ours, is fixed here: the same work).

Every process runs with the malloc settings of the train entry point (`layerscale_jax.runtime`: huge pages).
W workers: grain worker processes for ours (`data.num_workers`, prefetch 2; threads for the *_threads contenders),
threads for tf.data. CPU-seconds are those of the whole process tree (the main process with all its threads, grain's
worker processes) over the timed batches, read from /proc, so images per CPU-second counts every core the pipeline
used. `--baseline DIR` adds `ours_base@baseline` and `ours_deit3@baseline` contenders that import `layerscale_jax`
from DIR (an earlier commit exported with `git archive COMMIT layerscale_jax | tar -x -C DIR`), in the same rounds
(a checkout before `make_train_iterator(normalize=...)`, 2026-12-06, only with `--emit float32`).
Printed and saved, every row and ratio naming the CPU it was measured on: medians over rounds per contender and
worker count; ours / tf.data per CPU-second and in wall-clock images/s (`PEERS`: ours_base(_threads) against
tfdata_base and tfdata_bicubic, ours_deit3(_threads) against tfdata_base and tfdata_deit3, the bilinear ones against
tfdata_base); the wall-clock speedup from the fewest to the most workers. Results go to
benchmarks/results/input_peer_<machine>_<date>.json (<machine>: `bench.entries.results_name`, the CPU kind;
`_float32` before `.json` with `--emit float32`). Results files before 2026-12-06 were measured with both sides
normalising (what `--emit float32` does now).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CROP_SCALE, CROP_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
EMITS = ("uint8", "float32")  # --emit: what both sides hand over (the docstring)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CONTENDERS = ("tfdata_base", "ours_base", "ours_base_threads", "ours_bilinear", "ours_bilinear_threads", "ours_deit3",
              "ours_deit3_threads", "tfdata_bicubic", "tfdata_deit3")
# ours / tf.data per CPU-second and wall clock: each of ours against the peer doing the same work, and against
# big_vision's own recipe (tfdata_base).
PEERS = {"ours_base": ("tfdata_base", "tfdata_bicubic"), "ours_base_threads": ("tfdata_base", "tfdata_bicubic"),
         "ours_bilinear": ("tfdata_base",), "ours_bilinear_threads": ("tfdata_base",),
         "ours_deit3": ("tfdata_base", "tfdata_deit3"), "ours_deit3_threads": ("tfdata_base", "tfdata_deit3")}


# ----------------------------------------------------------------------------------------------- one measurement


def tree_cpu_seconds(root):
    """(User + system CPU seconds of process `root` and all its living descendants, of `root` alone), all threads,
    from /proc."""
    parent, ticks = {}, {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # the process ended meanwhile
                continue
            parent[int(d)], ticks[int(d)] = int(fields[1]), int(fields[11]) + int(fields[12])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo += [c for c, p in parent.items() if p == pid]
    return total / os.sysconf("SC_CLK_TCK"), ticks.get(root, 0) / os.sysconf("SC_CLK_TCK")


def timed(batches, warmup, batch_size, next_batch):
    """Images/s and images per CPU-second of the process tree over `batches` batches after `warmup`, and the CPU
    milliseconds per image of the main process alone (with workers: what receiving (and normalising) costs the
    process that runs the train loop, which every worker's batches pass through); the batch's shape and dtype."""
    for _ in range(warmup):
        next_batch()
    (c0, m0), t0 = tree_cpu_seconds(os.getpid()), time.perf_counter()
    for _ in range(batches):
        images = next_batch()
    (c1, m1), seconds = tree_cpu_seconds(os.getpid()), time.perf_counter() - t0
    n, cpu = batches * batch_size, c1 - c0
    return {"images": n, "seconds": seconds, "cpu_seconds": cpu, "images_per_s": n / seconds,
            "images_per_cpu_s": n / max(cpu, 1e-9), "main_process_cpu_ms_per_image": (m1 - m0) / n * 1e3,
            "batch_shape": list(images.shape), "dtype": str(images.dtype)}


def ours(variant, workers, batch, jpeg_shape, num_records, size=224, emit="uint8"):
    """(next images, close) of our train iterator. `variant`: 'base', 'bilinear' or 'deit3', each optionally with
    '_threads' (the docstring); `emit`: 'uint8' or 'float32' (normalised)."""
    from layerscale_jax.data import default_data_config, make_train_iterator

    cfg = default_data_config("synthetic")
    cfg.image_size, cfg.num_train, cfg.synthetic_jpeg_shape = size, num_records, tuple(jpeg_shape)
    threads = variant.endswith("_threads")
    variant = variant.removesuffix("_threads")
    cfg.num_workers, cfg.prefetch = (0, workers) if threads else (workers, 2)
    a = cfg.augment
    a.random_resized_crop, a.crop_scale, a.hflip = True, CROP_SCALE, True
    full = variant == "deit3"
    a.three_augment, a.color_jitter = full, (0.3 if full else 0.0)
    if variant == "bilinear":
        a.interpolation = "bilinear"
    uint8 = {"normalize": False} if emit == "uint8" else {}  # float32: the default, also of older checkouts
    it = make_train_iterator(cfg, global_batch_size=batch, seed=0, process_index=0, process_count=1, **uint8)
    return (lambda: next(it)["image"]), it.close


def tfdata(variant, workers, batch, jpeg_shape, num_records, size=224, emit="uint8"):
    """(next images, close) of big_vision's Inception crop + flip recipe, written for this benchmark with tf.data
    (see the docstring). `variant`: 'base', 'bicubic' or 'deit3'; `emit`: 'uint8' or 'float32' (normalised)."""
    import numpy as np
    import tensorflow as tf

    from layerscale_jax.data.sources import SyntheticSource

    bicubic, deit3 = variant in ("bicubic", "deit3"), variant == "deit3"

    pool = SyntheticSource("train", num_records, size, 3, 10, tuple(jpeg_shape))._make_jpeg_pool()
    records = tf.constant(pool)
    mean, std = tf.constant(MEAN, tf.float32), tf.constant(STD, tf.float32)

    def element(q):
        data = tf.gather(records, q % len(pool))
        seed = tf.stack([tf.constant(0, tf.int64), q])
        begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.image.extract_jpeg_shape(data), tf.zeros([1, 0, 4], tf.float32), seed=seed, min_object_covered=0.0,
            area_range=CROP_SCALE, aspect_ratio_range=CROP_RATIO, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], crop_size[0], crop_size[1]])
        image = tf.io.decode_and_crop_jpeg(data, window, channels=3)
        image = tf.image.resize(image, [size, size], method="bicubic" if bicubic else "bilinear", antialias=bicubic)
        image = tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8)  # big_vision's resize op casts back
        image = tf.image.stateless_random_flip_left_right(image, seed + 1)
        if deit3:
            image = tf.cast(three_augment_and_jitter(tf.cast(image, tf.float32), seed + 2), tf.uint8)
        if emit == "float32":
            return (tf.cast(image, tf.float32) / 255.0 - mean) / std
        return image                                                         # uint8, as ours with --emit uint8

    luma_weights = tf.constant([0.299, 0.587, 0.114], tf.float32)          # PIL's "L" conversion

    def luma(image):
        return tf.reduce_sum(image * luma_weights, axis=-1, keepdims=True)

    def blur(image, sigma):
        taps = tf.range(-6, 7, dtype=tf.float32)
        kernel = tf.exp(-0.5 * (taps / sigma) ** 2)
        kernel = tf.tile((kernel / tf.reduce_sum(kernel))[:, None, None], [1, 3, 1])      # [13, channels, 1]
        x = tf.pad(image[None], [[0, 0], [6, 6], [6, 6], [0, 0]], mode="REFLECT")
        x = tf.nn.depthwise_conv2d(x, kernel[:, None], [1, 1, 1, 1], "VALID")           # along rows
        x = tf.nn.depthwise_conv2d(x, kernel[None], [1, 1, 1, 1], "VALID")              # along columns
        return x[0]

    def three_augment_and_jitter(image, seed):
        choice = tf.random.stateless_uniform([], seed, 0, 3, tf.int32)
        sigma = tf.random.stateless_uniform([], seed + 1, 0.1, 2.0)
        image = tf.switch_case(choice, [lambda: tf.tile(luma(image), [1, 1, 3]),
                                        lambda: tf.where(image < 128.0, image, 255.0 - image),
                                        lambda: blur(image, sigma)])
        factors = tf.random.stateless_uniform([3], seed + 2, 0.7, 1.3)
        image = tf.clip_by_value(image * factors[0], 0.0, 255.0)                            # brightness
        image = tf.clip_by_value((image - tf.reduce_mean(luma(image))) * factors[1]
                                 + tf.reduce_mean(luma(image)), 0.0, 255.0)                # contrast
        return tf.clip_by_value((image - luma(image)) * factors[2] + luma(image), 0.0, 255.0)   # saturation

    options = tf.data.Options()
    options.threading.private_threadpool_size = workers
    options.threading.max_intra_op_parallelism = 1
    ds = (tf.data.Dataset.range(np.int64(2**62)).map(element, num_parallel_calls=workers, deterministic=True)
          .batch(batch, drop_remainder=True).prefetch(2).with_options(options))
    it = ds.as_numpy_iterator()
    return (lambda: next(it)), (lambda: None)


def child(args):
    """Runs one contender in this process and prints its result as one JSON line."""
    side, variant = args.child.split("@")[0].split("_", 1)
    build = ours if side == "ours" else tfdata
    next_batch, close = build(variant, args.workers[0], args.batch, args.jpeg_shape, args.num_records, args.size,
                              args.emit)
    try:
        result = timed(args.batches, args.warmup, args.batch, next_batch)
    finally:
        close()
    print(json.dumps({"contender": args.child, "workers": args.workers[0], **result}), flush=True)


# ----------------------------------------------------------------------------------------------- the runner


def run_child(contender, workers, args):
    from layerscale_jax.runtime.malloc import huge_page_malloc_supported, malloc_environment, tcmalloc_library

    package_root = args.baseline if contender.endswith("@baseline") else REPO
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
           "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", contender, "--workers", str(workers),
           "--batch", str(args.batch), "--batches", str(args.batches), "--warmup", str(args.warmup),
           "--num-records", str(args.num_records), "--jpeg-shape", *map(str, args.jpeg_shape),
           "--size", str(args.size), "--emit", args.emit]
    env = malloc_environment(env, tcmalloc_library(), huge_page_malloc_supported()) or env  # as the train command
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{contender} workers={workers}: exit {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    return json.loads(lines[-1])


def same_output(runs):
    """Every run's batch shape and dtype, which must be one: else the contenders did not do the same work."""
    kinds = {(tuple(r["batch_shape"]), r["dtype"]) for r in runs}
    if len(kinds) != 1:
        raise SystemExit("error: the contenders emitted different batches, so their ratios would compare different "
                         "work: " + "; ".join(f"{r['contender']}: {r['dtype']} {r['batch_shape']}" for r in runs))
    return kinds.pop()


def summarize(runs, contenders, workers, cpu):
    """Medians over rounds per (contender, workers); ours / tf.data per CPU-second and in wall-clock images/s, for
    each of ours against its peers (`PEERS`); wall-clock speedup from the fewest to the most workers. Each row and
    ratio names `cpu`, the CPU they were measured on."""
    rows = []
    for name in contenders:
        for w in workers:
            rs = [r for r in runs if r["contender"] == name and r["workers"] == w]
            rows.append({"contender": name, "workers": w, "rounds": len(rs), "cpu": cpu,
                         **{k: statistics.median(r[k] for r in rs)
                            for k in ("images_per_s", "images_per_cpu_s", "main_process_cpu_ms_per_image")}})
    by = {(r["contender"], r["workers"]): r for r in rows}
    ratios = {}
    for name in contenders:
        for peer in PEERS.get(name.split("@")[0], ()):
            for w in workers:
                if (peer, w) in by:
                    ratios[f"{name}/{peer} workers={w}"] = {"cpu": cpu, **{
                        k: by[name, w][k] / by[peer, w][k] for k in ("images_per_cpu_s", "images_per_s")}}
    scaling = {f"{name} workers={min(workers)}->{max(workers)}":
               by[name, max(workers)]["images_per_s"] / by[name, min(workers)]["images_per_s"]
               for name in contenders if len(set(workers)) > 1}
    return rows, ratios, scaling


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="grain worker processes / tf.data threads")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=20, help="timed batches per run")
    p.add_argument("--warmup", type=int, default=3, help="batches before timing")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jpeg-shape", type=int, nargs=2, default=[375, 500], metavar=("H", "W"))
    p.add_argument("--size", type=int, default=224, help="output image side (px)")
    p.add_argument("--emit", default="uint8", choices=EMITS, help="what both sides emit (the docstring)")
    p.add_argument("--num-records", type=int, default=4096)
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    p.add_argument("--baseline", default=None, help="a directory holding an earlier commit's layerscale_jax")
    p.add_argument("--out", default=None, help="results file (default: benchmarks/results/input_peer_<machine>_"
                                               "<date>.json; '-' prints only)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    sys.path.insert(0, REPO)
    from layerscale_jax.bench import timing
    from layerscale_jax.bench.entries import results_name

    if args.baseline and not os.path.isdir(os.path.join(args.baseline, "layerscale_jax")):
        raise SystemExit(f"error: --baseline {args.baseline!r} holds no layerscale_jax/ directory")
    contenders = list(args.contenders)
    if args.baseline:
        contenders += [c + "@baseline" for c in args.contenders if c in ("ours_base", "ours_deit3")]
    machine = timing.machine_info()
    load_start = timing.load_average()
    runs = []
    for r in range(args.rounds):
        for name in contenders:
            for w in args.workers:
                runs.append({"round": r, **run_child(name, w, args), "load_average": timing.load_average()})
                x = runs[-1]
                print(f"round {r} {name:26s} workers={w}: {x['images_per_s']:7.1f} images/s, "
                      f"{x['images_per_cpu_s']:7.1f} per CPU-s, {x['dtype']} {x['batch_shape']} "
                      f"(load {x['load_average'][0]}, {machine['cpu']})", flush=True)
    shape, dtype = same_output(runs)
    rows, ratios, scaling = summarize(runs, contenders, args.workers, machine["cpu"])
    print(f"\nboth sides emit {dtype} {list(shape)}\n"
          "| contender | workers | images/s | images per CPU-s | main process CPU-ms per image | CPU |\n"
          "|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['contender']} | {row['workers']} | {row['images_per_s']:.0f} | {row['images_per_cpu_s']:.0f} | "
              f"{row['main_process_cpu_ms_per_image']:.2f} | {row['cpu']} |")
    for k, v in ratios.items():
        print(f"{k}: {v['images_per_cpu_s']:.2f}x per CPU-second, {v['images_per_s']:.2f}x wall clock ({v['cpu']}, "
              f"{dtype} out)")
    for k, v in scaling.items():
        print(f"{k}: {v:.2f}x wall clock ({machine['cpu']})")
    result = {"benchmark": "input_peer", "command": " ".join([os.path.relpath(__file__, REPO), *sys.argv[1:]]),
              "machine": machine, "load_average_start": load_start, "load_average_end": timing.load_average(),
              "settings": {k: getattr(args, k) for k in ("workers", "batch", "batches", "warmup", "rounds",
                                                         "jpeg_shape", "size", "emit", "num_records", "baseline")},
              "summary": rows, "ratios": ratios, "worker_scaling_wall_clock": scaling, "runs": runs}
    if args.out != "-":
        out = args.out or os.path.join(REPO, "benchmarks", "results",
                                       f"input_peer_{results_name(machine)}_{datetime.date.today()}"
                                       + ("_float32" * (args.emit == "float32")) + ".json")
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
