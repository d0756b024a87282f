"""Generated vision projectors (`kiln gguf gen --mmproj`, model/gen/mmproj.h) through llama.cpp's mtmd
(llama-cpp-python's mtmd_cpp bindings), the path tests/py/test_vision_llamacpp.py takes with the
converter-written fixture.

The projectors have the real Qwen3.5-9B tower widths (E 1152, 16 heads of 72, FFN 4304, a 4608-wide
merger, 48 x 48 positions) with fewer blocks (11: two-digit block names, in the converter's order)
and an output width of 256, the n_embd of the generated tiny-qwen35 text model mtmd pairs them with
(mtmd refuses a projector whose width is not the text model's). llama.cpp must load them, give the
image the expected token grid, finite and non-degenerate embeddings, and the same embeddings (to
rounding) for the same weights stored as F32, F16, BF16 and Q8_0 — so it reads every tensor of each type
where kiln writes it. And kiln's encoder (`kiln image-embd`, the path `kiln serve` takes: PNG decode,
preprocessing, ViT, merger) gives llama.cpp's embeddings on them, within the rounding the two differ
by on real widths (llama.cpp's CPU graph: GELU-tanh from an F16 table in the merger where kiln takes
the exact erf form as HF, F16 K/V in its flash attention); on the converter-written fixture the two
are within 1.5e-3 of each other through HF (tests/py/test_vision_llamacpp.py). More of kiln's
encoder on such files: tests/model/test_mmproj_gen.cpp.
"""
import ctypes
import struct
import subprocess
import zlib

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")

W, H = 128, 64  # multiples of 32: no resize, a 4 x 2 token grid
N_OUT = 256
# kiln vs llama.cpp, relative to the largest |embedding| (measured: see test_kiln_encodes_as_llamacpp).
# Q8_0 and BF16: each engine rounds its activations for those matrices (each engine's result is 1.5e-2 /
# 5e-3 from its own F32 one; measured kiln vs llama.cpp 1.4e-2 / 4.7e-3).
TOL = {"f16-11": 5e-3, "f32": 5e-3, "q8": 3e-2, "bf16": 1.5e-2, "tiny": 5e-3}


def gen(kiln_bin, out, *args):
    cmd = [str(kiln_bin), "gguf", "gen", "-q", "-o", str(out), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{cmd}: {r.stderr}"
    return out


@pytest.fixture(scope="module")
def files(kiln_bin, work_dir):
    real = ["--mmproj", "--preset", "qwen35-9b", "--n-out", str(N_OUT)]
    return {
        "text": gen(kiln_bin, work_dir / "mm-text.gguf", "--preset", "tiny-qwen35"),
        "f16-11": gen(kiln_bin, work_dir / "mm-f16-11.gguf", *real, "--n-layer", "11"),
        "f32": gen(kiln_bin, work_dir / "mm-f32.gguf", *real, "--n-layer", "2", "--type", "F32"),
        "f16": gen(kiln_bin, work_dir / "mm-f16.gguf", *real, "--n-layer", "2"),
        "q8": gen(kiln_bin, work_dir / "mm-q8.gguf", *real, "--n-layer", "2", "--type", "Q8_0"),
        "bf16": gen(kiln_bin, work_dir / "mm-bf16.gguf", *real, "--n-layer", "2", "--type", "BF16"),
        "tiny": gen(kiln_bin, work_dir / "mm-tiny.gguf", "--mmproj", "--preset", "tiny", "--n-out", str(N_OUT)),
    }


def image(w=W, h=H):
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), ((x * 7 + y * 3) % 256)], -1)
    return np.ascontiguousarray(rgb.astype(np.uint8))


def write_png(path, rgb):
    """RGB8 PNG, every row filter 0."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\0" + rgb[y].tobytes() for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    return path


@pytest.fixture(scope="module")
def mtmd(files):
    try:
        from llama_cpp import mtmd_cpp as M
    except Exception as e:  # pragma: no cover - depends on the wheel
        pytest.skip(f"llama-cpp-python has no mtmd bindings: {e}")
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(files["text"]).encode(), llama_cpp.llama_model_default_params())
    assert model, "llama.cpp could not load the generated text model"
    yield M, model
    llama_cpp.llama_model_free(model)


def encode(mtmd, path, w=W, h=H):
    """llama.cpp's embeddings of the w x h test image through projector `path`: (nx, ny, [n, n_embd])."""
    M, model = mtmd
    cp = M.mtmd_context_params_default()
    cp.use_gpu = False
    cp.n_threads = 2
    cp.warmup = False
    cp.image_min_tokens = 4
    ctx = M.mtmd_init_from_file(str(path).encode(), model, cp)
    assert ctx, f"mtmd could not load the generated projector {path}"
    rgb = image(w, h)
    bmp = M.mtmd_bitmap_init(w, h, (ctypes.c_uint8 * rgb.size).from_buffer_copy(rgb.tobytes()))
    chunks = M.mtmd_input_chunks_init()
    try:
        marker = M.mtmd_default_marker()
        txt = M.mtmd_input_text(marker, len(marker), False, True)
        arr = (M.mtmd_bitmap_p_ctypes * 1)(bmp)
        assert M.mtmd_tokenize(ctx, chunks, ctypes.byref(txt), arr, 1) == 0
        img = [M.mtmd_input_chunks_get(chunks, k) for k in range(M.mtmd_input_chunks_size(chunks))]
        img = [c for c in img if M.mtmd_input_chunk_get_type(c) == 1]  # MTMD_INPUT_CHUNK_TYPE_IMAGE
        assert len(img) == 1
        toks = M.mtmd_input_chunk_get_tokens_image(img[0])
        nx, ny = M.mtmd_image_tokens_get_nx(toks), M.mtmd_image_tokens_get_ny(toks)
        n = M.mtmd_input_chunk_get_n_tokens(img[0])
        assert M.mtmd_encode_chunk(ctx, img[0]) == 0
        n_embd = llama_cpp.llama_model_n_embd(mtmd[1])
        emb = np.ctypeslib.as_array(M.mtmd_get_output_embd(ctx), shape=(n * n_embd,)).reshape(n, n_embd).copy()
        return nx, ny, emb
    finally:
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bmp)
        M.mtmd_free(ctx)


@pytest.mark.parametrize("name", ["f16-11", "f32", "f16", "q8", "bf16", "tiny"])
def test_mtmd_encodes_generated_projector(files, mtmd, name):
    nx, ny, emb = encode(mtmd, files[name])
    assert (nx, ny) == (W // 32, H // 32)
    assert emb.shape == (nx * ny, N_OUT)
    assert np.isfinite(emb).all()
    sd = float(emb.std())
    print(f"{name}: {nx} x {ny} tokens, std {sd:.3f}")
    assert 0.05 < sd < 20.0
    assert float(np.abs(emb[0] - emb[-1]).max()) > 1e-3  # tokens differ: the image reaches them


def test_mtmd_types_agree(files, mtmd):
    """The same seeded weights as F32, F16 and Q8_0 files: llama.cpp's embeddings agree to rounding."""
    ref = encode(mtmd, files["f32"])[2]
    for name, tol in (("f16", 0.02), ("bf16", 0.02), ("q8", 0.05)):
        got = encode(mtmd, files[name])[2]
        rel = float(np.abs(got - ref).max() / np.abs(ref).max())
        corr = float(np.corrcoef(got.ravel(), ref.ravel())[0, 1])
        print(f"{name} vs f32: max rel {rel:.2e}, corr {corr:.6f}")
        assert rel < tol and corr > 0.999, (name, rel, corr)


def test_gguf_py_reads_generated_projector(files):
    r = gguf.GGUFReader(str(files["f16-11"]))
    f = r.fields
    assert f["general.architecture"].contents() == "clip"
    assert f["clip.projector_type"].contents() == "qwen3vl_merger"
    assert f["clip.vision.block_count"].contents() == 11
    assert f["clip.vision.embedding_length"].contents() == 1152
    assert f["clip.vision.projection_dim"].contents() == N_OUT
    assert f["clip.vision.is_deepstack_layers"].contents() == [False] * 11
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["v.blk.10.attn_qkv.weight"] == "F16" and types["v.blk.10.attn_qkv.bias"] == "F32"
    assert types["v.patch_embd.weight.1"] == "F16" and types["v.position_embd.weight"] == "F32"
    names = [t.name for t in r.tensors]
    assert names.index("v.blk.10.ln1.weight") < names.index("v.blk.2.attn_out.bias")  # converter order


def kiln_vs_llamacpp(kiln_bin, files, mtmd, work_dir, name, w, h):
    """kiln's (`kiln image-embd`) and llama.cpp's embeddings of the w x h test image through projector
    `name`: (max |kiln - llama.cpp| relative to the largest, correlation)."""
    png = write_png(work_dir / f"mm-image-{w}x{h}.png", image(w, h))
    out = work_dir / f"kiln-{name}-{w}x{h}.f32"
    r = subprocess.run([str(kiln_bin), "image-embd", "--mmproj", str(files[name]), "--image", str(png),
                        "--image-min-tokens", "4", "-t", "2", "-o", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{w // 32} x {h // 32} tokens of {N_OUT} floats" in r.stdout, r.stdout
    nx, ny, want = encode(mtmd, files[name], w, h)
    got = np.fromfile(out, dtype="<f4").reshape(nx * ny, N_OUT)
    rel = float(np.abs(got - want).max()) / float(np.abs(want).max())
    corr = float(np.corrcoef(got.ravel(), want.ravel())[0, 1])
    print(f"{name} {w}x{h}: max |kiln - llama.cpp| {rel:.2e} of the largest, corr {corr:.6f}")
    return rel, corr


@pytest.mark.parametrize("name", ["f16-11", "f32", "q8", "bf16", "tiny"])
def test_kiln_encodes_as_llamacpp(kiln_bin, files, mtmd, work_dir, name):
    rel, corr = kiln_vs_llamacpp(kiln_bin, files, mtmd, work_dir, name, W, H)
    assert rel < TOL[name] and corr > 0.9995, (name, rel, corr)


@pytest.mark.parametrize("name", ["tiny", "f32"])
def test_kiln_encodes_large_image_as_llamacpp(kiln_bin, files, mtmd, work_dir, name):
    """704 x 640 pixels = 1760 patches: kiln's q|k|v projection and MLP run in two chunks of patches
    (model/vision.h kVisionChunk), its attention as one non-causal run over all 1760 keys."""
    rel, corr = kiln_vs_llamacpp(kiln_bin, files, mtmd, work_dir, name, 704, 640)
    assert rel < TOL[name] and corr > 0.9995, (name, rel, corr)
