"""Images in over the HTTP API (issue #17): kiln serve with the tiny Qwen3.5-VL fixture
(tests/fixtures/hf/vision: text model + projector converted by llama.cpp's converter).

The image part of an OpenAI chat request (data: URL and http:// URL from a local HTTP server),
usage counting image tokens, the prefix cache on a follow-up, /props modalities, and malformed
images (truncated, bad base64, wrong MIME, huge dimensions, a decompression bomb, redirects,
other schemes) answered 400 naming the field with the server alive.
"""
import base64
import http.server
import pathlib
import struct
import threading
import zlib

import pytest
import requests
from server_harness import AGAINST, KilnServer

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "vision"
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
            "{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
            "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")

pytestmark = pytest.mark.skipif(bool(AGAINST), reason="starts kiln with its own flags (KILN_TEST_AGAINST is set)")


def png(w, h, raw=None, color=2):
    """A PNG of w x h (RGB, every row filter 0); raw: the scanlines (default: zeros)."""
    ch = 3 if color == 2 else 1
    data = raw if raw is not None else b"\0" * ((w * ch + 1) * h)

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(data, 9)) + chunk(b"IEND", b""))


def data_url(b, mime="image/png"):
    return f"data:{mime};base64," + base64.b64encode(b).decode()


def chat(url, image_url, text="describe", key=None, max_tokens=4):
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                      {"type": "text", "text": text}]}],
            "max_tokens": max_tokens, "temperature": 0}
    h = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(url + "/v1/chat/completions", json=body, headers=h, timeout=60)


@pytest.fixture(scope="module")
def tmpl(tmp_path_factory):
    p = tmp_path_factory.mktemp("vision") / "t.jinja"
    p.write_text(TEMPLATE)
    return p


@pytest.fixture(scope="module")
def srv(kiln_bin, tmpl):
    with KilnServer(kiln_bin, FIX / "model.gguf", ["-c", "512", "--mmproj", FIX / "mmproj.gguf", "--chat-template-file",
                                                   tmpl, "--api-key", "sk-test", "--image-min-tokens", "4"]) as s:
        yield s


@pytest.fixture(scope="module")
def images_http():
    """A local HTTP server: /img0.png, /missing (404), /redirect (302 to a file: URL)."""
    img = (FIX / "img0.png").read_bytes()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/img0.png":
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(img)))
                self.end_headers()
                self.wfile.write(img)
            elif self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "file:///etc/passwd")
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *a):
            pass
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{s.server_address[1]}"
    s.shutdown()


def test_props_modalities(srv):
    p = requests.get(srv.url + "/props", headers={"Authorization": "Bearer sk-test"}, timeout=10).json()
    assert p["modalities"] == {"vision": True, "audio": False}


def test_image_data_url_and_cache(srv):
    url = data_url((FIX / "img0.png").read_bytes())
    r = chat(srv.url, url, key="sk-test")
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["choices"][0]["message"]["content"] is not None
    # The same request without the image: the image adds its 6 tokens (96x64 px -> 3x2) plus
    # <|vision_start|> / <|vision_end|> (byte tokens in the tiny vocabulary).
    t = requests.post(srv.url + "/v1/chat/completions", headers={"Authorization": "Bearer sk-test"}, timeout=60,
                      json={"messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}]}],
                            "max_tokens": 1}).json()
    n_img = j["usage"]["prompt_tokens"] - t["usage"]["prompt_tokens"]
    assert n_img >= 6 + 2, (j["usage"], t["usage"])
    # A second question about the same image reuses its tokens from the prefix cache.
    r2 = chat(srv.url, url, text="and the colours?", key="sk-test")
    assert r2.status_code == 200, r2.text
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 6, r2.json()["usage"]
    # A different image of the same size is not a cache hit past the image's first token.
    other = data_url((FIX / "img1.png").read_bytes())
    r3 = chat(srv.url, other, key="sk-test")
    assert r3.status_code == 200, r3.text
    assert r3.json()["usage"]["prompt_tokens"] - t["usage"]["prompt_tokens"] >= 8 + 2


def test_anthropic_and_responses_images(srv):
    b64 = base64.b64encode((FIX / "img0.png").read_bytes()).decode()
    h = {"Authorization": "Bearer sk-test"}
    r = requests.post(srv.url + "/v1/messages", headers=h, timeout=60, json={
        "model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": "what is this?"}]}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] >= 6 + 2
    r = requests.post(srv.url + "/v1/responses", headers=h, timeout=60, json={
        "model": "m", "max_output_tokens": 3, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64," + b64},
            {"type": "input_text", "text": "what is this?"}]}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] >= 6 + 2
    bad = requests.post(srv.url + "/v1/messages", headers=h, timeout=60, json={
        "model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": b64}}]}]})
    assert bad.status_code == 400 and "image/gif" in bad.text, bad.text


def test_image_http_url(srv, images_http):
    r = chat(srv.url, images_http + "/img0.png", key="sk-test")
    assert r.status_code == 200, r.text
    for path, needle in (("/missing", "HTTP 404"), ("/redirect", "redirect")):
        r = chat(srv.url, images_http + path, key="sk-test")
        assert r.status_code == 400, r.text
        assert needle in r.json()["error"]["message"], r.text


BAD = [
    ("truncated", lambda: data_url((FIX / "img0.png").read_bytes()[:200]), "corrupt"),
    ("bad base64", lambda: "data:image/png;base64,iVBORw0KGgo!!!", "base64"),
    ("wrong MIME", lambda: data_url((FIX / "img0.png").read_bytes(), "image/jpeg"), "declared image/jpeg"),
    ("not an image MIME", lambda: data_url(b"hello", "text/plain"), "MIME"),
    ("huge dimensions", lambda: data_url(png(100000, 100000, raw=b"\0" * 16)), "limit"),
    ("decompression bomb", lambda: data_url(png(8000, 8000, color=0)), "limit"),
    ("other scheme", lambda: "file:///etc/passwd", "scheme"),
    ("garbage", lambda: data_url(b"\0" * 100), "not a supported image"),
]


@pytest.mark.parametrize("name,make,needle", BAD, ids=[b[0] for b in BAD])
def test_malformed_images(srv, name, make, needle):
    r = chat(srv.url, make(), key="sk-test")
    assert r.status_code == 400, (name, r.text)
    e = r.json()["error"]
    assert needle in e["message"], (name, e)
    assert "messages" in (e.get("param") or e["message"]), e
    assert requests.get(srv.url + "/health", timeout=10).status_code == 200


def test_without_projector(kiln_bin, tmpl):
    with KilnServer(kiln_bin, FIX / "model.gguf", ["-c", "256", "--chat-template-file", tmpl]) as s:
        r = chat(s.url, data_url((FIX / "img0.png").read_bytes()))
        assert r.status_code == 400
        assert "--mmproj" in r.json()["error"]["message"]
        p = requests.get(s.url + "/props", timeout=10).json()
        assert p["modalities"]["vision"] is False


def test_encoding_does_not_stall_other_slots(kiln_bin, tmpl):
    """A large image is encoded off the engine thread: a text stream on the other slot keeps producing
    tokens while it runs (before, the whole encode was one pause of every slot)."""
    import time
    from conftest import NGL
    w = h = 640 if NGL == "0" else 1600  # a GPU encodes ~50x faster: a larger image keeps it measurable
    rows = b"".join(b"\0" + bytes((x * 7 + y * 13) % 256 for x in range(w * 3)) for y in range(h))
    big = data_url(png(w, h, rows))
    with KilnServer(kiln_bin, FIX / "model.gguf", ["-c", "8192", "-np", "2", "--mmproj", FIX / "mmproj.gguf",
                                                   "--chat-template-file", tmpl, "--image-max-tokens", "4096"]) as s:
        times, stop = [], threading.Event()

        def stream():
            r = requests.post(s.url + "/completion", json={"prompt": "Once upon a time", "n_predict": 1900,
                                                           "ignore_eos": True, "stream": True}, stream=True)
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    times.append(time.time())
                if stop.is_set():
                    break
            r.close()

        t = threading.Thread(target=stream)
        t.start()
        while len(times) < 5 and t.is_alive():
            time.sleep(0.01)
        t0 = time.time()
        r = chat(s.url, big, max_tokens=1)
        t1 = time.time()
        stop.set()
        t.join(timeout=60)
        log = s.log_text()
    assert r.status_code == 200, r.text
    enc = [float(x.split("encoded in ")[1].split(" ms")[0]) for x in log.splitlines() if "encoded in" in x]
    assert enc and enc[0] > 50, (enc, "the image must take long enough to encode for the check to mean anything")
    inside = [x for x in times if t0 <= x <= t1]
    assert inside and inside[-1] > t0 + 0.8 * (t1 - t0), "the text stream stopped while the image was encoded"
    gaps = [b - a for a, b in zip([t0] + inside, inside)]
    assert max(gaps) * 1000 < 0.5 * enc[0], (max(gaps), enc[0])


def test_generated_projector(kiln_bin, tmpl, tmp_path):
    """A projector written by `kiln gguf gen --mmproj` with Qwen3.5-9B's tower widths (2 of its 27 blocks,
    output width 256) beside a generated tiny-qwen35 text model (n_embd 256): kiln serves an image
    with it, the image's 6 tokens (96x64 px) counted in the prompt."""
    import subprocess
    text, proj = tmp_path / "text.gguf", tmp_path / "mmproj.gguf"
    for args in (["--preset", "tiny-qwen35", "-o", text],
                 ["--mmproj", "--preset", "qwen35-9b", "--n-layer", "2", "--n-out", "256", "-o", proj]):
        r = subprocess.run([str(kiln_bin), "gguf", "gen", "-q", *map(str, args)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
    with KilnServer(kiln_bin, text, ["-c", "512", "--mmproj", proj, "--chat-template-file", tmpl,
                                     "--image-min-tokens", "4"]) as s:
        r = chat(s.url, data_url((FIX / "img0.png").read_bytes()), max_tokens=2)
        assert r.status_code == 200, r.text
        t = requests.post(s.url + "/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}]}],
                                "max_tokens": 1}).json()
        assert r.json()["usage"]["prompt_tokens"] - t["usage"]["prompt_tokens"] >= 6 + 2, (r.json()["usage"], t)
        p = requests.get(s.url + "/props", timeout=10).json()
        assert p["modalities"]["vision"] is True
