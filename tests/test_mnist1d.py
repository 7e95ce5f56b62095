"""mnist1d: the generated splits against the package's own, the caller's random state, the stored file, the data
config's checks, the signal batches, the 1-D patch embedding and ViT, and a short run that learns."""
import dataclasses
import importlib.util
import os
import random

import numpy as np
import pytest

from layerscale_jax.data import config as data_config
from layerscale_jax.data import mnist1d
from layerscale_jax.errors import ConfigError
from layerscale_jax.train.config import validate_experiment_config

SMALL = mnist1d.Mnist1dSettings(num_train=70, num_validation=10, num_test=20)


def test_splits_are_the_packages_own_signals():
    """Our train + validation is the package's x, our test its x_test, when its train_split cuts at the same place;
    labels too; float32 of its float64."""
    from mnist1d.data import make_dataset
    from mnist1d.utils import ObjectView

    ours = mnist1d.generate(SMALL)
    theirs = make_dataset(ObjectView(SMALL.package_args(train_split=0.8)))
    np.testing.assert_array_equal(ours["test"][0], theirs["x_test"].astype(np.float32))
    np.testing.assert_array_equal(ours["test"][1], theirs["y_test"])
    np.testing.assert_array_equal(np.concatenate([ours["train"][0], ours["validation"][0]]),
                                  theirs["x"].astype(np.float32))
    np.testing.assert_array_equal(np.concatenate([ours["train"][1], ours["validation"][1]]), theirs["y"])
    assert {k: v[0].shape for k, v in ours.items()} == {"train": (70, 40), "validation": (10, 40), "test": (20, 40)}
    assert ours["train"][0].dtype == np.float32 and ours["train"][1].dtype == np.int32


def test_the_callers_global_random_state_is_kept():
    np.random.seed(7)
    random.seed(7)
    expected = (np.random.rand(), random.random())
    np.random.seed(7)
    random.seed(7)
    mnist1d.generate(SMALL)                   # the package calls np.random.seed(42) and random.seed(42)
    assert (np.random.rand(), random.random()) == expected


def test_stored_once_and_read_back(tmp_path, monkeypatch):
    first = mnist1d.load(str(tmp_path), SMALL)
    stored = list((tmp_path / "mnist1d").iterdir())
    assert [p.name for p in stored] == [f"{SMALL.key()}.npz"]
    monkeypatch.setattr(mnist1d, "generate", lambda settings: pytest.fail("generated again"))
    again = mnist1d.load(str(tmp_path), SMALL)
    for split in mnist1d.SPLITS:
        np.testing.assert_array_equal(first[split][0], again[split][0])
        np.testing.assert_array_equal(first[split][1], again[split][1])
    other = dataclasses.replace(SMALL, seed=43)
    assert other.key() != SMALL.key()         # another setting is another file


def _config(**fields):
    cfg = data_config.default_data_config("mnist1d")
    for dotted, value in fields.items():
        section = cfg
        *parents, leaf = dotted.split("__")
        for p in parents:
            section = section[p]
        section[leaf] = value
    return cfg


def test_default_config_is_valid_and_carries_the_generator_arguments():
    settings = data_config.validate_data_config(_config())
    assert settings.mnist1d == mnist1d.Mnist1dSettings()
    assert settings.image_size == 40 and not settings.augment.hflip and settings.augment.crop_padding == 0
    from mnist1d.data import get_dataset_args
    package = get_dataset_args(as_dict=True)
    for field in ("seed", "template_len", "scale_coeff", "max_translation", "corr_noise_scale", "iid_noise_scale",
                  "shear_scale", "final_seq_length"):
        assert getattr(settings.mnist1d, field) == package[field], field
    assert list(settings.mnist1d.padding) == package["padding"]


@pytest.mark.parametrize("fields, message", [
    ({"augment__hflip": True}, "data.augment.hflip=True: mnist1d signals take no image augmentation"),
    ({"augment__crop_padding": 2}, "data.augment.crop_padding=2"),
    ({"cutmix_alpha": 1.0}, "data.cutmix_alpha=1.0"),
    ({"image_size": 32}, "data.image_size=32 must equal data.mnist1d.final_seq_length=40"),
    ({"eval_split": "train_without_validation"}, "data.eval_split='train_without_validation' is not a split"),
    ({"mnist1d__num_test": 5}, "must be a multiple of 10"),
    ({"mnist1d__padding": (5, 2)}, "data.mnist1d.padding must be (low, high)"),
    ({"mnist1d__seed": -1}, "data.mnist1d.seed=-1 must be a non-negative integer"),
    ({"mnist1d__shear_scale": -1.0}, "data.mnist1d.shear_scale=-1.0 must be a finite number ≥ 0"),
])
def test_bad_settings_are_named(fields, message):
    with pytest.raises(ConfigError, match=None) as err:
        data_config.validate_data_config(_config(**fields))
    assert message in str(err.value)


def test_unknown_generator_field_is_named():
    cfg = _config()
    cfg.mnist1d.unlock()
    cfg.mnist1d.sead = 3
    with pytest.raises(ConfigError, match="data.mnist1d.sead"):
        data_config.validate_data_config(cfg)


def test_signal_batches(tmp_path):
    """Train batches: float32 (b, 40, 1) of the stored signals as generated (no normalisation), the order's
    records; one eval pass covers every signal once (padding masked)."""
    from layerscale_jax.data import get_dataset_info, make_eval_iterator, make_train_iterator

    cfg = _config(data_dir=str(tmp_path), mnist1d__num_train=70, mnist1d__num_validation=10, mnist1d__num_test=20)
    info = get_dataset_info(cfg)
    assert (info.image_size, info.channels, info.num_classes, info.input_dims) == (40, 1, 10, 1)
    assert (info.num_train, info.num_test) == (70, 20)
    splits = mnist1d.load(str(tmp_path), data_config.validate_data_config(cfg).mnist1d)
    with make_train_iterator(cfg, global_batch_size=16, seed=3, process_index=0, process_count=1) as it:
        batch = next(it)
    assert batch["image"].shape == (16, 40, 1) and batch["image"].dtype == np.float32
    rows = [int(np.flatnonzero((splits["train"][0] == x[:, 0]).all(1))[0]) for x in batch["image"]]
    np.testing.assert_array_equal(splits["train"][1][rows], batch["label"])
    assert len(set(rows)) == 16              # one epoch's permutation: no record twice in a batch
    seen = []
    for b in make_eval_iterator(cfg, global_batch_size=8, process_index=0, process_count=1):
        seen += [x for x, m in zip(b["image"][:, :, 0], b["mask"]) if m]
    np.testing.assert_array_equal(np.stack(seen), splits["test"][0])


def test_patch_embedding_and_vit_shapes():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from layerscale_jax.layers.common import PatchEmbed
    import layerscale_jax as lsj

    embed = PatchEmbed(4, 1, 8, dims=1, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 40, 1))
    tokens = embed(x)
    assert tokens.shape == (3, 10, 8) and embed.proj.kernel[...].shape == (4, 1, 8)
    # patch k is the linear map of samples 4k .. 4k+3
    expected = jnp.einsum("bkp,pd->bkd", x[:, :, 0].reshape(3, 10, 4), embed.proj.kernel[...][:, 0])
    np.testing.assert_allclose(tokens, expected + embed.proj.bias[...], rtol=1e-5, atol=1e-6)

    model = lsj.create_model("deit3_small_patch16_224", patch_dims=1, img_size=40, patch_size=4, in_chans=1,
                             num_classes=10, embed_dim=16, depth=24, num_heads=2, init_values="auto",
                             scan_layers=True, remat="full")
    assert model.cfg.num_patches == 10 and model.pos_embed[...].shape == (1, 10, 16)
    model.eval()
    assert model(x).shape == (3, 10)
    gammas = [leaf for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param)) if "gamma" in str(path)]
    assert gammas and all(np.allclose(np.asarray(g[...]), 1e-5) for g in gammas)     # CaiT's ε at depth 24
    with pytest.raises(ConfigError, match=r"expects signals of shape \(batch, 40, 1\)"):
        model(jnp.zeros((3, 40, 40, 1)))
    with pytest.raises(ConfigError, match="patch_dims=3"):
        lsj.create_model("deit3_small_patch16_224", patch_dims=3)


def test_scan_and_unrolled_agree_on_signals():
    """The 1-D model with scanned blocks equals the one with unrolled blocks on the same parameters."""
    import jax

    import layerscale_jax as lsj
    from layerscale_jax.models.layout import convert_layout

    scanned = lsj.create_model("deit3_small_patch16_224", patch_dims=1, img_size=40, patch_size=4, in_chans=1,
                               num_classes=10, embed_dim=16, depth=3, num_heads=2, init_values=0.1, scan_layers=True)
    unrolled = convert_layout(scanned, scan_layers=False)
    assert not unrolled.cfg.scan_layers
    x = jax.random.normal(jax.random.key(2), (2, 40, 1))
    scanned.eval()
    unrolled.eval()
    np.testing.assert_allclose(scanned(x), unrolled(x), rtol=2e-5, atol=2e-5)


@pytest.mark.slow
def test_model_and_dataset_must_agree_on_dims(tmp_path):
    from layerscale_jax.train.loop import train_and_record
    config = _study_config(tmp_path, "steps=2")
    config.model.patch_dims = 2
    with pytest.raises(ConfigError, match="model.patch_dims=2 does not match dataset 'mnist1d'"):
        train_and_record(validate_experiment_config(config))


def _study_config(tmp_path, arg):
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "mnist1d_layerscale.py")
    spec = importlib.util.spec_from_file_location("mnist1d_layerscale", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg)
    config.data.data_dir = str(tmp_path)
    config.data.mnist1d.num_test = 1000
    config.data.eval_split = "validation"
    config.train.checkpoint_every = 0
    return config


@pytest.mark.slow
def test_a_short_run_learns_and_reports_test(tmp_path):
    """200 steps at depth 2 go far above chance (10%) on validation, and the final state is evaluated on test."""
    from layerscale_jax.train.loop import train_and_record
    config = _study_config(tmp_path, "depth=2,steps=200,lr=5e-3")
    config.train.eval_every = 100
    record = train_and_record(validate_experiment_config(config), final_splits=("test",))
    assert record["eval_split"] == "validation" and record["final_val_accuracy"] > 0.4
    assert record["final_test_examples"] == 1000 and record["final_test_accuracy"] > 0.4
    assert record["final_test_loss"] < 2.0       # ln 10 = 2.30 at chance
