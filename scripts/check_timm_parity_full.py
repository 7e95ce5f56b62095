"""Real-size parity check against timm: deit3_small_patch16_224 and cait_xxs24_224, random weights.

Run by hand from the repository root with an environment that has torch, timm and this package's dependencies
(jax, flax, safetensors); the package is imported from the checkout:

    PYTHONPATH=. /work/venv-timm/bin/python scripts/check_timm_parity_full.py [--batch 2] [--tol 1e-4]

For each model and each of two weight draws — timm's own init (LayerScale at 1e-6 / 1e-5, so the blocks barely
matter) and a re-draw of every parameter as the parity fixtures do (LayerScale ~ ±U(0.5, 1.5), so every block
does) — it converts the timm state dict with ``from_timm`` in both layouts, runs both models in float32 eval mode
on the same batch and prints the max abs logit difference. It also exports our model with ``to_timm``, loads that
into a fresh timm model with ``strict=True`` and checks that the state dict comes back bit for bit.
Exit status 1 if any difference exceeds ``--tol``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np
import timm
import torch
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_parity_fixtures import randomize_  # noqa: E402  (the fixtures' re-draw of every parameter)

from layerscale_jax.convert import from_timm, to_timm  # noqa: E402

MODELS = ("deit3_small_patch16_224", "cait_xxs24_224")


def our_logits(model, images: np.ndarray) -> np.ndarray:
    model.eval()
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, images))


def check(name: str, randomized: bool, batch: int, seed: int) -> float:
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False).eval()
    if randomized:
        randomize_(model, seed + 1000)
    images = torch.randn((batch, 3, 224, 224), generator=torch.Generator().manual_seed(seed + 2000))
    with torch.no_grad():
        reference = model(images).numpy()
    state_dict = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    nhwc = images.numpy().transpose(0, 2, 3, 1)
    worst = 0.0
    for scan_layers in (False, True):
        start = time.perf_counter()
        ours = from_timm(name, state_dict, scan_layers=scan_layers)
        diff = float(np.abs(our_logits(ours, nhwc) - reference).max())
        worst = max(worst, diff)
        layout = "scanned " if scan_layers else "unrolled"
        print(f"{name:<24} {'randomised' if randomized else 'timm init '}  {layout}  max|logit| "
              f"{np.abs(reference).max():9.4f}  max abs diff {diff:.3e}  ({time.perf_counter() - start:.1f}s)")

    exported = to_timm(ours)                              # the scanned model
    fresh = timm.create_model(name, pretrained=False)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=True)
    back = fresh.state_dict()
    exact = back.keys() == state_dict.keys() and all(np.array_equal(back[k].numpy(), state_dict[k]) for k in back)
    print(f"{name:<24} to_timm → timm load_state_dict(strict=True): ok; state dict bit-exact: {exact}")
    if not exact:
        raise SystemExit(f"{name}: the exported state dict differs from timm's")
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tol", type=float, default=1e-4)
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    print(f"torch {torch.__version__}, timm {timm.__version__}, jax {jax.__version__}, float32, eval mode, "
          f"batch {args.batch} at 224px")
    worst = max(check(name, randomized, args.batch, args.seed)
                for name in MODELS for randomized in (False, True))
    print(f"worst max abs logit difference: {worst:.3e} (tolerance {args.tol:g})")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
