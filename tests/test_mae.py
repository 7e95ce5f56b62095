"""MAE pre-training: masking as MAE's reference algorithm (NumPy re-implementation), the encoder sees visible patches
only, the loss counts masked patches only, bad mask ratios are refused, the encoder transfers into a classifier."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layerscale_jax.convert import load_pretrained, save_pretrained
from layerscale_jax.convert.flat import flatten
from layerscale_jax.models import create_model
from layerscale_jax.models import mae as mae_lib
from layerscale_jax.models.layout import convert_layout
from layerscale_jax.train.config import validate_experiment_config

ENCODER = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=16, depth=2, num_heads=2,
               init_values=0.1)
DECODER = dict(decoder_embed_dim=8, decoder_depth=1, decoder_num_heads=2)


def tiny_mae(**kw):
    return create_model("mae_deit3_small_patch16_224", rngs=nnx.Rngs(0), **{**ENCODER, **DECODER, **kw})


def reference_random_masking(noise: np.ndarray, mask_ratio: float):
    """facebookresearch/mae ``MaskedAutoencoderViT.random_masking``, in NumPy, given its noise."""
    n, length = noise.shape
    len_keep = int(length * (1 - mask_ratio))
    ids_shuffle = np.argsort(noise, axis=1)
    ids_restore = np.argsort(ids_shuffle, axis=1)
    ids_keep = ids_shuffle[:, :len_keep]
    mask = np.ones([n, length])
    mask[:, :len_keep] = 0
    mask = np.take_along_axis(mask, ids_restore, axis=1)
    return ids_keep, mask, ids_restore


@pytest.mark.parametrize("ratio", [0.75, 0.5, 0.3])
def test_masking_equals_the_reference_algorithm_and_removes_the_ratio_per_sample(ratio):
    key = jax.random.key(3)
    ids_keep, mask, ids_restore = mae_lib.random_masking(key, 64, 16, ratio)
    ref_keep, ref_mask, ref_restore = reference_random_masking(np.asarray(jax.random.uniform(key, (64, 16))), ratio)
    np.testing.assert_array_equal(ids_keep, ref_keep)
    np.testing.assert_array_equal(mask, ref_mask)
    np.testing.assert_array_equal(ids_restore, ref_restore)
    np.testing.assert_array_equal(np.asarray(mask).sum(axis=1), 16 - int(16 * (1 - ratio)))   # every sample
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(mask), np.asarray(ids_keep), axis=1), 0)


def test_each_sample_gets_its_own_mask_and_restore_undoes_the_shuffle():
    ids_keep, mask, ids_restore = mae_lib.random_masking(jax.random.key(0), 512, 16, 0.75)
    mask = np.asarray(mask)
    assert len({tuple(row) for row in mask}) > 400              # C(16, 4) = 1820 possible masks
    np.testing.assert_allclose(mask.mean(axis=0), 0.75, atol=0.06)    # every patch masked ~75% of the time
    shuffle = np.argsort(np.asarray(ids_restore), axis=1)
    tokens = np.arange(16)[None].repeat(512, 0)
    np.testing.assert_array_equal(np.take_along_axis(np.take_along_axis(tokens, shuffle, 1),
                                                     np.asarray(ids_restore), 1), tokens)
    # another step's key gives other masks
    assert not np.array_equal(mask, np.asarray(mae_lib.random_masking(jax.random.key(1), 512, 16, 0.75)[1]))


@pytest.mark.slow
def test_the_encoder_sees_only_visible_patches_and_the_loss_counts_only_masked_ones():
    model = tiny_mae()
    model.eval()
    images = jax.random.normal(jax.random.key(1), (4, 8, 8, 1))
    key = jax.random.key(5)
    pred, mask = model.predict(images, key)
    hidden = jnp.asarray(mae_lib.unpatchify(jnp.broadcast_to(mask[:, :, None], (4, 16, 4)), 2, 1))
    changed = images + 10.0 * hidden                                # change only the removed patches' pixels
    pred_changed, _ = model.predict(changed, key)
    np.testing.assert_allclose(pred_changed, pred, atol=1e-6)      # the prediction never saw them

    target, _, _ = mae_lib.pixel_targets(images, 2, norm_pix_loss=True)
    loss = mae_lib.masked_patch_loss(pred, target, mask)
    garbage_on_visible = jnp.where(mask[:, :, None] == 0, 1e3, pred)
    np.testing.assert_allclose(mae_lib.masked_patch_loss(garbage_on_visible, target, mask), loss, rtol=1e-6)
    perfect_on_masked = jnp.where(mask[:, :, None] == 1, target, pred)
    np.testing.assert_allclose(mae_lib.masked_patch_loss(perfect_on_masked, target, mask), 0.0, atol=1e-7)
    np.testing.assert_allclose(model.loss(images, key), loss, rtol=1e-6)


def test_norm_pix_targets_are_patches_normalised_with_the_unbiased_variance():
    images = np.random.default_rng(0).normal(size=(2, 8, 8, 1)).astype(np.float32)
    target, _, _ = mae_lib.pixel_targets(jnp.asarray(images), 2, norm_pix_loss=True)
    patch = images[0, 2:4, 4:6, 0].reshape(-1)                     # patch (row 1, column 2) = index 1·4 + 2
    expected = (patch - patch.mean()) / np.sqrt(patch.var(ddof=1) + 1e-6)
    np.testing.assert_allclose(target[0, 6], expected, rtol=1e-5)


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.5, 1.5])
def test_a_mask_ratio_outside_the_open_unit_interval_is_refused(ratio):
    with pytest.raises(ValueError, match=rf"mask_ratio={ratio!r} must lie in the open interval \(0, 1\)"):
        tiny_mae(mask_ratio=ratio)


@pytest.mark.slow
@pytest.mark.parametrize("global_pool", ["token", "avg"])
def test_the_encoder_loads_every_expected_parameter_into_a_classifier(tmp_path, global_pool):
    mae = tiny_mae(scan_layers=True)
    save_pretrained(mae, tmp_path / "mae")
    classifier = create_model("deit3_small_patch16_224", rngs=nnx.Rngs(1), global_pool=global_pool,
                              **ENCODER)
    fresh = {k: np.asarray(v) for k, v in flatten(nnx.to_pure_dict(nnx.state(classifier, nnx.Param))).items()}
    load_pretrained(classifier, tmp_path / "mae")
    loaded = flatten(nnx.to_pure_dict(nnx.state(classifier, nnx.Param)))
    unrolled = convert_layout(mae, scan_layers=False)
    source = {k: np.asarray(v) for k, v in flatten(nnx.to_pure_dict(nnx.state(unrolled, nnx.Param))).items()}
    new = {"head.kernel", "head.bias"} | ({"fc_norm.scale", "fc_norm.bias"} if global_pool == "avg" else set())
    assert set(loaded) - set(source) == new
    for key, value in loaded.items():
        if key in new:
            np.testing.assert_array_equal(value, fresh[key])       # kept at the fresh initialisation
        else:
            np.testing.assert_array_equal(value, source[key], err_msg=key)


@pytest.mark.slow
def test_init_from_another_architecture_lists_every_mismatched_parameter(tmp_path):
    save_pretrained(tiny_mae(), tmp_path / "mae")
    wider = create_model("deit3_small_patch16_224", **{**ENCODER, "embed_dim": 32})
    with pytest.raises(ValueError) as err:
        load_pretrained(wider, tmp_path / "mae")
    message = str(err.value)
    assert "nothing was loaded" in message and "shape mismatch" in message
    assert "'blocks.1.attn.qkv.kernel': expected shape (32, 96), found (16, 48)" in message
    assert "hint: the source has embed_dim=16, the model embed_dim=32" in message


@pytest.mark.slow
def test_mae_pretraining_runs_in_the_train_loop_on_a_sharded_mesh(tmp_path, capsys):
    """Masking, the encoder on visible patches and the loss under data parallelism; the evaluation writes the
    reconstruction PNG and the results carry the reconstruction loss."""
    import json

    import ml_collections

    from layerscale_jax.data.config import default_data_config
    from layerscale_jax.optim import default_config
    from layerscale_jax.train.config import default_train_config, model_section
    from layerscale_jax.train.loop import train_and_evaluate

    config = ml_collections.ConfigDict()
    config.model = model_section("mae_deit3_small_patch16_224", **{**ENCODER, "in_chans": 3, "num_classes": 4},
                                 **DECODER)
    config.data = default_data_config("synthetic")
    config.data.update(image_size=8, num_classes=4, num_train=64, num_test=16, prefetch=0)
    config.optim = default_config()
    config.optim.freeze = ("pos_embed", "decoder_pos_embed")
    config.train = default_train_config()
    config.train.update(steps=2, batch_size=16, eval_batch_size=16, log_every=1, checkpoint_every=0)
    config.train.mesh.data = 4
    results = train_and_evaluate(validate_experiment_config(config), str(tmp_path), devices=jax.devices()[:4])
    assert np.isfinite(results["test_loss"]) and "test_accuracy" not in results
    assert f"| test_loss {results['test_loss']:.4g} |" in capsys.readouterr().err      # on the console's line
    assert (tmp_path / "reconstructions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "results.json").read_text())["test_examples"] == 16


def test_reconstruction_png_names_each_row_on_its_left():
    import io

    from PIL import Image

    from layerscale_jax.train.figures import RECONSTRUCTION_ROWS, reconstruction_png

    images = np.zeros((4, 3, 8, 8, 1), np.float32)             # normalised 0 → grey 0.5 with mean 0.5, std 1
    png = Image.open(io.BytesIO(reconstruction_png(images, (0.5,), (1.0,), scale=8)))
    pixels = np.asarray(png)
    grid_width = 3 * 64 + 2 * 2
    margin = pixels[:, : png.width - grid_width]
    assert png.width > grid_width and pixels.shape[0] == 4 * 64 + 3 * 2
    assert set(np.unique(pixels[:, png.width - grid_width:])) == {128, 255}   # grey images, white gaps: no text
    for r in range(len(RECONSTRUCTION_ROWS)):                        # dark text in every row's band of the margin
        assert (margin[r * 66:r * 66 + 64] < 100).sum() > 20
    with pytest.raises(ValueError, match="4 rows of images but 2 labels"):
        reconstruction_png(images, (0.5,), (1.0,), labels=("a", "b"))


def _grey_grid_png(rows=4, n=3, size=64, gap=2) -> bytes:
    """The unnamed grid ``reconstruction_png`` used to write: grey images, white gaps."""
    import io

    from PIL import Image

    canvas = np.full((rows * (size + gap) - gap, n * (size + gap) - gap), 255, np.uint8)
    for r in range(rows):
        for i in range(n):
            canvas[r * (size + gap):r * (size + gap) + size, i * (size + gap):i * (size + gap) + size] = 128
    buffer = io.BytesIO()
    Image.fromarray(canvas).save(buffer, format="PNG")
    return buffer.getvalue()


def test_an_unnamed_grid_is_framed_exactly_as_reconstruction_png_frames_its_own():
    import io

    from PIL import Image

    from layerscale_jax.train.figures import label_grid_png, reconstruction_png, title_png

    images = np.zeros((4, 3, 8, 8, 1), np.float32)
    titled = reconstruction_png(images, (0.5,), (1.0,), scale=8, title="MAE")
    assert label_grid_png(_grey_grid_png(), title="MAE") == titled
    plain = Image.open(io.BytesIO(reconstruction_png(images, (0.5,), (1.0,), scale=8)))
    framed = Image.open(io.BytesIO(titled))
    assert framed.size == (plain.width, plain.height + 18)
    assert (np.asarray(framed)[:18] < 100).sum() > 10                       # the title's dark text
    assert Image.open(io.BytesIO(title_png(_grey_grid_png(), "t"))).size == (3 * 66 - 2, 4 * 66 - 2 + 18)
    with pytest.raises(ValueError, match="does not split into 4 rows"):
        label_grid_png(titled)                                               # already framed: not a bare grid


def test_the_committed_finetune_figure_has_a_title_and_names_its_rows():
    """experiments/results/finetune/reconstructions.png (8 digits, 4 rows of 64 pixels) is framed by
    ``label_grid_png`` with ``finetune_digits.reconstructions_title`` (``--label_committed_figure``)."""
    import io
    import os

    from PIL import Image

    from layerscale_jax.train.figures import label_grid_png

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    committed = Image.open(os.path.join(root, "experiments", "results", "finetune", "reconstructions.png"))
    expected = Image.open(io.BytesIO(label_grid_png(_grey_grid_png(n=8), title="x")))
    assert committed.size == expected.size
    pixels = np.asarray(committed)
    margin = committed.width - (8 * 66 - 2)
    assert (pixels[:18] < 100).sum() > 10 and all((pixels[18 + r * 66:18 + r * 66 + 64, :margin] < 100).sum() > 20
                                                  for r in range(4))
