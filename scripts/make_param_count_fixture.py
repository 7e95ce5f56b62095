"""Record timm's parameter count for every registered model name that timm also has.

Run by hand from the repository root with an environment that has torch and timm (not the project's own; the
package is imported from the checkout, so it need not be installed there):

    PYTHONPATH=. /work/venv-timm/bin/python scripts/make_param_count_fixture.py

Writes ``tests/fixtures/timm_param_counts.json``: ``{name: count}`` at ``num_classes=1000`` plus the timm and
torch versions. Models are built on the ``meta`` device (shapes only, no memory, no init), so every name takes
well under a second; ``tests/test_param_counts.py`` compares our abstract counts against it.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import timm
import torch

from layerscale_jax import list_models

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT = REPO_ROOT / "tests" / "fixtures" / "timm_param_counts.json"


def timm_param_count(name: str) -> int:
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, num_classes=1000)
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    counts, skipped = {}, []
    timm_names = set(timm.list_models())
    for name in list_models():
        if name not in timm_names:
            skipped.append(name)
            continue
        start = time.perf_counter()
        counts[name] = timm_param_count(name)
        print(f"{name:<28} {counts[name]:>13,d}  ({time.perf_counter() - start:.2f}s)")
    record = {
        "description": "timm parameter counts (sum of numel over model.parameters()), num_classes=1000, "
                       "built with pretrained=False on torch.device('meta')",
        "generator": "scripts/make_param_count_fixture.py",
        "timm_version": timm.__version__,
        "torch_version": torch.__version__,
        "not_in_timm": skipped,
        "counts": counts,
    }
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(REPO_ROOT)}: {len(counts)} models, not in timm: {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
