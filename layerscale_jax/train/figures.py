"""The PNG figures a run writes into its workdir: a grid of images with each row named on its left (MAE's
``reconstructions.png``: originals, masked inputs, reconstructions, reconstructions with the visible patches pasted).
"""
from __future__ import annotations

import numpy as np

RECONSTRUCTION_ROWS = ("original", "masked input", "reconstruction", "visible pasted")


def reconstruction_png(images: np.ndarray, mean, std, scale: int | None = None,
                       labels: tuple[str, ...] = RECONSTRUCTION_ROWS) -> bytes:
    """A PNG grid of ``(rows, n, H, W, C)`` normalised images (un-normalised with ``mean``/``std``), each image
    enlarged ``scale``× (nearest; default to about 64 pixels) with a 2-pixel gap, each row named on its left by
    ``labels`` (the rows of ``tasks.reconstruction_images``)."""
    import io

    from PIL import Image, ImageDraw

    rows, n, h, w, c = images.shape
    if len(labels) != rows:
        raise ValueError(f"{rows} rows of images but {len(labels)} labels: {labels}")
    scale = scale or max(1, 64 // max(h, w))
    pixels = np.clip(images * np.asarray(std, np.float32) + np.asarray(mean, np.float32), 0.0, 1.0)
    pixels = np.repeat(np.repeat(pixels, scale, axis=2), scale, axis=3)
    gap = 2
    H, W = h * scale, w * scale
    canvas = np.ones((rows * (H + gap) - gap, n * (W + gap) - gap, c), np.float32)
    for r in range(rows):
        for i in range(n):
            canvas[r * (H + gap):r * (H + gap) + H, i * (W + gap):i * (W + gap) + W] = pixels[r, i]
    array = (canvas * 255).round().astype(np.uint8)
    grid = Image.fromarray(array[..., 0] if c == 1 else array)
    draw = ImageDraw.Draw(grid)
    margin = 8 + max(int(draw.textlength(label)) for label in labels)
    image = Image.new(grid.mode, (grid.width + margin, grid.height), 255 if c == 1 else (255,) * 3)
    image.paste(grid, (margin, 0))
    draw = ImageDraw.Draw(image)
    for r, label in enumerate(labels):
        draw.text((margin - 4, r * (H + gap) + H // 2), label, fill=0 if c == 1 else (0,) * 3, anchor="rm")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
