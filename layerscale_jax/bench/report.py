"""Printing results: one generic table printer for every entry, and the README's Performance table (``report``).

``show`` prints any result dict from the columns its entry names (dotted paths into the dict); a value is
formatted by its key: ``*_s`` seconds (ms below 1 s), ``*_bytes`` MiB, ``*flop_per_s`` GFLOP/s, ``*flops*``
GFLOP, ``mfu``/``hfu``/``overhead`` percent, ``target_met`` met/MISSED. ``report`` renders a results file of
``all`` as the markdown table in README.md; ``summarize`` lists the issue's targets against the measured values.
This module imports nothing else of the bench, so reading a results file needs no jax.
"""
from __future__ import annotations

import json


def get(tree, path: str):
    """``tree["a"]["b"]`` for ``path="a.b"``; None where a key is missing."""
    for key in path.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def fmt(path: str, v) -> str:
    """A value formatted by its key's suffix (see the module docstring)."""
    key = path.rsplit(".", 1)[-1]
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return ("met" if v else "MISSED") if key.endswith("target_met") else str(v)
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, default=str)
    if isinstance(v, str):
        return v
    if key.endswith("_bytes"):
        return f"{v / 2 ** 20:,.1f} MiB"
    if key.endswith("flop_per_s"):
        return f"{v / 1e9:,.1f} GFLOP/s"
    if "flops" in key and "over" not in key:
        return f"{v / 1e9:,.1f} G"
    if key in ("mfu", "hfu", "timm_mfu") or key.endswith("overhead"):
        return f"{100 * v:+.2f}%" if key.endswith("overhead") else f"{100 * v:.1f}%"
    if key.endswith("img_per_s"):
        return f"{v:,.1f}"
    if key.endswith(("_s", "_s_per_round")) and isinstance(v, float):
        return f"{v * 1e3:.2f} ms" if v < 1 else f"{v:.2f} s"
    return f"{v:.3f}" if isinstance(v, float) else f"{v:,}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table, columns right-aligned to their widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [headers, *rows])


def show(result, tables: dict[str, tuple[str, ...]] | None = None, fields: tuple[str, ...] = ()) -> None:
    """Print ``result``: each ``tables[key]`` is the columns of the row list ``result[key]`` (a result without that
    key is shown as one row), then ``fields`` one per line, then an error or skip reason if there is one."""
    if not isinstance(result, dict):
        print(result)
        return
    for key, columns in (tables or {}).items():
        rows = result.get(key, [result])
        print(table(list(columns), [[fmt(c, get(r, c)) for c in columns] for r in rows]))
    for f in fields:
        if get(result, f) is not None:
            print(f"  {f:<32} {fmt(f, get(result, f))}")
    for reason in ("error", "skipped", "timm_skipped"):
        if result.get(reason):
            print(f"  {reason}: {result[reason]}")


# ---- the README's Performance table ----------------------------------------------------------------------------


def _md_row(*cells: str) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def report(results: dict) -> str:
    """The README's Performance table (markdown) from a results file of ``all``."""
    e = results["entries"]
    lines = [_md_row("benchmark", "ours", "timm", "ours / timm", "MFU ours / timm", "target"),
             "|---|---|---|---|---|---|"]
    for dtype in ("float32", "bfloat16"):
        r = e.get(f"train_step_deit3_small_b16_{dtype}", {})
        if "img_per_s" in r:
            lines.append(_md_row(
                f"DeiT III-S/16 train step, {dtype}, batch 16", f"{r['img_per_s']:.2f} img/s",
                f"{r['timm_img_per_s']:.2f} img/s",
                f"**{r['ratio_vs_timm']:.2f}×** (paired {r['ratio_vs_timm_paired']:.2f}×)",
                f"{_pct(r['mfu'])} / {_pct(r.get('timm_mfu'))}", "≥ 1.0×" if dtype == "float32" else "—"))
    for r in e.get("ablation", {}).get("rows", []):
        lines.append(_md_row(
            f"ablation model, depth {r['overrides']['depth']}, batch 128, float32", f"{r['img_per_s']:.0f} img/s",
            f"{r['timm_img_per_s']:.0f} img/s",
            f"**{r['ratio_vs_timm']:.2f}×** (paired {r['ratio_vs_timm_paired']:.2f}×)",
            f"{_pct(r['mfu'])} / {_pct(r.get('timm_mfu'))}", "≥ 1.0×"))
    for r in e.get("layerscale", {}).get("rows", []):
        lines.append(_md_row(
            f"LayerScale vs `none` step time, {r['case']}",
            f"{r['layerscale_step_s'] * 1e3:.0f} ms vs {r['none_step_s'] * 1e3:.0f} ms", "",
            f"overhead **{100 * r['overhead']:+.1f}%** (XLA bytes accessed {100 * r['bytes_accessed_overhead']:+.1f}%)",
            "", "≤ 2%"))
    ratios = e.get("depth", {}).get("ratios", {})
    for layout, target in (("scan", "≤ 1.5×"), ("unrolled", "—")):
        if layout in ratios:
            name = "scanned" if layout == "scan" else layout
            lines.append(_md_row(f"compile time, {name} depth 96 / depth 12",
                                 f"{ratios[layout]['compile_ratio']:.2f}×", "", "", "", target))
    for policy, q in e.get("memory", {}).get("ratios_at_max_depth", {}).items():
        if policy != "none":
            rss = "n/a" if q["rss"] is None else f"{q['rss']:.2f}×"
            lines.append(_md_row(f"peak memory at depth 96, remat `{policy}` / none",
                                 f"{q['xla_peak']:.2f}× (XLA plan), {rss} (RSS)", "", "", "",
                                 "≤ 0.33×" if policy == "full" else "—"))
    sd, pl, pf, mm = (e.get(k, {}) for k in ("seeds", "pipeline", "page_faults", "matmul"))
    if "speedup" in sd:
        lines.append(_md_row(f"{sd['num_seeds']} seeds in one vmapped step vs one after another",
                             f"{sd['speedup']:.2f}×", "", "", "", "—"))
    if "pipeline_over_step" in pl:
        lines.append(_md_row("digits input pipeline / ablation train step",
                             f"{pl['pipeline_img_per_s']:,.0f} vs {pl['train_step_img_per_s']:,.0f} img/s = "
                             f"{pl['pipeline_over_step']:.0f}×", "", "", "", "> 1×"))
    if "speedup" in pf:
        lines.append(_md_row("huge-page malloc vs 4 KiB pages, DeiT III-S/16 step",
                             f"{pf['speedup']:.2f}× faster, {pf['fault_ratio']:.0f}× fewer page faults", "", "", "",
                             "—"))
    if mm:
        lines.append(_md_row("matmul peak (MFU denominator), 2048², float32 / bfloat16",
                             f"{mm['float32']['flop_per_s'] / 1e9:.0f} / {mm['bfloat16']['flop_per_s'] / 1e9:.0f} "
                             "GFLOP/s", "", "", "", "—"))
    for r in e.get("trainer_step", {}).get("rows", []):
        lines.append(_md_row(
            f"trainer step / model-only step, `{r['config'].split('configs/')[-1]}` (depth {r['depth']}, batch "
            f"{r['batch']})", f"{r['trainer_step_s'] * 1e3:.1f} ms vs {r['model_only_step_s'] * 1e3:.1f} ms", "",
            f"**{r['trainer_over_model_only']:.2f}×** (paired {r['trainer_over_model_only_paired']:.2f}×; optimizer "
            f"update vs plain AdamW {r['optimizer_update']['ratio']:.2f}×)", "", "≤ 1.15×"))
    for layout in ("unrolled", "scan"):
        for decay in (0.75, 1.0):
            rows = [r for r in e.get("optimizer", {}).get("rows", [])
                    if r["layout"] == layout and r["layer_decay"] == decay]
            if rows:
                depths = "/".join(str(r["depth"]) for r in rows)
                ratios = ", ".join(f"{r['ratio']:.2f}" for r in rows)
                lines.append(_md_row(
                    f"optimizer update / plain AdamW + clipping, {layout}, layer decay {decay:g}, depth {depths}",
                    ", ".join(f"{r['ours_s'] * 1e3:.1f}/{r['plain_s'] * 1e3:.1f}" for r in rows) + " ms", "",
                    f"**{ratios}×**", "", "≤ 1.2×"))
    m = results.get("machine", {})
    commands = [c for c in [results.get("command")] + [r.get("command") for r in results.get("reruns", [])] if c]
    lines.append("")
    if commands:
        lines.append("Command(s): " + "; then ".join(f"`{c}`" for c in commands) + ".")
    lines.append(f"Measured {results.get('started', '?')} on {m.get('cpu', '?')} ({m.get('cpu_threads', '?')} threads, "
                 f"{m.get('backend', '?')}), jax {m.get('jax', '?')}; load average {results.get('load_average_start')} "
                 f"at the start, {results.get('load_average_end')} at the end.")
    return "\n".join(lines)


def summarize(results: dict) -> dict:
    """The issue's targets and the measured values, from a results dict."""
    e, s = results["entries"], {}

    def target(name, measured, text, met, **extra):
        s[name] = {"measured": measured, **extra, "target": text, "met": met}

    ts = e.get("train_step_deit3_small_b16_float32", {})
    if ts.get("ratio_vs_timm") is not None:
        target("deit3_small_b16_fp32_vs_timm", ts["ratio_vs_timm"], ">= 1.0", ts["ratio_vs_timm"] >= 1.0)
    for row in e.get("ablation", {}).get("rows", []):
        if row.get("ratio_vs_timm") is not None:
            target(f"ablation_depth{row['overrides']['depth']}_vs_timm", row["ratio_vs_timm"], ">= 1.0",
                   row["ratio_vs_timm"] >= 1.0)
    for row in e.get("layerscale", {}).get("rows", []):
        target(f"layerscale_overhead_{row['case']}", row["overhead"], "<= 0.02", row["overhead"] <= 0.02)
    dep = e.get("depth", {}).get("ratios", {}).get("scan")
    if dep:
        target("scan_compile_depth96_over_12", dep["compile_ratio"], "<= 1.5", dep["compile_ratio"] <= 1.5)
    for row in e.get("trainer_step", {}).get("rows", []):
        target(f"trainer_over_model_only_depth{row['depth']}", row["trainer_over_model_only"], "<= 1.15",
               row["trainer_target_met"])
    opt = e.get("optimizer", {})
    if "worst_ratio" in opt:
        target("optimizer_update_over_plain_adamw_worst", opt["worst_ratio"], "<= 1.2", opt["target_met"])
    mem = e.get("memory", {}).get("ratios_at_max_depth", {}).get("full")
    if mem:
        target("remat_full_peak_memory_depth96_over_none", mem["xla_peak"], "<= 0.333", mem["xla_peak"] <= 1 / 3,
               rss=mem["rss"])
    return s
