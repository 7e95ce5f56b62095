"""The JPEG train path stage by stage, this checkout against an earlier one, in one process.

    python benchmarks/bench_input_stages.py --baseline DIR [--repeats 7] [--jpeg-shape 375 500] [--json]
                                            [--tensorflow-default-threads]

DIR holds an earlier commit's package (`git archive COMMIT layerscale_jax | tar -x -C DIR`); its
`data/transforms.py` is loaded beside this checkout's. Each stage runs the same inputs through both versions,
timed alternately (baseline, ours, baseline, ...: a change of load hits both), in CPU-seconds of this process
(one thread), median over repeats, per image:

  decode_crop   JPEG bytes -> random-resized crop to 224 (the same generator seeds on both sides)
  bilinear      the same crops with `data.augment.interpolation="bilinear"` (big_vision's filter), the baseline's
                against ours (left out when the baseline has no bilinear crop)
  bilinear_vs_bicubic
                this checkout's default bicubic crop ("baseline" column) against its bilinear one ("ours")
  hflip         64 images of 224 px, half mirrored: the baseline's numpy flip of the batch against ours on the DeiT
                III path, where the images are mirrored in PIL (`transpose`) before 3-Augment
  hflip_numpy   the same flip on the crop + flip path (no per-image PIL ops): the baseline's numpy flip against ours
  normalize     64 images into the float32 batch (the baseline's pipeline assigned a new array into it)
  handover      a batch of 64 from a grain worker process to the train loop, both sides in this process: the
                baseline normalised it in the worker, grain copied the float32 batch into shared memory, the loop
                copied it out; ours hands over uint8 and normalises it out of shared memory after the boundary
  draft_half    where a bicubic crop's time goes: a full PIL decode of the JPEG ("baseline") against the decode at
                half size in the DCT domain (`Image.draft`, libjpeg's scaled IDCT: the REFERENCE's reduced-size
                decode, which `decode_random_resized_crop` uses for crops at least twice the output size)
  bicubic_resize  the rest of it: PIL's antialiased bicubic resize of a 300 px box of the decoded image to 224
                ("ours") against PIL's bilinear resize of the same box ("baseline")
  jitter        colour jitter 0.3 (random factors and order) on one 224 px PIL image
  three_augment 3-Augment (one of grayscale, solarize, blur) on one 224 px PIL image
"""

import argparse
import importlib.util
import inspect
import io
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from grain.multiprocessing import SharedMemoryArray  # noqa: E402

from layerscale_jax.bench import timing  # noqa: E402
from layerscale_jax.data import transforms  # noqa: E402
from layerscale_jax.data.sources import SyntheticSource  # noqa: E402

SIZE, BATCH, SCALE = 224, 64, (0.08, 1.0)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def load_baseline(root):
    path = os.path.join(root, "layerscale_jax", "data", "transforms.py")
    spec = importlib.util.spec_from_file_location("baseline_transforms", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stages(old, jpeg_shape):
    """{stage: (images per call, {"baseline": fn(i), "ours": fn(i)})}."""
    pool = SyntheticSource("train", 16, SIZE, 3, 10, tuple(jpeg_shape))._make_jpeg_pool()
    rng = np.random.default_rng(0)
    x = np.stack([transforms.decode_random_resized_crop(pool[i % 16], 3, SIZE, SCALE, rng) for i in range(BATCH)])
    flip = rng.random(BATCH) < 0.5
    out = np.empty(x.shape, np.float32)
    pils = [transforms.to_pil(img) for img in x]
    factors, orders = rng.uniform(0.7, 1.3, (BATCH, 3)), np.argsort(rng.random((BATCH, 3)), axis=1)
    choice, sigma = rng.integers(0, 3, BATCH), rng.uniform(0.1, 2.0, BATCH)

    def crop(mod, i):
        r = np.random.default_rng([0, 2, i])
        if hasattr(mod, "decode_random_resized_crop"):
            return mod.decode_random_resized_crop(pool[i % 16], 3, SIZE, SCALE, r)
        return mod.random_resized_crop(mod.decode_image(pool[i % 16], 3), SIZE, SCALE, r)

    def flip_in_pil(i):  # the DeiT III path flips where the image is in PIL anyway (pipeline `per_image`)
        return [img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) for img, f in zip(pils, flip) if f]

    def normalize_old(i):
        for c in range(BATCH):
            out[c : c + 1] = old.normalize(x[c : c + 1], MEAN, STD)

    def normalize_new(i):
        for c in range(BATCH):
            transforms.normalize(x[c : c + 1], MEAN, STD, out[c : c + 1])

    def handover(batch):
        """grain's worker -> main handover of one array (`copy_to_shm`, then `open_from_shm` in the receiver)."""
        shared = SharedMemoryArray(batch.shape, batch.dtype)
        np.copyto(shared, batch)
        received = SharedMemoryArray.from_metadata(shared.metadata)
        received.unlink_on_del()
        return received

    def handover_old(i):
        batch = np.empty(x.shape, np.float32)
        transforms.normalize(x, MEAN, STD, batch)
        return np.array(handover(batch), copy=True)

    def handover_new(i):
        return transforms.normalize(handover(x), MEAN, STD)

    def crop_with(mod, interpolation, i):
        r = np.random.default_rng([0, 2, i])
        return mod.decode_random_resized_crop(pool[i % 16], 3, SIZE, SCALE, r, interpolation)

    def decode(i, scale):
        img = Image.open(io.BytesIO(pool[i % 16]))
        if scale > 1:
            img.draft("RGB", (img.size[0] // scale, img.size[1] // scale))
        img.load()
        return img

    decoded = decode(0, 1)
    box = (50, 40, 350, 340)

    bilinear = {"baseline": lambda i: crop_with(old, "bilinear", i),
                "ours": lambda i: crop_with(transforms, "bilinear", i)}
    return {
        "decode_crop": (1, {"baseline": lambda i: crop(old, i), "ours": lambda i: crop(transforms, i)}),
        **({"bilinear": (1, bilinear)}
           if "interpolation" in inspect.signature(old.decode_random_resized_crop).parameters else {}),
        "bilinear_vs_bicubic": (1, {"baseline": lambda i: crop_with(transforms, "bicubic", i),
                                    "ours": lambda i: crop_with(transforms, "bilinear", i)}),
        "draft_half": (1, {"baseline": lambda i: decode(i, 1), "ours": lambda i: decode(i, 2)}),
        "bicubic_resize": (1, {"baseline": lambda i: decoded.resize((SIZE, SIZE), Image.BILINEAR, box=box),
                               "ours": lambda i: decoded.resize((SIZE, SIZE), Image.BICUBIC, box=box)}),
        "hflip": (BATCH, {"baseline": lambda i: old.hflip(x, flip), "ours": flip_in_pil}),
        "hflip_numpy": (BATCH, {"baseline": lambda i: old.hflip(x, flip), "ours": lambda i: transforms.hflip(x, flip)}),
        "normalize": (BATCH, {"baseline": normalize_old, "ours": normalize_new}),
        "handover": (BATCH, {"baseline": handover_old, "ours": handover_new}),
        "jitter": (1, {m: (lambda i, mod=mod: mod.color_jitter(pils[i % BATCH], factors[i % BATCH],
                                                              orders[i % BATCH]))
                       for m, mod in (("baseline", old), ("ours", transforms))}),
        "three_augment": (1, {m: (lambda i, mod=mod: mod.three_augment(pils[i % BATCH], choice[i % BATCH],
                                                                      sigma[i % BATCH]))
                              for m, mod in (("baseline", old), ("ours", transforms))}),
    }


def race(per_call, fns, repeats, calls):
    """Median CPU milliseconds per image of each contender, timed alternately."""
    times = {name: [] for name in fns}
    for name, fn in fns.items():  # warm-up
        fn(0)
    for r in range(repeats):
        for name, fn in fns.items():
            c = time.process_time()
            for i in range(calls):
                fn(r * calls + i)
            times[name].append((time.process_time() - c) / (calls * per_call) * 1e3)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {"ms_per_image": med, "speedup": med["baseline"] / med["ours"], "times_ms": times}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="a directory holding an earlier commit's layerscale_jax")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=64, help="calls per repeat (images for per-image stages)")
    p.add_argument("--jpeg-shape", type=int, nargs=2, default=[375, 500], metavar=("H", "W"))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--tensorflow-default-threads", action="store_true",
                   help="start TensorFlow before the stages, so the bilinear crop finds its thread pools at their "
                        "defaults (one thread per core) instead of setting them to one thread (data.transforms)")
    args = p.parse_args(argv)
    if args.tensorflow_default_threads:
        import tensorflow as tf

        tf.constant(0.0) + 1.0  # the first op starts TensorFlow's runtime: its thread pools are fixed from here
    old = load_baseline(args.baseline)
    load = timing.load_average()
    results = {}
    for name, (per_call, fns) in stages(old, args.jpeg_shape).items():
        calls = max(1, args.calls // per_call)
        results[name] = race(per_call, fns, args.repeats, calls)
        if not args.json:
            r = results[name]
            print(f"{name:14s} baseline {r['ms_per_image']['baseline']:7.3f} ms/image   ours "
                  f"{r['ms_per_image']['ours']:7.3f} ms/image   {r['speedup']:5.2f}x", flush=True)
    if args.json:
        print(json.dumps({"benchmark": "input_stages", "cpu": timing.cpu_model(), "jpeg_shape": args.jpeg_shape,
                          "tensorflow_default_threads": args.tensorflow_default_threads,
                          "load_average_start": load, "load_average_end": timing.load_average(),
                          "stages": results}, indent=1))


if __name__ == "__main__":
    main()
