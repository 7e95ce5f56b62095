"""layerscale-jax: LayerScale and deep Vision Transformers in JAX / Flax NNX."""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax==0.12.0.1",
    "jaxlib==0.12.0.1",
    "flax==0.12.12",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "ml-collections==1.1.0",
    "absl-py>=2.1",
    "numpy>=1.26",
    "safetensors>=0.4",
    "tensorboardX>=2.6",
    "tensorboard==2.21.0",          # the viewer for the event files the train job writes (`tensorboard --logdir`)
    "matplotlib>=3.8",
    # Data: TFDS reads prepared array_record data with grain (no TensorFlow at read time);
    # tensorflow-cpu is needed to *prepare* datasets (including the offline `digits` default), and for the ops of the
    # bilinear random-resized crop (`data.augment.interpolation="bilinear"`: big_vision's, docs/data.md).
    "tensorflow-datasets==4.9.10",
    "grain==0.2.18",
    "tensorflow-cpu==2.21.0",
    "importlib_resources>=6.0",
    "scikit-learn>=1.4",
    "mnist1d==0.0.2.post1",         # the offline `mnist1d` dataset's generator (Greydanus & Kobak; data/mnist1d.py)
    "scipy>=1.11",                  # experiments/: Welch's test and intervals, Fisher's exact test, t quantiles
    "Pillow>=10.0",
]

setup(
    name="layerscale-jax",
    version="0.1.0",
    description="LayerScale (CaiT) and deep Vision Transformers in JAX / Flax NNX",
    license="Apache-2.0",
    packages=find_packages(include=["layerscale_jax", "layerscale_jax.*"]),
    python_requires=">=3.12",
    install_requires=INSTALL_REQUIRES,
    extras_require={
        # pytest-xdist: README's test command runs the tests in one worker per CPU thread (-n logical).
        "test": ["pytest>=8.0", "pytest-xdist>=3.6,<4", "nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29"],
        # Optional: only to create parity fixtures and side-by-side benchmarks. CI never installs it.
        "timm": ["torch==2.14.1", "torchvision==0.29.1", "timm==1.0.31"],
        # Cloud TPU VMs, and compiling for any TPU target on a CPU machine (`--compile_for v5e-256`, docs/multihost.md):
        # libtpu's compiler. Installed by CI (.ci/run): the tests compile for TPUs and hold the pod recipes' compile
        # record to today's code.
        "tpu": ["jax[tpu]==0.12.0.1"],
        # gs:// workdirs (docs/storage.md): orbax lists a bucket's checkpoints with google-cloud-storage. TensorStore
        # writes the arrays with its own GCS driver; etils.epath (side files, logs, TensorBoard), TFDS and JAX's
        # compilation cache reach gs:// through TensorFlow's gfile, installed above.
        "gcs": ["google-cloud-storage>=3.0,<4"],
        # NVIDIA GPUs (docs/multihost.md): JAX's CUDA 12 plugin with CUDA and cuDNN from pip, at jax's version.
        "cuda12": ["jax[cuda12]==0.12.0.1"],
        # Compiling for NVIDIA GPUs on a machine without one (`--compile_for 8xh100`, plan/gpu_targets.py): JAX's
        # CUDA plugin, and cuDNN, against which cuDNN's fused attention is traced (~2.6 GB installed; CI skips it).
        "gpu-compile": ["jax-cuda12-plugin==0.12.0.1", "jax-cuda12-pjrt==0.12.0.1", "nvidia-cudnn-cu12>=9.10.2.21,<10"],
        # Reading the profiles train.profile_steps writes (docs/training.md, Profiles): TensorBoard's Profile tab and
        # `xprof --logdir WORKDIR/tensorboard` (tensorboard-plugin-profile brings xprof, the reader itself).
        "profile": ["tensorboard-plugin-profile==2.24.2"],
    },
    # XLA's target descriptions of the GPUs `--compile_for` knows (plan/gpu_specs/README.md: source and license)
    package_data={"layerscale_jax.plan": ["gpu_specs/*.txtpb", "gpu_specs/README.md"]},
)
