"""Planning a run for hardware that is not here: its exact steps compiled for a TPU slice or GPU node on this machine.

``compile_for`` (the report, ``--fit``), ``targets`` (names → chips and topologies, each chip's published figures),
``gpu_targets`` and ``gpu_specs/`` (XLA's GPU target descriptions), ``hlo`` (what a compiled step communicates).
It builds on ``train`` (the run's own trainer); ``train`` reaches it only from its command (``train.__main__``).
"""
