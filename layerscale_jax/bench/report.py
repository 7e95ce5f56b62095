"""Printing results: one generic printer for every entry (``show``) and docs/performance.md's table (``report``).

A value is formatted by its key: ``*_s`` seconds (ms below 1 s), ``*_bytes`` MiB, ``*flop_per_s`` GFLOP/s,
``*flops*`` GFLOP, ``mfu``/``hfu`` percent, ``*overhead`` signed percent, ``target_met`` met/MISSED. No jax here.
"""
from __future__ import annotations

import json

REASONS = ("error", "skipped", "timm_skipped")


def get(tree, path: str):
    """``tree["a"]["b"]`` for ``path="a.b"``; None where a key is missing."""
    for key in path.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def fmt(path: str, v) -> str:
    key = path.rsplit(".", 1)[-1]
    if v is None or isinstance(v, (str, dict, list, tuple)):
        return "n/a" if v is None else v if isinstance(v, str) else json.dumps(v, default=str)
    if isinstance(v, bool):
        return ("met" if v else "MISSED") if key.endswith("target_met") else str(v)
    if key.endswith("_bytes"):
        return f"{v / 2 ** 20:,.1f} MiB"
    if key.endswith("flop_per_s") or "flops" in key and "over" not in key:
        return f"{v / 1e9:,.1f} " + ("GFLOP/s" if key.endswith("flop_per_s") else "G")
    if key.endswith("overhead") or key in ("mfu", "hfu", "timm_mfu"):
        return f"{100 * v:+.2f}%" if key.endswith("overhead") else f"{100 * v:.1f}%"
    if key.endswith("img_per_s"):
        return f"{v:,.1f}"
    if key.endswith(("_s", "_s_per_round")) and isinstance(v, float):
        return f"{v * 1e3:.2f} ms" if v < 1 else f"{v:.2f} s"
    return f"{v:.3f}" if isinstance(v, float) else f"{v:,}"


def show(result, columns: tuple = ()) -> None:
    """Print ``result``: a table of ``columns`` (those some row has) for each list of rows in it, then every other
    value but bulky ones (rows, per-repeat times, the machine) one per line, then an error or skip reason if any."""
    if not isinstance(result, dict):
        return print(result)
    bulky = lambda v: (isinstance(v, list) and (len(v) > 4 or any(isinstance(x, dict) for x in v))  # noqa: E731
                       or isinstance(v, dict) and ("times_s" in v or any(map(bulky, v.values()))))
    for rows in [v for v in result.values() if isinstance(v, list) and v and isinstance(v[0], dict)]:
        cols = [c for c in columns if any(get(r, c) is not None for r in rows)]
        cells = [cols] + [[fmt(c, get(r, c)) for c in cols] for r in rows]
        widths = [max(len(line[i]) for line in cells) for i in range(len(cols))]
        print("\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells))
    for key, value in result.items():
        if not bulky(value) and key not in (*REASONS, "machine"):
            print(f"  {key:<32} {fmt(key, value)}")
    for reason in REASONS:
        if result.get(reason):
            print(f"  {reason}: {result[reason]}")



def step_label(spec: dict) -> str:
    """A ``StepSpec.describe()`` in a few words: the model, the overrides that set its size, batch, scan, remat."""
    size = [f"{k}={v}" for k, v in spec.get("overrides", {}).items() if k in ("img_size", "embed_dim", "depth")]
    return ", ".join([spec["model"] + (f" ({', '.join(size)})" if size else ""), f"batch {spec['batch']}",
                      *["scanned"] * bool(spec.get("scan")),
                      *[f"remat {spec['remat']}"] * (spec.get("remat", "none") != "none")])


def report(*files: dict) -> str:
    """docs/performance.md's table (markdown) from one or more results files of ``all`` (e.g. one per CPU kind):
    each row names its CPU (from the row's or its entry's ``machine``, else the file's); a benchmark measured in
    several files gets one row per file, next to each other, in the first file's order."""
    rows, notes, footers = {}, [], []
    for results in files:
        lines, footer = _report_rows(results, notes)
        for label, line in lines:
            rows.setdefault(label, []).append(line)
        footers.append(footer)
    return "\n".join([
        "| benchmark | ours | timm | ours / timm | ours / peer | MFU ours / timm | target | CPU |",
        "|---|---|---|---|---|---|---|---|", *(line for same in rows.values() for line in same), "", *notes,
        *footers])


def _report_rows(results: dict, notes: list) -> tuple[list, str]:
    """``([(label, markdown row)], footer)`` of one results file; peer labels appended to ``notes``."""
    e, lines = results["entries"], []
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    vs = lambda r, k: f"**{r[k]:.2f}×** (paired {r[k + '_paired']:.2f}×)" if r.get(k) is not None else ""  # noqa

    def row(sources, label, ours, timm="", vs_timm="", vs_peer="", mfu="", target="—"):
        cpu = next((s["machine"]["cpu"] for s in (*sources, results) if "cpu" in s.get("machine", {})), "?")
        lines.append((label, "|" + "|".join(f" {c} " if c else " " for c in (label, ours, timm, vs_timm, vs_peer,
                                                                              mfu, target, cpu)) + "|"))

    def step_row(r, entry, label, digits, target):
        timm = "" if r.get("timm_img_per_s") is None else f"{r['timm_img_per_s']:.{digits}f} img/s"
        row((r, entry), label, f"{r['img_per_s']:.{digits}f} img/s", timm, vs(r, "ratio_vs_timm"),
            vs(r, "ours_over_peer"), f"{pct(r['mfu'])} / {pct(r.get('timm_mfu'))}", target)
        if r.get("peer") and (note := f"ours / peer: {r['peer']}.") not in notes:
            notes.append(note)

    for dtype in ("float32", "bfloat16"):
        if "img_per_s" in (r := e.get(f"train_step_deit3_small_b16_{dtype}", {})):
            step_row(r, r, f"DeiT III-S/16 train step, {dtype}, batch 16", 2, "—" if dtype == "bfloat16" else "≥ 1.0×")
    for r in e.get("ablation", {}).get("rows", []):
        step_row(r, e["ablation"], f"ablation model, depth {r['overrides']['depth']}, batch 128, float32", 0,
                 "≥ 1.0×")
    for r in e.get("layerscale", {}).get("rows", []):
        row((r, e["layerscale"]), f"LayerScale vs `none` step time, {r['case']}",
            f"{r['layerscale_step_s'] * 1e3:.0f} ms vs {r['none_step_s'] * 1e3:.0f} ms", "",
            f"overhead **{100 * r['overhead']:+.1f}%** (XLA bytes accessed "
            f"{100 * r['bytes_accessed_overhead']:+.1f}%)", target="≤ 2%")
    for layout, name, target in (("scan", "scanned", "≤ 1.5×"), ("unrolled", "unrolled", "—")):
        if q := e.get("depth", {}).get("ratios", {}).get(layout):
            row((e["depth"],), f"compile time, {name} depth 96 / depth 12", f"{q['compile_ratio']:.2f}×",
                target=target)
    for policy, q in e.get("memory", {}).get("ratios_at_max_depth", {}).items():
        if policy != "none":
            rss = "n/a" if q["rss"] is None else f"{q['rss']:.2f}×"
            row((e["memory"],), f"peak memory at depth 96, remat `{policy}` / none",
                f"{q['xla_peak']:.2f}× (XLA plan), {rss} (RSS)", target="≤ 0.33×" if policy == "full" else "—")
    sd, pl, mm = (e.get(k, {}) for k in ("seeds", "pipeline", "matmul"))
    if "speedup" in sd:
        row((sd,), f"{sd['num_seeds']} seeds in one vmapped step vs one after another", f"{sd['speedup']:.2f}×")
    if "pipeline_over_step" in pl:
        row((pl,), "digits input pipeline / ablation train step", f"{pl['pipeline_img_per_s']:,.0f} vs "
            f"{pl['train_step_img_per_s']:,.0f} img/s = {pl['pipeline_over_step']:.0f}×", target="> 1×")
    for pf in (v for k, v in sorted(e.items()) if k.startswith("page_faults") and "speedup" in v):
        value = f"huge pages {pf['speedup']:.2f}× faster, {pf['fault_ratio']:.0f}× fewer page faults"
        if "tcmalloc_speedup" in pf:
            faults = pf["tcmalloc"]["minor_faults"]
            value += f"; TCMalloc {pf['tcmalloc_speedup']:.2f}×, " + (
                f"{pf['tcmalloc_fault_ratio']:.0f}× fewer" if faults >= 1 else "no page faults")
        row((pf,), f"malloc vs glibc's 4 KiB pages, {step_label(pf['spec'])} step", value)
    if mm:
        row((mm,), "matmul peak (MFU denominator), 2048², float32 / bfloat16",
            f"{mm['float32']['flop_per_s'] / 1e9:.0f} / {mm['bfloat16']['flop_per_s'] / 1e9:.0f} GFLOP/s")
    for r in e.get("trainer_step", {}).get("rows", []):
        row((r, e["trainer_step"]), f"trainer step / model-only step, `{r['config'].split('configs/')[-1]}` (depth "
            f"{r['depth']}, batch {r['batch']})", f"{r['trainer_step_s'] * 1e3:.1f} ms vs "
            f"{r['model_only_step_s'] * 1e3:.1f} ms", "", f"**{r['trainer_over_model_only']:.2f}×** (paired "
            f"{r['trainer_over_model_only_paired']:.2f}×; optimizer update vs plain AdamW "
            f"{r['optimizer_update']['ratio']:.2f}×)", target="≤ 1.15×")
    opt = e.get("optimizer", {})
    for layout, decay in [(layout, decay) for layout in ("unrolled", "scan") for decay in (0.75, 1.0)]:
        if rs := [r for r in opt.get("rows", []) if r["layout"] == layout and r["layer_decay"] == decay]:
            row((opt,), f"optimizer update / plain AdamW + clipping, {layout}, layer decay {decay:g}, depth "
                + "/".join(str(r["depth"]) for r in rs), ", ".join(f"{r['ours_s'] * 1e3:.1f}/{r['plain_s'] * 1e3:.1f}"
                                                                   for r in rs) + " ms", "",
                "**" + ", ".join(f"{r['ratio']:.2f}" for r in rs) + "×**", target="≤ 1.2×")
    m = results.get("machine", {})
    commands = [c for c in [results.get("command")] + [r.get("command") for r in results.get("reruns", [])] if c]
    return lines, " ".join([
        *(["Command(s): " + "; then ".join(f"`{c}`" for c in commands) + "."] if commands else []),
        f"Measured {results.get('started', '?')} on {m.get('cpu', '?')} ({m.get('cpu_threads', '?')} threads, "
        f"{m.get('backend', '?')}), jax {m.get('jax', '?')}; load average {results.get('load_average_start')} at the "
        f"start, {results.get('load_average_end')} at the end.\n"])


def summarize(results: dict) -> dict:
    """Every target of the suite with its verdict: ``{entry or entry/row index: {"target...": ..., ...}}``."""
    return {name if i == 0 else f"{name}/{i - 1}": t for name, r in results["entries"].items()
            for i, x in enumerate([r, *r.get("rows", [])])
            if (t := {k: v for k, v in x.items() if k.startswith("target") or k.endswith("target_met")})}
