"""XLA CPU compiler options the ``xla_options`` benchmark tries against XLA's defaults (benchmarks/README.md).

Each candidate is a dict of per-executable compiler options (``jitted.lower(...).compile(compiler_options=...)``),
the same fields ``XLA_FLAGS`` sets process-wide. Because they are per executable, one process compiles the same
train step once per candidate and times the executables interleaved, so a change of machine load hits all alike.

None is a default of the library: on the development CPU no option helped every model (disabling YNNPACK fusions
helped DeiT III-S/16 and slowed the small ablation model by about as much; the oneDNN options compile to the same
program in jaxlib 0.10.2). ``library_calls`` reports which library fusions a compiled program really contains.
"""
from __future__ import annotations

import re

CANDIDATE_CPU_OPTIONS: dict[str, dict] = {
    "xla_default": {},
    "ynn_off": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "ynn_dot_only": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "ynn_individual_dot": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
    "xnn_dot": {"xla_cpu_experimental_ynn_fusion_type": "",
                "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "onednn_dot": {"xla_cpu_experimental_ynn_fusion_type": "",
                   "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "fast_math": {"xla_cpu_enable_fast_math": True},
    "vector_width_512": {"xla_cpu_prefer_vector_width": 512},
}


def library_calls(hlo_text: str) -> dict[str, int]:
    """How many YNNPACK / XNNPACK / oneDNN fusions a compiled program contains, and its dot instructions (inside
    library fusions or not)."""
    out = {}
    for name, pattern in (("ynn_fusion", r"%ynn_fusion[.\d]* = "), ("xnn_fusion", r"%xnn_fusion[.\d]* = "),
                          ("onednn", r"onednn"), ("dot_instructions", r" dot\(")):
        out[name] = len(re.findall(pattern, hlo_text, flags=re.IGNORECASE))
    return out
