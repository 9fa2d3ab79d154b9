"""Named numba compile targets, and the instruction-set features each one means.

numba compiles for NUMBA_CPU_NAME with NUMBA_CPU_FEATURES, and when only the name is given
it keeps this CPU's own features (only "generic" drops them). So NUMBA_CPU_NAME=haswell on
an AVX-512 machine would still compile AVX-512 and VNNI code, and a test "under Haswell"
would compare the host's code with itself. `compile_env(name)` gives both variables, the
features those of the named CPU (LLVM's names), so the code is what that CPU would get.
The exactness matrix, the logit fingerprints and the lowering tests all compile through it.
"""
from __future__ import annotations

_SSE = "+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16"
_AVX = _SSE + ",+avx,+xsave,+pclmul"
_AVX2 = _AVX + ",+avx2,+fma,+f16c,+bmi,+bmi2,+lzcnt,+movbe"
_AVX512 = _AVX2 + ",+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx512cd"

# NUMBA_CPU_NAME -> NUMBA_CPU_FEATURES ("" for generic: x86-64's baseline, SSE2)
FEATURES = {
    "generic": "",
    "nehalem": _SSE,
    "sandybridge": _AVX,
    "haswell": _AVX2,
    "skylake-avx512": _AVX512,
    "icelake-server": _AVX512 + ",+avx512vnni,+avx512vbmi,+avx512vbmi2,+avx512bitalg,+avx512vpopcntdq,+avx512ifma",
}


def compile_env(name: str) -> dict:
    """The environment that makes numba compile for the named CPU ({} for this CPU's own: "")."""
    if not name:
        return {}
    return {"NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": FEATURES[name]}
