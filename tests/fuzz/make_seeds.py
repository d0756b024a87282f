#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_gguf: small valid GGUF files covering every value type,
nested arrays, v2 and v3, custom alignment and several tensor types (plus a few near-misses).
Standard library only. Usage: make_seeds.py OUT_DIR
"""
import struct
import sys
from pathlib import Path

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
          U64: "<Q", I64: "<q", F64: "<d"}
# ggml type id -> (block size, bytes per block)
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 12: (256, 144), 14: (256, 210), 30: (1, 2), 39: (32, 17)}


def s(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def value(t: int, v) -> bytes:
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(value(et, i) for i in items)
    return struct.pack(SCALAR[t], v)


def gguf(kvs, tensors=(), version=3, align=32) -> bytes:
    """kvs: [(key, type, value)]; tensors: [(name, ne list, ggml type)] laid out in order."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += s(k) + struct.pack("<I", t) + value(t, v)
    offset, sizes = 0, []
    for name, ne, gt in tensors:
        bs, ts = GGML[gt]
        nbytes = ne[0] // bs * ts
        for d in ne[1:]:
            nbytes *= d
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", d) for d in ne)
        out += struct.pack("<IQ", gt, offset)
        sizes.append(nbytes)
        offset += (nbytes + align - 1) // align * align
    out += b"\0" * (-len(out) % align)
    for n in sizes:
        out += bytes((i * 37) & 0xFF for i in range(n)) + b"\0" * (-n % align)
    return out


def seeds():
    every = [
        ("general.architecture", STR, "llama"), ("a.u8", U8, 7), ("a.i8", I8, -7), ("a.u16", U16, 700),
        ("a.i16", I16, -700), ("a.u32", U32, 70000), ("a.i32", I32, -70000), ("a.f32", F32, 0.5),
        ("a.bool", BOOL, 1), ("a.u64", U64, 2**40), ("a.i64", I64, -(2**40)), ("a.f64", F64, 1e-300),
        ("a.tokens", ARR, (STR, ["<s>", "</s>", "hello", "\u4e2d"])), ("a.scores", ARR, (F32, [0.0, -1.5, 2.0])),
        ("a.nested", ARR, (ARR, [(U16, [1, 2]), (U16, [])])),
    ]
    yield "empty", gguf([])
    yield "every_value_type", gguf(every)
    yield "v2", gguf([("general.name", STR, "v2")], version=2)
    yield "tensors", gguf([("general.architecture", STR, "llama")],
                          [("token_embd.weight", [32, 4], 0), ("blk.0.attn_q.weight", [256, 2], 12),
                           ("blk.0.ffn_up.weight", [64], 8), ("output_norm.weight", [8], 1)])
    yield "align64", gguf([("general.alignment", U32, 64)], [("a", [3], 0), ("b", [32, 2], 2)], align=64)
    yield "align1", gguf([("general.alignment", U32, 1)], [("a", [3], 0), ("b", [5], 1)], align=1)
    yield "more_types", gguf([], [("q6", [256], 14), ("bf", [4, 4, 2], 30), ("mx", [32, 1, 1, 2], 39)])
    yield "everything", gguf(every, [("t0", [32, 2], 8), ("t1", [16], 0)])


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fuzz-seeds")
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for name, data in seeds():
        (out / f"{name}.gguf").write_bytes(data)
        n += 1
    print(f"make_seeds: wrote {n} seeds to {out}")


if __name__ == "__main__":
    main()
