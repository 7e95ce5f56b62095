"""Pod-like compilation-cache keys for multi-process jobs on CPU, for measuring and testing a shared cache here.

JAX keys a persistent-cache entry by the program, the versions, the compile options and the devices' topology
(``jax/_src/cache_key.py``, component ``accelerator_config``: ``get_topology_for_devices(devices).fingerprint()``).
On a TPU pod that topology is the slice's (every host computes the same one), so hosts 1…N−1 find the entries
process 0 wrote. On CPU it is not: XLA's CPU topology (``CpuTopologyProto``) lists only the calling process's own
devices, each with its process index, so the fingerprint — and every key — differs between the processes of one job
(process 0: devices ``(process 0, local 0), (0, 1)``; process 1: ``(1, 0), (1, 1)``) and process 1 never finds
process 0's entries, shared directory or not (``tests/test_compile_cache_pod.py``).

``use_process_invariant_cpu_cache_keys()`` hashes that topology with the process indices removed (the local devices
and the host's CPU target — triple, CPU name, features — stay in the key, so an entry still only serves a host that
can run it), which gives the processes of a CPU job the keys a pod's hosts share. It touches a private JAX function
and is for benchmarks and tests only: ``python -m layerscale_jax.bench.cache_keys TRAIN_ARGS...`` runs the train
command with it.
"""
from __future__ import annotations

import hashlib

_VARINT, _LENGTH = 0, 2
_TOPOLOGY_ANY = 9                # PjRtTopologyDescriptionProto.platform_specific_topology (google.protobuf.Any)
_ANY_VALUE = 2                   # Any.value
_CPU_DEVICES = 1                 # CpuTopologyProto.cpu_devices
_PROCESS_INDEX = 2               # CpuTopologyProto.CpuDevice.process_index


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """``(field number, wire type, raw bytes of the field)`` of a serialized protocol buffer (varint and
    length-delimited fields, all a topology has)."""
    fields, i = [], 0
    while i < len(data):
        start = i
        tag, i = _varint(data, i)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            _, i = _varint(data, i)
        elif wire == _LENGTH:
            size, i = _varint(data, i)
            i += size
        else:
            raise ValueError(f"unexpected wire type {wire} in a topology")
        fields.append((number, wire, data[start:i]))
    return fields


def _payload(raw: bytes) -> bytes:
    """The bytes inside a length-delimited field."""
    _, i = _varint(raw, 0)
    size, i = _varint(raw, i)
    return raw[i:i + size]


def cpu_topology_without_process_indices(serialized: bytes) -> bytes:
    """The parts of a serialized CPU ``PjRtTopologyDescriptionProto`` that every process of a job has in common: its
    platform-specific ``CpuTopologyProto`` with each device's process index dropped (the fingerprint field, a hash
    of the whole, is dropped too)."""
    kept = []
    for number, wire, raw in _fields(serialized):
        if number == _TOPOLOGY_ANY and wire == _LENGTH:
            for any_number, any_wire, any_raw in _fields(_payload(raw)):
                if any_number != _ANY_VALUE:
                    kept.append(any_raw)
                    continue
                for cpu_number, cpu_wire, cpu_raw in _fields(_payload(any_raw)):
                    if cpu_number == _CPU_DEVICES and cpu_wire == _LENGTH:
                        kept += [r for n, _, r in _fields(_payload(cpu_raw)) if n != _PROCESS_INDEX]
                        kept.append(b"|")                             # one device ends
                    else:
                        kept.append(cpu_raw)
        elif wire == _LENGTH:                                         # platform, platform version
            kept.append(raw)
    return b"".join(kept)


def use_process_invariant_cpu_cache_keys() -> None:
    """From now on this process keys CPU programs by the topology without process indices (the module docstring);
    other platforms keep JAX's key."""
    from jax._src import cache_key
    from jax._src.lib import xla_client

    original = cache_key._hash_accelerator_config
    if getattr(original, "process_invariant", False):
        return

    def hash_accelerator_config(hash_obj, accelerators):
        devices = list(accelerators.flat)
        if not devices or devices[0].platform != "cpu":
            return original(hash_obj, accelerators)
        topology = xla_client.get_topology_for_devices(devices)
        hash_obj.update(hashlib.sha256(cpu_topology_without_process_indices(topology.serialize())).digest())

    hash_accelerator_config.process_invariant = True
    cache_key._hash_accelerator_config = hash_accelerator_config


if __name__ == "__main__":                      # as ``python -m layerscale_jax.train`` starts, then these keys
    import runpy

    from layerscale_jax.runtime import reexec_with_fast_malloc, stop_signals
    reexec_with_fast_malloc()
    stop_signals.install()
    use_process_invariant_cpu_cache_keys()
    runpy.run_module("layerscale_jax.train", run_name="__main__", alter_sys=True)    # the command, as -m runs it
