#!/usr/bin/env python3
"""Image encode time on the CPU, kiln vs llama.cpp (issue #17), the same projector file and image.

A projector of Qwen3.5-9B's size (`kiln gguf gen --mmproj --preset qwen35-9b`, F16, or --n-layer N to cut
its depth) beside a 1-layer text model of width 4096 (llama.cpp's mtmd needs one to load a projector);
a generated W x H image (encode time does not depend on the pixels). kiln: `kiln image-embd --repeat R
--no-mmproj-offload -t T`; llama.cpp: llama-cpp-python's mtmd bindings (mtmd_encode_chunk), T threads,
the same repetitions, engines alternating. Prints one line per engine: mean of repetitions 2..R.

  .venv/bin/python bench/image_encode_cpu.py --kiln build/bin/kiln [--threads 2] [--size 448x448]
      [--layers 27] [--repeat 3] [--work /tmp/img-bench]
"""
import argparse
import ctypes
import pathlib
import re
import struct
import subprocess
import time
import zlib

import numpy as np


def write_png(path, w, h):
    rng = np.random.default_rng(1)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x * 7 + y * 3) % 256], -1) + rng.integers(-30, 30, (h, w, 3))
    rgb = np.clip(rgb, 0, 255).astype(np.uint8)
    raw = b"".join(b"\0" + rgb[r].tobytes() for r in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    return rgb


def llama_encode_ms(proj, text, rgb, threads, repeat):
    import llama_cpp
    from llama_cpp import mtmd_cpp as M
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(text).encode(), llama_cpp.llama_model_default_params())
    cp = M.mtmd_context_params_default()
    cp.use_gpu, cp.n_threads, cp.warmup, cp.image_min_tokens = False, threads, False, 4
    ctx = M.mtmd_init_from_file(str(proj).encode(), model, cp)
    h, w, _ = rgb.shape
    bmp = M.mtmd_bitmap_init(w, h, (ctypes.c_uint8 * rgb.size).from_buffer_copy(rgb.tobytes()))
    chunks = M.mtmd_input_chunks_init()
    marker = M.mtmd_default_marker()
    txt = M.mtmd_input_text(marker, len(marker), False, True)
    assert M.mtmd_tokenize(ctx, chunks, ctypes.byref(txt), (M.mtmd_bitmap_p_ctypes * 1)(bmp), 1) == 0
    img = [M.mtmd_input_chunks_get(chunks, k) for k in range(M.mtmd_input_chunks_size(chunks))]
    img = [c for c in img if M.mtmd_input_chunk_get_type(c) == 1][0]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        assert M.mtmd_encode_chunk(ctx, img) == 0
        times.append((time.perf_counter() - t0) * 1000)
    n = M.mtmd_input_chunk_get_n_tokens(img)
    M.mtmd_input_chunks_free(chunks)
    M.mtmd_bitmap_free(bmp)
    M.mtmd_free(ctx)
    llama_cpp.llama_model_free(model)
    return times, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", default="448x448")
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default="/tmp/img-bench")
    a = ap.parse_args()
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    w, h = map(int, a.size.split("x"))
    proj, text, png = work / f"mmproj-9b-{a.layers}.gguf", work / "text-4096.gguf", work / f"img-{w}x{h}.png"
    if not proj.exists():
        subprocess.run([a.kiln, "gguf", "gen", "-q", "--mmproj", "--preset", "qwen35-9b", "--n-layer", str(a.layers),
                        "-o", str(proj)], check=True)
    if not text.exists():
        subprocess.run([a.kiln, "gguf", "gen", "-q", "--preset", "qwen35-9b", "--n-layer", "1", "--n-vocab", "2048",
                        "--type", "Q8_0", "-o", str(text)], check=True)
    rgb = write_png(png, w, h)
    r = subprocess.run([a.kiln, "image-embd", "--mmproj", str(proj), "--image", str(png), "--repeat",
                        str(a.repeat), "--no-mmproj-offload", "-t", str(a.threads), "--image-min-tokens", "4"],
                       check=True, capture_output=True, text=True)
    m = re.search(r"(\d+) x (\d+) tokens.*encode ([0-9.]+) ms", r.stdout)
    print(f"kiln:      {w}x{h}, {int(m.group(1)) * int(m.group(2))} tokens, encode {float(m.group(3)):.0f} ms "
          f"(mean of runs 2..{a.repeat}), {a.threads} threads, {a.layers} ViT blocks")
    times, n = llama_encode_ms(proj, text, rgb, a.threads, a.repeat)
    tail = times[1:] if len(times) > 1 else times
    print(f"llama.cpp: {w}x{h}, {n} tokens, encode {sum(tail) / len(tail):.0f} ms (mean of runs 2..{a.repeat}), "
          f"{a.threads} threads, {a.layers} ViT blocks")


if __name__ == "__main__":
    main()
