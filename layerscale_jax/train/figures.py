"""The PNG figures a run writes into its workdir: a grid of images with each row named on its left (MAE's
``reconstructions.png``: originals, masked inputs, reconstructions, reconstructions with the visible patches pasted).
"""
from __future__ import annotations

import numpy as np

RECONSTRUCTION_ROWS = ("original", "masked input", "reconstruction", "visible pasted")


def reconstruction_png(images: np.ndarray, mean, std, scale: int | None = None,
                       labels: tuple[str, ...] = RECONSTRUCTION_ROWS, title: str | None = None) -> bytes:
    """A PNG grid of ``(rows, n, H, W, C)`` normalised images (un-normalised with ``mean``/``std``), each image
    enlarged ``scale``× (nearest; default to about 64 pixels) with a 2-pixel gap, each row named on its left by
    ``labels`` (the rows of ``tasks.reconstruction_images``) and, when given, ``title`` above the grid."""
    rows, n, h, w, c = images.shape
    if len(labels) != rows:
        raise ValueError(f"{rows} rows of images but {len(labels)} labels: {labels}")
    scale = scale or max(1, 64 // max(h, w))
    pixels = np.clip(images * np.asarray(std, np.float32) + np.asarray(mean, np.float32), 0.0, 1.0)
    pixels = np.repeat(np.repeat(pixels, scale, axis=2), scale, axis=3)
    H, W = h * scale, w * scale
    canvas = np.ones((rows * (H + GAP) - GAP, n * (W + GAP) - GAP, c), np.float32)
    for r in range(rows):
        for i in range(n):
            canvas[r * (H + GAP):r * (H + GAP) + H, i * (W + GAP):i * (W + GAP) + W] = pixels[r, i]
    array = (canvas * 255).round().astype(np.uint8)
    from PIL import Image
    return _png(_framed(Image.fromarray(array[..., 0] if c == 1 else array), H, labels, title))


def label_grid_png(png: bytes, labels: tuple[str, ...] = RECONSTRUCTION_ROWS, title: str | None = None) -> bytes:
    """An unnamed grid PNG — ``len(labels)`` rows of equal height separated by ``GAP``-pixel lines, as
    ``reconstruction_png`` drew it before it named its rows — framed as ``reconstruction_png`` frames its grid:
    each row named on its left, ``title`` above. A height that does not split into those rows is a ValueError."""
    import io

    from PIL import Image

    grid = Image.open(io.BytesIO(png))
    height = (grid.height - (len(labels) - 1) * GAP) / len(labels)
    if height != int(height):
        raise ValueError(f"a {grid.height}-pixel grid does not split into {len(labels)} rows with {GAP}-pixel gaps")
    return _png(_framed(grid, int(height), labels, title))


def title_png(png: bytes, title: str) -> bytes:
    """``png`` with ``title`` in a white strip above it."""
    import io

    from PIL import Image

    return _png(_titled(Image.open(io.BytesIO(png)), title))


GAP = 2   # pixels between the grid's images


def _framed(grid, row_height: int, labels: tuple[str, ...], title: str | None):
    """``grid`` with a white margin on its left naming each row (``row_height`` pixels, ``GAP`` apart), and
    ``title`` above when given."""
    from PIL import Image, ImageDraw

    colour = grid.mode == "RGB"
    draw = ImageDraw.Draw(grid)
    margin = 8 + max(int(draw.textlength(label)) for label in labels)
    image = Image.new(grid.mode, (grid.width + margin, grid.height), (255,) * 3 if colour else 255)
    image.paste(grid, (margin, 0))
    draw = ImageDraw.Draw(image)
    for r, label in enumerate(labels):
        draw.text((margin - 4, r * (row_height + GAP) + row_height // 2), label, fill=(0,) * 3 if colour else 0,
                  anchor="rm")
    return _titled(image, title) if title else image


def _titled(image, title: str):
    """``image`` under a white strip holding ``title``, centred."""
    from PIL import Image, ImageDraw

    colour = image.mode == "RGB"
    strip = 18
    titled = Image.new(image.mode, (image.width, image.height + strip), (255,) * 3 if colour else 255)
    titled.paste(image, (0, strip))
    ImageDraw.Draw(titled).text((image.width // 2, strip // 2), title, fill=(0,) * 3 if colour else 0, anchor="mm")
    return titled


def _png(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
