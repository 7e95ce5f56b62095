"""What a run keeps on disk or in a bucket (any ``etils.epath`` path, ``gs://`` included): ``checkpoint`` (orbax
checkpoints with a content seal), ``workdir`` (the stored config, the metrics log after a resume, ``--restart``),
``workdir_lock`` (one job at a time in a workdir) and ``compile_cache`` (JAX's persistent compilation cache).

Built below ``train``: nothing here imports the loop; it is handed the values it stores.
"""
