"""Oracle test for kiln's reference quantize/dequantize (`kiln quant`), against the numpy
implementations in the `gguf` PyPI package (gguf-py, maintained with llama.cpp).

For every type both cover:
  1. random blocks (random bytes, fp16 scale fields replaced by random *finite* halves, normals,
     subnormals and negatives included) -> `kiln quant dequant` must equal gguf.quants.dequantize
     bit for bit;
  2. `kiln quant quantize` output, dequantized by gguf, must equal kiln's own dequantization bit
     for bit (our blocks are read the same way by llama.cpp's layout) and be within the
     documented error bound (docs/formats.md) of the input;
  3. where gguf also has a quantizer (BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0; F16 via numpy astype) it is
     ggml's deterministic reference algorithm, so the bytes must be identical.
Q8_K is not in gguf-py; it is checked against a small numpy decoder written here from the
format definition (f32 d at byte 0, int8 qs at 4..259, y = d * qs).
"""
import json
import subprocess

import numpy as np
import pytest

# gguf is in scripts/requirements.txt (always installed by `make test`): a missing one is a failure.
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf import quants as gq

# Byte offsets of the fp16 scale fields in one block (ggml-common.h layouts).
FP16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0],
}
BLOCK_TYPES = list(FP16_FIELDS)
PLAIN_TYPES = ["F32", "F16", "BF16"]

# Normalized RMSE bounds on N(0, sigma^2) data (docs/formats.md; same table as tests/unit/test_quant.cpp).
NRMSE_BOUND = {
    "F32": 0.0, "F16": 3.0e-4, "BF16": 2.4e-3, "Q8_0": 6.0e-3, "Q8_K": 7.5e-3, "Q6_K": 1.85e-2,
    "Q5_0": 4.7e-2, "Q5_1": 4.2e-2, "Q5_K": 3.9e-2, "Q4_0": 9.5e-2, "Q4_1": 8.6e-2, "Q4_K": 7.8e-2,
    "IQ4_NL": 8.1e-2, "IQ4_XS": 8.2e-2, "Q3_K": 1.58e-1, "Q2_K": 2.95e-1,
}
GGUF_QUANTIZERS = ["BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def geometry(name):
    return GGML_QUANT_SIZES[QT[name]]


def kiln_dequant(kiln_bin, work_dir, name, blocks: np.ndarray) -> np.ndarray:
    src, dst = work_dir / f"{name}.blocks", work_dir / f"{name}.deq.f32"
    src.write_bytes(blocks.tobytes())
    subprocess.run([str(kiln_bin), "quant", "dequant", "--type", name, str(src), str(dst)], check=True)
    return np.fromfile(dst, dtype=np.float32)


def kiln_quantize(kiln_bin, work_dir, name, x: np.ndarray) -> np.ndarray:
    src, dst = work_dir / f"{name}.in.f32", work_dir / f"{name}.q"
    src.write_bytes(x.astype("<f4").tobytes())
    subprocess.run([str(kiln_bin), "quant", "quantize", "--type", name, str(src), str(dst)], check=True)
    return np.fromfile(dst, dtype=np.uint8)


def gguf_dequant(name, blocks: np.ndarray) -> np.ndarray:
    return gq.dequantize(blocks, QT[name]).reshape(-1).astype(np.float32, copy=False)


def random_finite_halves(rng, n) -> np.ndarray:
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    inf_nan = (h & 0x7C00) == 0x7C00
    h[inf_nan] &= np.uint16(0xBFFF)  # clear the top exponent bit: still random, now finite
    return h


def random_blocks(rng, name, n_blocks) -> np.ndarray:
    _, type_size = geometry(name)
    b = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint16).astype(np.uint8)
    for off in FP16_FIELDS[name]:
        b[:, off:off + 2] = random_finite_halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return b


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray, what: str):
    assert ours.shape == theirs.shape, what
    a, b = ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32)
    bad = np.flatnonzero(a != b)
    assert bad.size == 0, (f"{what}: {bad.size} of {a.size} values differ; first at {bad[0]}: "
                           f"kiln {ours[bad[0]]!r} ({a[bad[0]]:#010x}) vs gguf {theirs[bad[0]]!r} ({b[bad[0]]:#010x})")


def nrmse(x, y):
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    return float(np.sqrt(np.sum((y64 - x64) ** 2) / np.sum(x64 ** 2)))


def gaussian_rows(rng, n):
    """N(0,1) data at three scales plus a few special blocks (zeros, constant, outlier)."""
    x = rng.standard_normal(n).astype(np.float32)
    x[: n // 4] *= np.float32(0.02)
    x[n // 4: n // 2] *= np.float32(30.0)
    return x


# --------------------------------------------------------------------------------------------

def test_types_table_matches_gguf_geometry(kiln_bin):
    out = subprocess.run([str(kiln_bin), "quant", "types", "--json"], check=True, capture_output=True, text=True)
    rows = json.loads(out.stdout)
    names = [r["name"] for r in rows]
    assert sorted(names) == sorted(BLOCK_TYPES + PLAIN_TYPES + ["Q8_K"])
    for r in rows:
        qt = QT[r["name"]]
        assert r["id"] == int(qt)
        assert (r["block_size"], r["type_size"]) == GGML_QUANT_SIZES[qt], r["name"]


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_random_blocks_bit_exact(kiln_bin, work_dir, name):
    rng = np.random.default_rng(0xC0FFEE + int(QT[name]))
    block_size, _ = geometry(name)
    n_blocks = 8192 if block_size == 32 else 2048
    blocks = random_blocks(rng, name, n_blocks)
    ours = kiln_dequant(kiln_bin, work_dir, name, blocks)
    theirs = gguf_dequant(name, blocks)
    assert ours.size == n_blocks * block_size
    assert np.all(np.isfinite(theirs))
    assert_bits_equal(ours, theirs, f"{name} random blocks ({n_blocks} blocks)")


def test_plain_types_bit_exact_exhaustive(kiln_bin, work_dir):
    # F16 / BF16: every one of the 65536 bit patterns, NaN payloads and infinities included.
    pats = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ours = kiln_dequant(kiln_bin, work_dir, "F16", pats)
    assert_bits_equal(ours, pats.view(np.float16).astype(np.float32), "F16 all patterns")
    ours = kiln_dequant(kiln_bin, work_dir, "BF16", pats)
    assert_bits_equal(ours, gguf_dequant("BF16", pats.view(np.uint8)), "BF16 all patterns")
    bits = np.random.default_rng(1).integers(0, 1 << 32, size=65536, dtype=np.uint64).astype(np.uint32)
    ours = kiln_dequant(kiln_bin, work_dir, "F32", bits)
    assert np.array_equal(ours.view(np.uint32), bits)


def test_q8_k_against_format_definition(kiln_bin, work_dir):
    # Not covered by gguf-py: decode with numpy straight from the layout (d f32, qs int8[256], bsums).
    rng = np.random.default_rng(8)
    n_blocks = 1024
    raw = rng.integers(0, 256, size=(n_blocks, 292), dtype=np.uint16).astype(np.uint8)
    d = (rng.standard_normal(n_blocks) * 10.0 ** rng.uniform(-6, 3, n_blocks)).astype("<f4")
    raw[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    ours = kiln_dequant(kiln_bin, work_dir, "Q8_K", raw)
    qs = raw[:, 4:260].view(np.int8).astype(np.float32)
    assert_bits_equal(ours, (d.reshape(-1, 1) * qs).reshape(-1), "Q8_K random blocks")
    # Our Q8_K quantizer: levels in [-127, 127], bsums = sums of 16, d * qs close to x.
    x = gaussian_rows(rng, 256 * 256)
    q = kiln_quantize(kiln_bin, work_dir, "Q8_K", x).reshape(-1, 292)
    lv = q[:, 4:260].view(np.int8).astype(np.int32)
    assert lv.min() >= -127 and lv.max() <= 127
    bsums = q[:, 260:292].copy().view("<i2").astype(np.int32)
    assert np.array_equal(bsums, lv.reshape(-1, 16, 16).sum(axis=-1))
    y = kiln_dequant(kiln_bin, work_dir, "Q8_K", q)
    assert_bits_equal(y, (q[:, 0:4].copy().view("<f4") * lv.astype(np.float32)).reshape(-1), "Q8_K quantized")
    assert nrmse(x, y) <= NRMSE_BOUND["Q8_K"]


@pytest.mark.parametrize("name", BLOCK_TYPES + PLAIN_TYPES)
def test_our_quantizer_read_identically_by_gguf(kiln_bin, work_dir, name):
    rng = np.random.default_rng(0xBEEF + int(QT[name]))
    block_size, type_size = geometry(name)
    n = 256 * 256
    x = gaussian_rows(rng, n)
    q = kiln_quantize(kiln_bin, work_dir, name, x)
    assert q.size == n // block_size * type_size
    ours = kiln_dequant(kiln_bin, work_dir, name, q)
    theirs = gguf_dequant(name, q)
    assert_bits_equal(ours, theirs, f"{name}: gguf's reading of kiln's blocks")
    assert np.all(np.isfinite(ours))
    # Error bound on each of the three scale bands (0.02, 30, 1).
    for lo, hi in [(0, n // 4), (n // 4, n // 2), (n // 2, n)]:
        e = nrmse(x[lo:hi], ours[lo:hi])
        assert e <= NRMSE_BOUND[name], f"{name}: nrmse {e:.5f} > {NRMSE_BOUND[name]} on [{lo}, {hi})"


def _fma_ambiguous_blocks(x: np.ndarray, name: str) -> np.ndarray:
    """Q4_0/Q5_0: blocks where ggml's level trunc(x*id + off) depends on FMA contraction."""
    off = {"Q4_0": 8.5, "Q5_0": 16.5}[name]
    div = {"Q4_0": -8, "Q5_0": -16}[name]
    b = x.reshape(-1, 32)
    mx = np.take_along_axis(b, np.abs(b).argmax(axis=-1)[:, None], axis=-1)
    d = mx / np.float32(div)
    with np.errstate(divide="ignore"):
        idv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    unfused = np.trunc((b * idv) + np.float32(off))
    fused = np.trunc((b.astype(np.float64) * idv.astype(np.float64) + off).astype(np.float32))
    return np.any(unfused != fused, axis=-1)


@pytest.mark.parametrize("name", GGUF_QUANTIZERS + ["F16"])
def test_quantizer_matches_gguf_reference_quantizer(kiln_bin, work_dir, name):
    rng = np.random.default_rng(0xFACE + int(QT[name]))
    n = 32 * 8192
    x = gaussian_rows(rng, n)
    x[:32] = 0.0                     # all-zero block
    x[32:64] = np.float32(0.75)      # constant block
    x[64:96] = rng.standard_normal(32).astype(np.float32)
    x[70] = np.float32(-50.0)        # one outlier
    ours = kiln_quantize(kiln_bin, work_dir, name, x)
    theirs = gq.quantize(x, QT[name]).reshape(-1).view(np.uint8)
    assert ours.size == theirs.size
    if np.array_equal(ours, theirs):
        return
    _, type_size = geometry(name)
    bad = np.flatnonzero(np.any(ours.reshape(-1, type_size) != theirs.reshape(-1, type_size), axis=-1))
    if name in ("Q4_0", "Q5_0"):
        # A newer gguf-py may emulate ggml's FMA-contracted rounding; only those blocks may differ.
        amb = _fma_ambiguous_blocks(x, name)
        assert np.all(amb[bad]), f"{name}: {bad.size} blocks differ, not all FMA-ambiguous (first {bad[0]})"
        return
    pytest.fail(f"{name}: {bad.size} of {ours.size // type_size} blocks differ from gguf's quantizer (first {bad[0]})")


def test_cli_rejects_bad_input(kiln_bin, work_dir):
    bad = work_dir / "bad.blocks"
    bad.write_bytes(b"\0" * 19)
    r = subprocess.run([str(kiln_bin), "quant", "dequant", "--type", "Q4_0", str(bad), str(work_dir / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "bad.blocks" in r.stderr and "Q4_0" in r.stderr
    r = subprocess.run([str(kiln_bin), "quant", "dequant", "--type", "IQ2_XXS", str(bad), str(work_dir / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "IQ2_XXS" in r.stderr
    r = subprocess.run([str(kiln_bin), "quant", "dequant", "--type", "Q9_9", str(bad), str(work_dir / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Q9_9" in r.stderr
    nan = work_dir / "nan.f32"
    x = np.zeros(32, dtype="<f4")
    x[5] = np.nan
    nan.write_bytes(x.tobytes())
    r = subprocess.run([str(kiln_bin), "quant", "quantize", "--type", "Q8_0", str(nan), str(work_dir / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "nan.f32" in r.stderr and "index 5" in r.stderr
    r = subprocess.run([str(kiln_bin), "quant", "quantize", str(nan), str(work_dir / "o")], capture_output=True, text=True)
    assert r.returncode == 2
