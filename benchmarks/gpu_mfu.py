"""GPU train-step rows with MFU on two bases, from the committed results of `gpu_check.sh` and `gpu_check_compile.sh`.

    python benchmarks/gpu_mfu.py [RUN_DIR] [COMPILE_DIR] [--write docs/performance.md]

RUN_DIR (default `benchmarks/results/gpu_h200_2026-12-04`): `gpu_check.sh`'s output, one JSON per train step
(`b16_bf16`, `s16_bf16`, `b16_scan`) and `env.json` (the GPU). COMPILE_DIR (default `..._compile`):
`gpu_check_compile.sh`'s, whose `attention.json` times the B/16 step with XLA's and with cuDNN's attention.

MFU = analytic model FLOPs per step (`bench.flops`, the step JSON's `model_flops_per_step`) / step time / peak, on
two bases:
  measured peak   the bf16 8192² `jnp.matmul` measured in the same run (each step JSON's `matmul_peak_flop_per_s`;
                  the cuDNN row, timed in the second run, against the first run's peak of the same step spec);
  datasheet       NVIDIA's dense bf16 figure for the GPU (`plan.targets.CHIPS`: 989 TFLOP/s for H100 and H200 SXM,
                  https://www.nvidia.com/en-us/data-center/h200/, H200 SXM column: 1,979 TFLOP/s "with sparsity",
                  dense is half).
Prints the markdown table and the one-line summary; `--write FILE` puts them into FILE between the markers
`<!-- gpu_mfu.py NAME -->` and `<!-- /gpu_mfu.py NAME -->` (NAME: `table`, `summary`).
"""

import argparse
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_DIR = os.path.join(REPO, "benchmarks", "results", "gpu_h200_2026-12-04")
# nvidia-smi's / jax's device kind -> plan.targets.CHIPS key (SXM parts: the NVL and PCIe ones have other peaks)
DATASHEET_CHIP = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100"}
# (step JSON of RUN_DIR, row label)
STEPS = (("b16_bf16", "B/16"), ("s16_bf16", "S/16"), ("b16_scan", "B/16, scanned layers"))
GiB = 2 ** 30


def read(path):
    with open(path) as f:
        return json.load(f)


def datasheet_peak(device_kind):
    """(dense bf16 FLOP/s, chip name, source) of NVIDIA's datasheet for `device_kind`."""
    sys.path.insert(0, REPO)
    from layerscale_jax.plan.targets import CHIPS

    if device_kind not in DATASHEET_CHIP:
        raise SystemExit(f"error: no datasheet figure for the device {device_kind!r}: add it to DATASHEET_CHIP")
    chip = CHIPS[DATASHEET_CHIP[device_kind]]
    return chip.peak_bf16_flop_per_s, chip.name, chip.source


def rows(run_dir, compile_dir):
    """One dict per measured step: label, attention, img/s, step time, model FLOPs, both peaks and both MFUs,
    compile time, device peak memory and XLA temporaries (None where the run did not measure them)."""
    device = read(os.path.join(run_dir, "env.json"))["device_kind"]
    datasheet, _, _ = datasheet_peak(device)
    out = []
    for name, label in STEPS:
        r = read(os.path.join(run_dir, f"{name}.json"))
        out.append({"label": label, "attention": "XLA", "spec": {k: r[k] for k in ("model", "batch", "dtype", "scan")},
                    "img_per_s": r["img_per_s"], "step_time_s": r["step_time_s"],
                    "model_flops_per_step": r["model_flops_per_step"], "compile_s": r["compile_s"],
                    "peak_memory_bytes": r["peak_memory_bytes"], "temp_bytes": r["xla_memory"]["temp_size_in_bytes"],
                    "measured_peak": r["matmul_peak_flop_per_s"], "datasheet_peak": datasheet, "device": device})
    if compile_dir and os.path.exists(os.path.join(compile_dir, "attention.json")):
        a = read(os.path.join(compile_dir, "attention.json"))
        spec = {k: a["spec"][k] for k in ("model", "batch", "dtype", "scan")}
        same = [r for r in out if r["spec"] == spec]
        if not same:
            raise SystemExit(f"error: {compile_dir}/attention.json times {spec}, which {run_dir} did not measure: "
                             "no model FLOPs or matmul peak to take")
        base, cudnn = same[0], a["impls"]["cudnn"]
        out.insert(out.index(base) + 1, {
            **base, "label": base["label"], "attention": "cuDNN (second run)", "img_per_s": cudnn["img_per_s"],
            "step_time_s": cudnn["step_time_s"], "compile_s": cudnn["compile_s"], "peak_memory_bytes": None,
            "temp_bytes": cudnn["xla_memory"]["temp_size_in_bytes"]})
    for r in out:
        r["mfu_measured_peak"] = r["model_flops_per_step"] / r["step_time_s"] / r["measured_peak"]
        r["mfu_datasheet"] = r["model_flops_per_step"] / r["step_time_s"] / r["datasheet_peak"]
    return out


def table(rs):
    """The markdown table of docs/performance.md's NVIDIA H200 section."""
    peaks = sorted(r["measured_peak"] for r in rs)
    lines = [f"| DeiT III, batch 256, bf16 | attention | img/s | step | MFU, measured peak ({peaks[0] / 1e12:.0f}–"
             f"{peaks[-1] / 1e12:.0f} TFLOP/s) | MFU, datasheet ({rs[0]['datasheet_peak'] / 1e12:.0f} TFLOP/s) | "
             "compile | peak memory (device) | XLA temporaries |", "|---|---|---|---|---|---|---|---|---|"]
    gib = lambda b: "not measured" if b is None else f"{b / GiB:.1f} GiB"  # noqa: E731
    for r in rs:
        lines.append(f"| {r['label']} | {r['attention']} | {r['img_per_s']:,.0f} | {r['step_time_s'] * 1e3:.1f} ms | "
                     f"{r['mfu_measured_peak']:.2f} | {r['mfu_datasheet']:.2f} | {r['compile_s']:.1f} s | "
                     f"{gib(r['peak_memory_bytes'])} | {gib(r['temp_bytes'])} |")
    return "\n".join(lines)


def summary(rs):
    """The one line of docs/performance.md's summary: B/16's MFU with each attention, on both bases."""
    b16 = [r for r in rs if r["label"] == "B/16"]
    each = ", ".join(f"{100 * r['mfu_measured_peak']:.0f}% with {r['attention'].split(' (')[0]}'s attention"
                     for r in b16)
    sheet = " and ".join(f"{100 * r['mfu_datasheet']:.0f}%" for r in b16)
    return (f"- GPU (DeiT III-B/16 bf16, MFU target ≥ 50%): on an {b16[0]['device']}, {each} against the bf16 matmul "
            f"peak measured in the same run; {sheet} against NVIDIA's datasheet "
            f"({b16[0]['datasheet_peak'] / 1e12:.0f} TFLOP/s dense) — [NVIDIA H200](#nvidia-h200).")


def write(path, blocks):
    """Replaces each marked block of `path` (the docstring) by its new text."""
    with open(path) as f:
        text = f.read()
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- gpu_mfu.py {name} -->\n).*?(\n<!-- /gpu_mfu.py {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"error: {path} has no <!-- gpu_mfu.py {name} --> ... <!-- /gpu_mfu.py {name} --> block")
        text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
    with open(path, "w") as f:
        f.write(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", nargs="?", default=RUN_DIR)
    p.add_argument("compile_dir", nargs="?", default=None, help="default: RUN_DIR + '_compile'")
    p.add_argument("--write", default=None, help="a markdown file with the marked blocks (docs/performance.md)")
    args = p.parse_args(argv)
    rs = rows(args.run_dir, args.compile_dir or args.run_dir.rstrip("/") + "_compile")
    blocks = {"table": table(rs), "summary": summary(rs)}
    print(blocks["table"], blocks["summary"], sep="\n\n")
    if args.write:
        write(args.write, blocks)
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
