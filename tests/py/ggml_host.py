"""Whether this host runs the ggml code paths kiln reproduces bit for bit (ggml's AVX-512 paths)."""
import os

import pytest


def avx512_host():
    # KILN_CPU=avx2|scalar caps kiln's kernel table (docs/kernels.md, "Dispatch"): kiln then runs
    # as on a host without AVX-512, and is held to those hosts' limits.
    if os.environ.get("KILN_CPU", "").lower() in ("avx2", "scalar"):
        return False
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags


needs_avx512 = pytest.mark.skipif(not avx512_host(), reason="bit-identical llama.cpp arithmetic is implemented for "
                                  "ggml's AVX-512 code paths; this host lacks AVX-512 (F/BW/VL/DQ/VNNI)")
