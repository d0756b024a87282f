#!/usr/bin/env python3
"""Writes a copy of a GGUF file with every tensor dequantized to F32 (gguf-py's dequantizers, an
oracle independent of kiln): the "exact weights" reference of the fidelity comparisons.

    scripts/gguf_dequant.py IN.gguf OUT.gguf
"""
import sys

import numpy as np


def dequantize_file(src, dst):
    import gguf
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, a.reshape(tuple(reversed([int(x) for x in t.shape]))),
                     raw_dtype=gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    dequantize_file(sys.argv[1], sys.argv[2])
