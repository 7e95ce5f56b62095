"""NVIDIA GPU targets compiled on this CPU machine by XLA's CUDA compiler (``plan.gpu_targets``).

Needs the CUDA plugin and cuDNN (``pip install -e ".[gpu-compile]"``, ~2.4 GB); without them these tests skip with
that reason (CI does not install them). The train-step compiles for ``8xh100``, ``8xh200`` and ``2x8xh100`` go
through ``compile_for``, exactly as ``python -m layerscale_jax.train --compile_for 8xh100`` does.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from layerscale_jax.errors import UserError
from layerscale_jax.plan import gpu_targets
from layerscale_jax.train.config import validate_experiment_config

MISSING = gpu_targets.missing_requirements()
needs_cuda = pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}: {gpu_targets.INSTALL}")
CUDNN_FMHA = 'custom_call_target="__cudnn$fmha'


@pytest.fixture(autouse=True)
def no_compilation_cache():
    """Cross-compiled executables cannot be read back from JAX's persistent cache: keep them out of it."""
    previous = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    yield
    jax.config.update("jax_enable_compilation_cache", previous)


def test_the_stored_target_descriptions_say_what_the_gpus_are():
    assert gpu_targets.device_memory_bytes("h100") == 84_942_979_072            # 79.1 GiB: an "80 GB" H100
    assert gpu_targets.device_memory_bytes("h200") == 151_397_597_184           # 141.0 GiB
    for chip, name in (("h100", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200 141GB HBM3e")):
        text = gpu_targets.target_config(chip)
        assert f'device_description_str: "{name}"' in text and "major: 9" in text     # Hopper, sm_90
        assert "Licensed under the Apache License, Version 2.0" in text


def test_usable_memory_is_jax_s_fraction_of_the_device_memory(monkeypatch):
    for var in gpu_targets.MEM_FRACTION_VARS:
        monkeypatch.delenv(var, raising=False)
    assert gpu_targets.usable_memory_bytes("h100") == int(84_942_979_072 * 0.75)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    assert gpu_targets.usable_memory_bytes("h200") == int(151_397_597_184 * 0.9)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.5")
    with pytest.raises(UserError, match="XLA_PYTHON_CLIENT_MEM_FRACTION='1.5' must lie in"):
        gpu_targets.usable_memory_bytes("h200")


def test_without_the_cuda_plugin_the_error_names_the_install_line(monkeypatch):
    monkeypatch.setattr(gpu_targets, "_find_spec", lambda module: None)
    with pytest.raises(UserError, match=r"needs jax-cuda12-plugin, jax-cuda12-pjrt, not installed here: pip install "
                                        r"-e \"\.\[gpu-compile\]\""):
        gpu_targets.gpu_devices("h100", 1, 8)
    with pytest.raises(UserError, match="known GPUs: h100, h200"):
        gpu_targets.gpu_devices("a100", 1, 8)


@needs_cuda
def test_the_stored_descriptions_are_those_the_installed_cuda_plugin_embeds():
    """Provenance: XLA builds its specs/*.txtpb into the plugin; ours are byte-identical copies of that text."""
    import jax_plugins.xla_cuda12 as plugin
    from pathlib import Path
    binary = Path(plugin.__file__).with_name("xla_cuda_plugin.so").read_bytes()
    for chip in ("h100", "h200"):
        assert gpu_targets.target_config(chip).encode() in binary, chip


@needs_cuda
def test_gpu_devices_are_hosts_times_gpus_with_one_process_per_host():
    devices = gpu_targets.gpu_devices("h100", 2, 8)
    assert len(devices) == 16 and {d.platform for d in devices} == {"gpu"}
    assert {d.device_kind for d in devices} == {"NVIDIA H100 80GB HBM3"}
    assert [d.process_index for d in devices] == [0] * 8 + [1] * 8
    assert {d.device_kind for d in gpu_targets.gpu_devices("h200", 1, 8)} == {"NVIDIA H200 141GB HBM3e"}


def _attention_grad_hlo(attention_impl: str, devices, tokens: int = 197, dtype=jnp.bfloat16) -> str:
    """The compiled HLO of ∂/∂params Σ Attention(x) for ``devices`` (a data-parallel batch), traced the way the
    train loop traces its steps: inside ``activation_sharding`` on the target's mesh."""
    from layerscale_jax.layers.attention import Attention
    from layerscale_jax.train.config import DEFAULT_RULES
    from layerscale_jax.train.sharding import with_activation_sharding
    mesh = Mesh(np.array(devices).reshape(len(devices), 1, 1), ("data", "fsdp", "tensor"))
    layer = nnx.eval_shape(lambda: Attention(768, 12, attention_impl=attention_impl, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(layer)
    replicated, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params)(x).astype(jnp.float32))

    grad = with_activation_sharding(jax.grad(loss), mesh, DEFAULT_RULES)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), params)
    x = jax.ShapeDtypeStruct((8 * len(devices), tokens, 768), dtype, sharding=batch)
    return jax.jit(grad, out_shardings=replicated).lower(abstract, x).compile().as_text()


@pytest.mark.slow
@needs_cuda
def test_cudnn_attention_compiles_for_an_h100_forward_and_backward_with_odd_token_counts():
    """197 tokens (DeiT-B/16): cuDNN trains only even lengths, so the tokens are padded to 198 with the padded keys
    masked; the compiled gradient holds one fused forward and one fused backward kernel."""
    hlo = _attention_grad_hlo("cudnn", gpu_targets.gpu_devices("h100", 1, 1))
    assert hlo.count(CUDNN_FMHA + 'Softmax"') == 1
    assert hlo.count(CUDNN_FMHA + 'SoftmaxBackward"') == 1
    assert "bf16[8,198,12,64]" in hlo                               # the padded token axis


@pytest.mark.slow
@needs_cuda
def test_auto_attention_is_cudnn_for_a_gpu_target_compiled_on_the_cpu_and_xla_gives_none():
    devices = gpu_targets.gpu_devices("h200", 1, 2)
    assert CUDNN_FMHA in _attention_grad_hlo("auto", devices)       # resolved for the mesh's devices, not the CPU
    assert CUDNN_FMHA not in _attention_grad_hlo("xla", devices)
    assert CUDNN_FMHA not in _attention_grad_hlo("auto", devices, tokens=16, dtype=jnp.float32)   # fp32: no cuDNN


def gpu_config(**mesh):
    """The tiny synthetic run in bfloat16 with a head dimension of 8 (so ``auto`` attention is cuDNN's on a GPU),
    scanned, without Mixup (its Beta sampler makes a larger program)."""
    from test_train import tiny_config
    config = tiny_config("scan_layers=True")
    config.model.dtype = "bfloat16"
    config.data.mixup_alpha = config.data.cutmix_alpha = 0.0
    config.train.mesh.update(mesh)
    return config


@pytest.mark.slow
@needs_cuda
def test_compile_for_eight_h100s_reports_memory_against_jax_s_share_and_nccl_collectives():
    from layerscale_jax.plan.compile_for import compile_for
    report = compile_for(validate_experiment_config(gpu_config(data=1, fsdp=-1)), "8xh100")
    assert report.fits and report.num_chips == 8 and report.mesh == {"data": 1, "fsdp": 8, "tensor": 1}
    assert report.hbm_per_chip == gpu_targets.usable_memory_bytes("h100") < gpu_targets.device_memory_bytes("h100")
    assert "XLA_CLIENT_MEM_FRACTION" in report.format() and report.per_chip_batch == 2
    assert {"all-gather", "reduce-scatter"} <= set(report.collectives), report.collectives   # FSDP over NCCL


@pytest.mark.slow
@needs_cuda
def test_the_train_step_for_eight_h200s_runs_cudnn_attention_and_fsdp_collectives():
    from layerscale_jax.plan import hlo as hlo_lib
    from layerscale_jax.plan.compile_for import StepMemory, compile_steps
    steps = compile_steps(validate_experiment_config(gpu_config(data=1, fsdp=-1)), "8xh200", eval_step=False)
    hlo = steps.compiled["train"].as_text()
    assert hlo.count(CUDNN_FMHA + 'Softmax"') == 1 and hlo.count(CUDNN_FMHA + 'SoftmaxBackward"') == 1   # scanned
    assert {"all-gather", "reduce-scatter"} <= set(hlo_lib.collectives_by_kind(hlo_lib.collectives(hlo)))
    assert 0 < StepMemory.of(steps.compiled["train"]).total < gpu_targets.usable_memory_bytes("h200")


@pytest.mark.slow
@needs_cuda
def test_two_hosts_of_eight_h100s_split_data_across_hosts_and_fsdp_within():
    from layerscale_jax.plan.compile_for import compile_for
    experiment = validate_experiment_config(gpu_config(data=1, fsdp=8, dcn_data=2))
    report = compile_for(experiment, "2x8xh100", eval_step=False)
    assert report.num_chips == 16 and report.mesh == {"data": 2, "fsdp": 8, "tensor": 1}
    assert report.topology == "2 hosts × 8 GPUs" and report.per_chip_batch == 1
    assert {"all-gather", "reduce-scatter"} <= set(report.collectives) and report.fits


@pytest.mark.slow
@needs_cuda
def test_a_run_too_big_for_the_gpus_is_one_error_line_with_the_numbers():
    """XLA's GPU compiler compiles a step of any size; the command compares its memory with what JAX may use: here
    about 67 GiB per GPU (41 GiB at 16,384 per GPU, measured), more than JAX's 59.3 GiB though less than 79.1."""
    import subprocess
    import sys
    from test_compile_for import ROOT, TINY
    env = {**__import__("os").environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    result = subprocess.run(
        [sys.executable, "-m", "layerscale_jax.train", "--config", f"{TINY}:scan_layers=True", "--compile_for",
         "8xh100", "--config.model.dtype=bfloat16", "--config.model.img_size=32", "--config.data.image_size=32",
         "--config.model.embed_dim=256", "--config.model.num_heads=4", "--config.train.batch_size=212992",
         "--config.data.mixup_alpha=0", "--config.data.cutmix_alpha=0"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert result.returncode == 2, result.stderr[-2000:]
    started, line = result.stderr.strip().splitlines()           # the line saying it compiles, then the error
    assert started.startswith("compiling deit3_small_patch16_224 for 8xh100 (")
    assert line.startswith("error: deit3_small_patch16_224 (global batch 212992) does not fit 8xh100: it needs ")
    assert "but a NVIDIA H100 SXM chip has 59.33 GiB (JAX's 0.75 of the 79.11 GiB a GPU has" in line
    needed = float(line.split("it needs ")[1].split(" GiB")[0])
    assert 59.33 < needed < 79.11
