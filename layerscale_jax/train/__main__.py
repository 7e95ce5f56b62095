"""The main job: ``python -m layerscale_jax.train --config configs/X.py[:arg] --workdir DIR [--config.a.b=v ...]``.

Multi-host jobs (TPU pods, GPU clusters): pass ``--coordinator_address host:port --num_processes N
--process_id I`` (or ``--distributed`` to let ``jax.distributed.initialize`` read the cluster environment:
SLURM, Open MPI, Kubernetes, Cloud TPU). Every process runs the same command.
"""
from __future__ import annotations

import logging

from layerscale_jax.runtime import reexec_with_huge_page_malloc

# Before anything allocates: huge pages for XLA's per-step CPU buffers (see layerscale_jax/runtime.py).
if __name__ == "__main__":
    reexec_with_huge_page_malloc()

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py[:arg]).", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, TensorBoard logs and results.json.")
flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with the cluster's auto-detection.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 for jax.distributed.initialize.")
flags.DEFINE_integer("num_processes", None, "Number of processes in the job.")
flags.DEFINE_integer("process_id", None, "This process's index in the job.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    import jax

    if FLAGS.coordinator_address or FLAGS.distributed:
        # Cross-process collectives for CPU-only jobs (tests, debugging); GPUs and TPUs use their own.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                                   num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)
    logging.getLogger("absl").setLevel(logging.WARNING)
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    from layerscale_jax.train.loop import train_and_evaluate

    train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
