"""`kiln bench` and the comparison/load-test scripts in bench/ (fast: tiny models, few tokens).

Oracles: the gguf package (gguf-py) for the file's size, parameter count, and the KV-cache bytes
expected from the model's shape; llama-cpp-python for bench/llamacpp_bench.py (same JSON as kiln);
an in-process fake OpenAI server with a known token stream for bench/serve_load.py.
"""
import http.server
import json
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import gguf  # scripts/requirements.txt: a required oracle, never skipped
from conftest import NGL_ARGS


@pytest.fixture(scope="module")
def tiny(kiln_bin, work_dir):
    path = work_dir / "bench-tiny-llama.gguf"
    subprocess.run([str(kiln_bin), "gguf", "gen", "--preset", "tiny-llama", "--type", "Q8_0", "-q", "-o", str(path)],
                   check=True, timeout=120)
    return path


def run_bench(kiln_bin, *args):
    r = subprocess.run([str(kiln_bin), "bench", *NGL_ARGS, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def file_facts(path):
    rd = gguf.GGUFReader(str(path))
    size = sum(int(t.n_bytes) for t in rd.tensors)
    n_params = sum(int(t.n_elements) for t in rd.tensors)
    f = lambda k: int(rd.fields[k].parts[-1][0])  # noqa: E731
    return {"size": size, "n_params": n_params, "n_layer": f("llama.block_count"), "n_embd": f("llama.embedding_length"),
            "n_head": f("llama.attention.head_count"), "n_head_kv": f("llama.attention.head_count_kv")}


def test_markdown_table(kiln_bin, tiny):
    out = run_bench(kiln_bin, "-m", str(tiny), "-p", "32,16", "-n", "8", "-pg", "16,4", "-r", "2", "-t", "1")
    lines = [l for l in out.splitlines() if l.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["model", "size", "params", "backend", "threads", "test", "t/s"]
    assert all(re.fullmatch(r"-+:?", c.strip()) for c in lines[1].strip("|").split("|")), lines[1]
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:6]]
    assert [r[5] for r in rows] == ["pp32", "pp16", "tg8", "pp16+tg4"]
    facts = file_facts(tiny)
    for r in rows:
        assert r[0].startswith("llama ") and r[0].endswith("Q8_0"), r
        assert r[1] == f"{facts['size'] / 2**20:.2f} MiB"
        assert r[2] == f"{facts['n_params'] / 1e6:.2f} M"
        assert r[3] == "CPU" and r[4] == "1"
        m = re.fullmatch(r"([0-9.]+) ± ([0-9.]+)", r[6])
        assert m and float(m.group(1)) > 0, r[6]
    # memory table follows: one row per test with weights, KV+state and scratch
    assert any("KV+state MiB" in l for l in lines[6:])
    assert len([l for l in lines if re.search(r"\|\s+(pp|tg)\d", l)]) == 8, out


def test_json(kiln_bin, tiny):
    out = run_bench(kiln_bin, "-m", str(tiny), "-p", "24", "-n", "6", "-r", "3", "-t", "1", "-ctk", "q8_0", "-ub", "8",
                    "-o", "json")
    rows = json.loads(out)
    assert [r["test"] for r in rows] == ["pp24", "tg6"]
    facts = file_facts(tiny)
    head_dim = facts["n_embd"] // facts["n_head"]
    for r in rows:
        assert r["model_size"] == facts["size"] and r["model_n_params"] == facts["n_params"]
        assert r["n_threads"] == 1 and r["n_ubatch"] == 8 and r["type_k"] == "q8_0" and r["type_v"] == "f16"
        assert len(r["samples_ns"]) == 3 and len(r["samples_ts"]) == 3
        n_tok = r["n_prompt"] + r["n_gen"]
        np.testing.assert_allclose(r["samples_ts"], [n_tok * 1e9 / ns for ns in r["samples_ns"]], rtol=1e-9)
        assert r["avg_ts"] == pytest.approx(np.mean(r["samples_ts"]), rel=1e-9)
        assert r["stddev_ts"] == pytest.approx(np.std(r["samples_ts"], ddof=1), rel=1e-6, abs=1e-9)
        # KV cache: n_ctx = P + N rows per layer; K in Q8_0 (34 bytes per 32), V in F16.
        n_ctx = n_tok
        row_k = head_dim // 32 * 34 * facts["n_head_kv"]
        row_v = head_dim * 2 * facts["n_head_kv"]
        assert r["state_bytes"] == facts["n_layer"] * n_ctx * (row_k + row_v)
        assert 0 < r["weights_bytes"] <= facts["size"]
        assert r["scratch_bytes"] > 0
    tg = rows[1]
    assert tg["tg_weight_gbps"] == pytest.approx(tg["decode_weight_read_bytes"] * tg["avg_ts"] / 1e9, rel=1e-9)


def test_depth(kiln_bin, tiny):
    # -d: each test starts after D tokens already in the sequence (llama-bench's --n-depth and names);
    # the memory holds D + P + N positions.
    out = run_bench(kiln_bin, "-m", str(tiny), "-p", "8", "-n", "4", "-d", "0,24", "-r", "2", "-t", "1", "-o", "json")
    rows = json.loads(out)
    assert [r["test"] for r in rows] == ["pp8", "tg4", "pp8 @ d24", "tg4 @ d24"]
    assert [r["n_depth"] for r in rows] == [0, 0, 24, 24]
    facts = file_facts(tiny)
    head_dim = facts["n_embd"] // facts["n_head"]
    row_kv = 2 * head_dim * 2 * facts["n_head_kv"]  # F16 K and V
    for r in rows:
        n_ctx = r["n_depth"] + r["n_prompt"] + r["n_gen"]
        assert r["state_bytes"] == facts["n_layer"] * n_ctx * row_kv, r["test"]
        # t/s counts the test's own tokens only (the depth prefill is untimed)
        np.testing.assert_allclose(r["samples_ts"], [(r["n_prompt"] + r["n_gen"]) * 1e9 / ns for ns in r["samples_ns"]],
                                   rtol=1e-9)
    md = run_bench(kiln_bin, "-m", str(tiny), "-p", "0", "-n", "4", "-d", "16", "-r", "1", "-t", "1")
    assert re.search(r"\|\s+tg4 @ d16\s+\|", md), md
    r = subprocess.run([str(kiln_bin), "bench", *NGL_ARGS, "-m", str(tiny), "-d", "-1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "-d -1" in r.stderr, r.stderr


def test_batched_bench_jsonl(kiln_bin, tiny):
    """`kiln batched-bench`: llama-batched-bench's JSONL fields, one row per (npp, ntg, npl), the token
    counts and speeds consistent with the times (shared prompt: N_KV = pp + pl * tg)."""
    rows = []
    for extra in ([], ["-pps"]):
        r = subprocess.run([str(kiln_bin), "batched-bench", *NGL_ARGS, "-m", str(tiny), "-npp", "16", "-ntg", "4",
                            "-npl", "1,3", "-t", "1", "-o", "jsonl", *extra], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        rows += [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    assert [(x["pl"], x["is_pp_shared"]) for x in rows] == [(1, 0), (3, 0), (1, 1), (3, 1)]
    for x in rows:
        assert x["pp"] == 16 and x["tg"] == 4 and x["n_threads"] == 1
        shared = x["is_pp_shared"] == 1
        assert x["n_kv"] == (16 + x["pl"] * 4 if shared else x["pl"] * 20)
        assert x["speed_pp"] == pytest.approx((16 if shared else 16 * x["pl"]) / x["t_pp"], rel=1e-6)
        assert x["speed_tg"] == pytest.approx(x["pl"] * 4 / x["t_tg"], rel=1e-6)
        assert x["t"] == pytest.approx(x["t_pp"] + x["t_tg"], rel=1e-6)
        assert x["speed"] == pytest.approx(x["n_kv"] / x["t"], rel=1e-6)
    bad = subprocess.run([str(kiln_bin), "batched-bench", "-m", str(tiny), "-npl", "600"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "-npl 600" in bad.stderr
    # A context shorter than the warm-up prompt (npp + ntg = 10) runs too.
    r = subprocess.run([str(kiln_bin), "batched-bench", *NGL_ARGS, "-m", str(tiny), "-npp", "8", "-ntg", "2",
                        "-npl", "1", "-t", "1", "-o", "jsonl"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # -c: llama-batched-bench's n_kv_max, split among the sequences; too few cells for npp + ntg fail.
    r = subprocess.run([str(kiln_bin), "batched-bench", *NGL_ARGS, "-m", str(tiny), "-c", "96", "-npp", "16", "-ntg",
                        "4", "-npl", "3", "-t", "1", "-o", "jsonl"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [json.loads(l)["n_kv_max"] for l in r.stdout.splitlines() if l.startswith("{")] == [96]
    bad = subprocess.run([str(kiln_bin), "batched-bench", "-m", str(tiny), "-c", "50", "-npp", "16", "-ntg", "4",
                          "-npl", "3"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "-c 50" in bad.stderr and "need 20" in bad.stderr, bad.stderr


def test_errors(kiln_bin, tiny, work_dir):
    missing = work_dir / "no-such-model.gguf"
    r = subprocess.run([str(kiln_bin), "bench", "-m", str(missing), "-r", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no-such-model.gguf" in r.stderr
    r = subprocess.run([str(kiln_bin), "bench", "-m", str(tiny), "-pg", "16"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "-pg" in r.stderr
    r = subprocess.run([str(kiln_bin), "bench", "-m", str(tiny), "-ctk", "q5_1"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "-ctk" in r.stderr


def test_llamacpp_side_and_report(kiln_bin, tiny, root, work_dir):
    import llama_cpp  # noqa: F401  scripts/requirements.txt: required, never skipped
    d = work_dir / "cmp"
    d.mkdir()
    stem = "bench-tiny-llama"
    common = ["-m", str(tiny), "-p", "32", "-n", "8", "-r", "2", "-t", "1", "-o", "jsonl"]
    (d / f"kiln-{stem}-1.jsonl").write_text(run_bench(kiln_bin, *common))
    r = subprocess.run([sys.executable, str(root / "bench" / "llamacpp_bench.py"), *common],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (d / f"llamacpp-{stem}-1.jsonl").write_text(r.stdout)
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert [x["test"] for x in rows] == ["pp32", "tg8"]
    facts = file_facts(tiny)
    assert rows[0]["model_size"] == facts["size"] and rows[0]["model_n_params"] == facts["n_params"]
    rep = subprocess.run([sys.executable, str(root / "bench" / "compare_report.py"), str(d)],
                         capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    table = [l for l in rep.stdout.splitlines() if l.startswith(f"| {stem} |")]
    assert len(table) == 2
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        k, l = float(cells[2].split()[0]), float(cells[3].split()[0])
        assert float(cells[4]) == pytest.approx(k / l, abs=0.01)


class FakeOpenAI(http.server.BaseHTTPRequestHandler):
    """Streams max_tokens one-word chunks, GAP seconds apart, after a DELAY; then usage and [DONE]."""
    DELAY, GAP = 0.05, 0.01
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/completions" and body["stream"] is True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        time.sleep(self.DELAY)
        n = body["max_tokens"]
        for i in range(n):
            ev = {"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
            self.wfile.flush()
            time.sleep(self.GAP)
        ev = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
        self.wfile.write(f"data: {json.dumps(ev)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


def test_serve_load_against_fake_server(root, work_dir):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        out = work_dir / "load.json"
        r = subprocess.run([sys.executable, str(root / "bench" / "serve_load.py"), "--url",
                            f"http://127.0.0.1:{srv.server_address[1]}", "--clients", "1,4", "--requests", "2",
                            "--max-tokens", "5", "--json", str(out), "--label", "fake"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = json.loads(out.read_text())
    finally:
        srv.shutdown()
    assert [(x["clients"], x["kind"]) for x in rows] == [(1, "shared"), (1, "unique"), (4, "shared"), (4, "unique")]
    for x in rows:
        assert x["errors"] == 0 and x["requests"] == 2 * x["clients"]
        assert x["completion_tokens"] == 5 * x["requests"]
        assert x["ttft_p50_ms"] >= 1e3 * FakeOpenAI.DELAY * 0.9
        assert x["ttft_p50_ms"] < 1e3 * FakeOpenAI.DELAY + 2000
        assert x["itl_p50_ms"] >= 1e3 * FakeOpenAI.GAP * 0.5
        assert x["ttft_p99_ms"] >= x["ttft_p50_ms"] and x["itl_p99_ms"] >= x["itl_p50_ms"]
        assert x["tokens_per_s"] > 0
    assert "| fake | 4 | unique |" in r.stdout
