"""Whether this host runs the ggml code paths kiln reproduces bit for bit (ggml's AVX-512 paths)."""
import pytest


def avx512_host():
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags


needs_avx512 = pytest.mark.skipif(not avx512_host(), reason="bit-identical llama.cpp arithmetic is implemented for "
                                  "ggml's AVX-512 code paths; this host lacks AVX-512 (F/BW/VL/DQ/VNNI)")
