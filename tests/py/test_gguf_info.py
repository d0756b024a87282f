"""`kiln gguf info` against gguf-py (the reference Python GGUF library) as the oracle.

Files come from llama.cpp's vocabulary GGUFs (../shared/data/vocab) and from gguf-py's own
GGUFWriter (tensors of several ggml types, every value type, a nested array), so neither the
input nor the expected values are produced by kiln.
"""
import json
import math
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")  # in scripts/requirements.txt: present in normal runs
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter  # noqa: E402

VT_NAMES = {
    GGUFValueType.UINT8: "u8", GGUFValueType.INT8: "i8", GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16", GGUFValueType.UINT32: "u32", GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32", GGUFValueType.BOOL: "bool", GGUFValueType.STRING: "string",
    GGUFValueType.ARRAY: "array", GGUFValueType.UINT64: "u64", GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}


def info_json(kiln_bin, path, *extra):
    r = subprocess.run([str(kiln_bin), "gguf", "info", "--json", *extra, str(path)],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return json.loads(r.stdout)


def same_value(got, want, vtype):
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        if isinstance(want, float) and math.isnan(want):
            return got is None
        return got == pytest.approx(float(want), rel=1e-6, abs=1e-30)
    if vtype == GGUFValueType.STRING:
        return got == want
    return got == want


def check_against_gguf_py(doc, path):
    ref = GGUFReader(str(path))
    ref_fields = [f for f in ref.fields.values() if not f.name.startswith("GGUF.")]
    assert list(doc["metadata"].keys()) == [f.name for f in ref_fields]  # same keys, same order
    for f in ref_fields:
        got = doc["metadata"][f.name]
        assert got["type"] == VT_NAMES[f.types[0]], f.name
        want = f.contents()
        if f.types[0] == GGUFValueType.ARRAY:
            assert got["elem_type"] == VT_NAMES[f.types[1]], f.name
            if f.types[1] == GGUFValueType.ARRAY:
                # gguf-py's contents() flattens nested arrays: compare the flattened elements;
                # the nesting itself is checked against the writer's input by the caller.
                assert [x for inner in got["value"] for x in inner] == want, f.name
                continue
            assert got["length"] == len(want), f.name
            assert got["truncated"] is False
            assert len(got["value"]) == len(want), f.name
            if f.types[1] == GGUFValueType.STRING:
                # kiln's JSON replaces invalid UTF-8; gguf-py decodes with errors='replace' too
                assert got["value"] == want, f.name
            else:
                for g, w in zip(got["value"], want):
                    assert same_value(g, w, f.types[1]), f"{f.name}: {g} != {w}"
        else:
            assert same_value(got["value"], want, f.types[0]), f"{f.name}: {got['value']!r} != {want!r}"
    assert doc["n_tensors"] == len(ref.tensors)
    for t, rt in zip(doc["tensors"], ref.tensors):
        assert t["name"] == rt.name
        assert t["type"] == GGMLQuantizationType(rt.tensor_type).name
        assert t["shape"] == [int(x) for x in rt.shape]
        assert t["n_elements"] == int(rt.n_elements)
        assert t["n_bytes"] == int(rt.n_bytes)
        assert doc["data_offset"] + t["offset"] == int(rt.data_offset)
    assert doc["n_parameters"] == sum(int(rt.n_elements) for rt in ref.tensors)
    assert doc["tensor_bytes"] == sum(int(rt.n_bytes) for rt in ref.tensors)
    return ref


# gguf-py's reader needs ~5 s per 150k-token vocabulary; the 32k-token SPM file keeps this quick
# (the C++ test tests/unit/test_gguf_reader.cpp opens all four vocabularies).
@pytest.mark.parametrize("vocab", ["llama-spm"])
def test_vocab_files_match_gguf_py(kiln_bin, shared_data, vocab):
    path = shared_data / "vocab" / f"ggml-vocab-{vocab}.gguf"
    if not path.exists():
        pytest.skip(f"{path} not present")
    doc = info_json(kiln_bin, path, "--full")
    assert doc["version"] == 3
    assert doc["file_size"] == path.stat().st_size
    check_against_gguf_py(doc, path)


@pytest.fixture(scope="module")
def written_model(work_dir):
    """A small model written by gguf-py's GGUFWriter: every value type and five tensor types."""
    path = work_dir / "written.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 18000000000000000000)
    w.add_int64("t.i64", -9000000000000000000)
    w.add_float64("t.f64", -1.5e300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo\nworld \"quoted\" " + "x" * 300)
    w.add_array("t.arr_i32", list(range(-5, 40)))
    w.add_array("t.arr_str", ["a", "", "中文", "tab\there"])
    w.add_array("t.arr_f32", [0.5, -2.25, 3.0e-8])
    w.add_array("t.nested", [[1, 2, 3], [4, 5]])
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((8, 64), dtype=np.float32))  # ne = [64, 8]
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float16))
    # quantized tensors as raw bytes: Q8_0 [64, 4] = 4 rows * 2 blocks * 34 B; Q4_K [256, 3]
    w.add_tensor("blk.0.attn_q.weight", rng.integers(0, 255, (4, 68), dtype=np.uint8),
                 raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_up.weight", rng.integers(0, 255, (3, 144), dtype=np.uint8),
                 raw_dtype=GGMLQuantizationType.Q4_K)
    w.add_tensor("blk.0.ffn_down.weight", rng.integers(0, 255, (2, 2, 32 * 2), dtype=np.uint8),
                 raw_dtype=GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_written_model_matches_gguf_py(kiln_bin, written_model):
    doc = info_json(kiln_bin, written_model, "--full")
    ref = check_against_gguf_py(doc, written_model)
    assert doc["alignment"] == 32
    nested = doc["metadata"]["t.nested"]
    assert (nested["elem_type"], nested["length"], nested["value"]) == ("array", 2, [[1, 2, 3], [4, 5]])
    totals = doc["totals_by_type"]
    assert set(totals) == {GGMLQuantizationType(t.tensor_type).name for t in ref.tensors}
    for name, tot in totals.items():
        ts = [t for t in ref.tensors if GGMLQuantizationType(t.tensor_type).name == name]
        assert tot == {"count": len(ts), "bytes": sum(int(t.n_bytes) for t in ts)}


def test_json_truncates_long_arrays_without_full(kiln_bin, written_model):
    doc = info_json(kiln_bin, written_model)
    a = doc["metadata"]["t.arr_i32"]
    assert a["length"] == 45 and a["truncated"] is True
    assert a["value"] == list(range(-5, 11))  # the first 16 elements


def test_text_output(kiln_bin, written_model):
    r = subprocess.run([str(kiln_bin), "gguf", "info", str(written_model)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "version      3" in out
    assert "tensors (5)" in out
    assert "[45] [-5, -4, -3, -2, -1, 0, ...]" in out            # long arrays summarized
    assert "\\n" in out and "... (" in out                     # strings escaped and truncated
    for name, typ, shape in [("token_embd.weight", "F32", "[64, 8]"), ("blk.0.attn_q.weight", "Q8_0", "[64, 4]"),
                             ("blk.0.ffn_up.weight", "Q4_K", "[256, 3]")]:
        line = next(l for l in out.splitlines() if l.strip().startswith(name + " "))
        assert typ in line and shape in line, line
    ref = GGUFReader(str(written_model))
    assert f"parameters   {sum(int(t.n_elements) for t in ref.tensors)} " in out


def test_errors_name_the_file_and_exit_1(kiln_bin, work_dir, written_model):
    garbage = work_dir / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all")
    truncated = work_dir / "truncated.gguf"
    data = written_model.read_bytes()
    truncated.write_bytes(data[: len(data) - 10])  # last tensor's data cut short
    for path, fragment in [(garbage, "not a GGUF file"), (truncated, "blk.0.ffn_down.weight"),
                           (work_dir / "missing.gguf", "cannot open")]:
        r = subprocess.run([str(kiln_bin), "gguf", "info", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (path, r.stdout, r.stderr)
        assert str(path) in r.stderr and fragment in r.stderr, r.stderr
    r = subprocess.run([str(kiln_bin), "gguf", "info"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "FILE" in r.stderr
    r = subprocess.run([str(kiln_bin), "gguf", "info", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--json" in r.stdout and "--full" in r.stdout
