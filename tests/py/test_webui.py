"""Web UI browser tests: headless Debian chromium (/usr/bin/chromium) driven by Playwright against
a real `kiln serve` on a generated tiny-qwen35 model (random weights; its chat template has Qwen's
block; the server uses the real Qwen3.5 template from shared/data, whose generation prompt opens
`<think>`, so replies stream into the "thinking" section unless thinking is switched off).

Oracles: the server's own answers read independently here (GET /props, GET /slots, the raw SSE
body of each chat request parsed in Python) and the browser's DOM. Screenshots go to
build/test-artifacts/ (webui.png, webui-phone.png).
"""
import json
import os
import pathlib
import subprocess
import time
import urllib.error
import urllib.request

import base64

import pytest
import requests
from playwright.sync_api import expect, sync_playwright
from server_harness import KilnServer, gen_model
from test_server_vision import FIX as VISION, TEMPLATE as VISION_TEMPLATE, data_url, png

CHROMIUM = "/usr/bin/chromium"
ALIAS = "tiny-webui"
N_CTX = 8192
# ignore_eos keeps the random model talking (EOG is 1 of 1024 tokens); seed makes it repeatable.
EXTRA = '{"ignore_eos": true, "seed": 7}'
# The page's renderer applied to a text, serialised the way the DOM serialises it (innerHTML writes
# a text node's quote as ", the renderer's string has &quot;).
RENDERED = "(c) => { const d = document.createElement('div'); d.innerHTML = window.kiln.renderMarkdown(c); return d.innerHTML; }"


# -------------------------------------------------------------------------------------------------
# Server


def http(url, key=None, timeout=10):
    """(status, content-type, body bytes) of a GET."""
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


class Server(KilnServer):
    """`kiln serve` with the UI tests' context size and alias; url ends in '/'; ready once GET
    `ready_path` answers 200 ("": the page, which does not wait for the model)."""

    def __init__(self, kiln_bin, model, extra_args=(), ready_path="health"):
        super().__init__(kiln_bin, model, ["-c", N_CTX, "--alias", ALIAS, *extra_args], wait=False)
        self.wait_ready(timeout=60, path="/" + ready_path)
        self.url += "/"

    def json(self, path, key=None):
        status, _, body = http(self.url + path, key)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)

    def post(self, path, obj):
        req = urllib.request.Request(self.url + path, data=json.dumps(obj).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())


@pytest.fixture(scope="module")
def model(kiln_bin, work_dir):
    return gen_model(kiln_bin, work_dir, "tiny-qwen35")


@pytest.fixture(scope="module")
def template(shared_data):
    return shared_data / "chat-templates" / "Qwen3.5-4B.jinja"


@pytest.fixture(scope="module")
def server(kiln_bin, model, template):
    s = Server(kiln_bin, model, ["--chat-template-file", str(template)])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def artifacts(build_dir) -> pathlib.Path:
    d = build_dir / "test-artifacts"
    d.mkdir(parents=True, exist_ok=True)
    return d


# -------------------------------------------------------------------------------------------------
# Browser


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup.sh installs the Debian package chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


class PageWatch:
    """Every request the page makes and every script error it raises."""

    def __init__(self, page):
        self.requests, self.errors = [], []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("pageerror", lambda e: self.errors.append(str(e)))


def new_page(browser, **ctx_args):
    ctx = browser.new_context(**ctx_args)
    ctx.add_init_script(TEE_FETCH)
    page = ctx.new_page()
    page.set_default_timeout(20000)
    return ctx, page, PageWatch(page)


def sse_result(body: str):
    """Content, reasoning and final timings of a streamed chat completion (parsed here, not by the UI)."""
    content, reasoning, timings, finish = "", "", None, None
    for block in body.split("\n\n"):
        data = "\n".join(l[5:].lstrip(" ") for l in block.split("\n") if l.startswith("data:"))
        if not data or data == "[DONE]":
            continue
        ev = json.loads(data)
        assert "error" not in ev, ev
        for ch in ev.get("choices", []):
            d = ch.get("delta") or {}
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            finish = ch.get("finish_reason") or finish
        if ev.get("timings"):
            timings = ev["timings"]
    return content, reasoning, timings, finish


def set_settings(page, *, max_tokens=None, thinking=None, extra=None, key=None):
    page.click("#open-settings")
    expect(page.locator("#settings")).to_be_visible()
    if max_tokens is not None:
        page.fill("#s-max-tokens", str(max_tokens))
    if thinking is not None:
        page.locator("#s-thinking").set_checked(thinking)
    if extra is not None:
        page.fill("#s-extra", extra)
    if key is not None:
        page.fill("#s-api-key", key)
    page.click("#s-save")
    expect(page.locator("#settings")).to_be_hidden()


def last_assistant(page):
    return page.locator(".msg.assistant").last


def wait_idle(page):
    expect(page.locator("#send")).to_be_visible()
    expect(page.locator("#stop")).to_be_hidden()


# Keeps a byte-exact copy of every chat response the page reads (Response.clone()), so the test
# parses what the server sent rather than what the UI made of it. (Playwright's Response.body()
# goes through Chrome's text decoding, which guesses a charset for text/event-stream.)
TEE_FETCH = """
(() => {
  const orig = window.fetch;
  window.__kilnResponses = [];
  window.fetch = async (...args) => {
    const r = await orig(...args);
    if (String(args[0]).includes('chat/completions')) {
      const slot = { status: r.status, done: false, bytes: null, error: null };
      window.__kilnResponses.push(slot);
      r.clone().arrayBuffer().then(
        (b) => { slot.bytes = Array.from(new Uint8Array(b)); slot.done = true; },
        (e) => { slot.error = String(e); slot.done = true; });
    }
    return r;
  };
})();
"""


def send_and_capture(page, action):
    """Runs `action` (which starts a chat request) and returns the parsed SSE body the server sent."""
    n = page.evaluate("window.__kilnResponses.length")
    action()
    page.wait_for_function("(n) => window.__kilnResponses.length > n && window.__kilnResponses[n].done",
                           arg=n, timeout=60000)
    slot = page.evaluate("(n) => window.__kilnResponses[n]", n)
    assert slot["status"] == 200 and slot["error"] is None, {k: slot[k] for k in ("status", "error")}
    wait_idle(page)
    return sse_result(bytes(slot["bytes"]).decode("utf-8"))


# -------------------------------------------------------------------------------------------------
# Tests


def test_page_is_embedded_and_public(kiln_bin, model, work_dir):
    """GET / serves the embedded page without a key even when the API needs one; the API does not."""
    s = Server(kiln_bin, model, ["--api-key", "sekrit"])
    try:
        status, ctype, body = http(s.url)
        assert status == 200 and ctype.lower().startswith("text/html"), (status, ctype, body[:200])
        page = body.decode("utf-8")
        assert "<title>kiln</title>" in page
        # The Debian libraries were inlined at build time (scripts/setup.sh installs them).
        assert "markdown-it" in page and "hljs" in page and "katex" in page
        assert http(s.url + "index.html")[0] == 200
        assert http(s.url + "props")[0] == 401
        assert http(s.url + "props", key="sekrit")[0] == 200
    finally:
        s.stop()


def test_markdown_is_rendered_and_sanitized(browser, server):
    ctx, page, watch = new_page(browser)
    try:
        page.goto(server.url)
        assert page.evaluate("window.kiln.libraries") == {"markdown": True, "highlight": True, "math": True}
        hostile = ("# Title\n\n<img src=x onerror=\"window.pwned=1\"> <script>window.pwned=2</script> **bold**\n\n"
                   "[click](javascript:window.pwned=3) ![pic](http://example.invalid/x.png) [ok](https://example.org)\n\n"
                   "```python\ndef f(x):\n    return x\n```\n\n"
                   "Math $x^2$ and $$\\frac{a}{b}$$ and \\(y\\); prices $5 and $6 stay text.\n\n"
                   "<iframe src=\"https://example.org\"></iframe>")
        info = page.evaluate(
            """(md) => {
                 const div = document.createElement('div');
                 div.innerHTML = window.kiln.renderMarkdown(md);
                 document.body.append(div);
                 const onAttrs = Array.from(div.querySelectorAll('*')).flatMap(
                     (e) => Array.from(e.attributes).map((a) => a.name)).filter((n) => n.startsWith('on'));
                 const r = {
                   img: div.querySelectorAll('img').length, script: div.querySelectorAll('script').length,
                   iframe: div.querySelectorAll('iframe').length, onAttrs: onAttrs,
                   jsLinks: Array.from(div.querySelectorAll('a')).filter((a) => /^javascript:/i.test(a.getAttribute('href') || '')).length,
                   links: Array.from(div.querySelectorAll('a')).map((a) => [a.getAttribute('href'), a.getAttribute('rel')]),
                   h1: div.querySelector('h1') && div.querySelector('h1').textContent,
                   strong: div.querySelector('strong') && div.querySelector('strong').textContent,
                   keywords: Array.from(div.querySelectorAll('pre.code code .hljs-keyword')).map((e) => e.textContent),
                   codeLang: div.querySelector('pre.code .code-head span').textContent,
                   math: div.querySelectorAll('math').length, msup: div.querySelectorAll('math msup').length,
                   mfrac: div.querySelectorAll('math[display=block] mfrac').length,
                   text: div.textContent, pwned: window.pwned || 0,
                 };
                 div.remove();
                 return r;
               }""", hostile)
        assert info["img"] == 0 and info["script"] == 0 and info["iframe"] == 0, info
        assert info["onAttrs"] == [] and info["jsLinks"] == 0 and info["pwned"] == 0, info
        assert "<img src=x" in info["text"] and "<script>" in info["text"]  # shown as text
        assert info["links"] == [["http://example.invalid/x.png", "noopener noreferrer"],
                                 ["https://example.org", "noopener noreferrer"]], info["links"]
        assert info["h1"] == "Title" and info["strong"] == "bold"
        assert info["codeLang"] == "python" and info["keywords"] == ["def", "return"], info
        assert info["math"] == 3 and info["msup"] == 1 and info["mfrac"] == 1, info
        assert "$5 and $6 stay text" in info["text"]
        assert watch.errors == []
    finally:
        ctx.close()


def test_chat_stream_thinking_stop_edit_reload(browser, server, artifacts):
    props = server.json("props")
    ctx, page, watch = new_page(browser, viewport={"width": 1180, "height": 820})
    try:
        page.goto(server.url)
        # Header: alias and context size from /props; no image button without vision.
        expect(page.locator("#model-name")).to_have_text(props["model_alias"])
        assert props["model_alias"] == ALIAS
        n_ctx = props.get("n_ctx_slot") or props["default_generation_settings"]["n_ctx"]
        expect(page.locator("#model-ctx")).to_have_text(f"ctx {n_ctx:,}")
        assert props["modalities"]["vision"] is False
        expect(page.locator("#attach")).to_be_hidden()

        # 1) Thinking on, a long reply: text streams into the thinking section; Stop cancels it.
        # The random model must not close the block itself: ban the </think> token (id from the
        # server's tokenizer) so the whole reply stays reasoning however late Stop lands.
        think_end = server.post("tokenize", {"content": "</think>"})["tokens"]
        assert len(think_end) == 1 and isinstance(think_end[0], int), think_end
        extra = json.loads(EXTRA)
        extra["logit_bias"] = {str(think_end[0]): -100}
        set_settings(page, max_tokens=N_CTX - 200, thinking=True, extra=json.dumps(extra))
        page.click("#input")
        page.keyboard.type("Tell me")
        page.keyboard.press("Shift+Enter")  # newline, not send
        page.keyboard.type("a story")
        expect(page.locator(".msg")).to_have_count(0)
        page.keyboard.press("Enter")
        expect(page.locator(".msg.user .bubble")).to_have_text("Tell me\na story")
        expect(page.locator("#stop")).to_be_visible()
        body = page.locator(".msg.assistant.streaming details.thinking .thinking-body")
        page.wait_for_function("() => { const e = document.querySelector('.msg.assistant.streaming .thinking-body');"
                               " return e && e.textContent.length > 0; }")
        n1 = len(body.text_content())
        # More text arrives while the reply is still streaming: it is shown as it comes.
        page.wait_for_function("(n) => { const e = document.querySelector('.msg.assistant.streaming .thinking-body');"
                               " return e && e.textContent.length > n; }", arg=n1)
        expect(page.locator("details.thinking summary")).to_have_text("Thinking\u2026")
        page.click("#stop")
        wait_idle(page)
        expect(last_assistant(page).locator(".status")).to_have_text("stopped")
        stopped = last_assistant(page).locator(".thinking-body").text_content()
        assert len(stopped) > n1
        # The server cancelled the request (the fetch abort closed the connection).
        deadline = time.time() + 10
        while any(s["is_processing"] for s in server.json("slots")):
            assert time.time() < deadline, "the server is still generating after Stop"
            time.sleep(0.1)
        page.wait_for_timeout(300)
        assert last_assistant(page).locator(".thinking-body").text_content() == stopped
        # Finished: the thinking section is folded away, separate from the (empty) answer.
        think = last_assistant(page).locator("details.thinking")
        assert think.evaluate("d => d.open") is False
        expect(think.locator("summary")).to_have_text(f"Thinking ({len(stopped):,} characters)")
        assert last_assistant(page).locator(".content").text_content() == ""

        # 2) Thinking off, a short reply: the answer is the streamed content, with timings.
        set_settings(page, max_tokens=24, thinking=False)
        page.fill("#input", "Second question")
        content, reasoning, t, finish = send_and_capture(page, lambda: page.keyboard.press("Enter"))
        assert reasoning == "" and content and t is not None and finish == "length"
        a = last_assistant(page)
        expect(a.locator("details.thinking")).to_have_count(0)
        rendered = page.evaluate(RENDERED, content)
        assert a.locator(".content").inner_html() == rendered
        expect(a.locator(".timings")).to_contain_text(f"prompt {t['prompt_n']} tok")
        expect(a.locator(".timings")).to_contain_text(f"gen {t['predicted_n']} tok")
        assert t["predicted_n"] == 24
        expect(a.locator(".status")).to_have_text("cut at max tokens")

        # 3) Regenerate: the same prompt again, so the prefix cache answers most of it.
        content2, _, t2, _ = send_and_capture(page, lambda: a.locator("button.regenerate").click())
        assert t2["cache_n"] > 0, t2
        expect(page.locator(".msg")).to_have_count(4)
        expect(last_assistant(page).locator(".timings")).to_contain_text(f"cache hit {t2['cache_n']} tok")
        assert last_assistant(page).locator(".content").inner_html() == page.evaluate(
            "(c) => window.kiln.renderMarkdown(c)", content2)

        # 4) Edit the last user message: the turn is replaced and answered again.
        page.locator(".msg.user").last.locator("button.edit").click()
        page.fill(".edit-box textarea", "Edited question")
        content3, _, _, _ = send_and_capture(page, lambda: page.click(".edit-box .save-edit"))
        expect(page.locator(".msg")).to_have_count(4)
        expect(page.locator(".msg.user .bubble").last).to_have_text("Edited question")
        assert last_assistant(page).locator(".content").inner_html() == page.evaluate(
            "(c) => window.kiln.renderMarkdown(c)", content3)
        page.screenshot(path=str(artifacts / "webui.png"))

        # 5) Reload: the conversation is kept in localStorage and shown again.
        page.reload()
        expect(page.locator("#model-name")).to_have_text(ALIAS)
        titles = page.locator("#conv-list .conv-title")
        expect(titles).to_have_count(1)
        expect(titles.first).to_have_text("Tell me a story")
        page.click("#new-chat")
        expect(page.locator(".msg")).to_have_count(0)
        expect(page.locator("#empty")).to_be_visible()
        titles.first.click()
        expect(page.locator(".msg")).to_have_count(4)
        expect(page.locator(".msg.user .bubble").first).to_have_text("Tell me\na story")
        expect(page.locator(".msg.assistant .status").first).to_have_text("stopped")
        expect(page.locator(".msg.assistant").first.locator(".thinking-body")).to_have_text(stopped)

        # 6) Rename (kept across a reload) and delete.
        page.once("dialog", lambda d: d.accept("Renamed chat"))
        page.locator("#conv-list li.active button.rename").click()
        expect(titles.first).to_have_text("Renamed chat")
        page.reload()
        expect(page.locator("#conv-list .conv-title")).to_have_text(["Renamed chat"])
        page.once("dialog", lambda d: d.accept())
        page.locator("#conv-list li.active button.delete").click()
        expect(page.locator("#conv-list li")).to_have_count(0)
        expect(page.locator(".msg")).to_have_count(0)
        assert page.evaluate("JSON.parse(localStorage.getItem('kiln.conversations'))") == []

        # Everything came from the server: no request left it (nothing fetched at run time).
        outside = [u for u in watch.requests if not (u.startswith(server.url) or u.startswith("data:"))]
        assert outside == []
        assert watch.errors == []
    finally:
        ctx.close()


def test_thinking_then_answer(browser, server, kiln_bin, model):
    """A reply that thinks and then answers: the random model closes </think> itself, nudged by a
    logit bias of +5 on that token (about 2% a step, so it thinks for a while first, whatever the
    exact logits): the thinking section holds exactly the streamed reasoning_content, folded once the
    answer came; the answer holds the content, rendered."""
    r = subprocess.run([str(kiln_bin), "tokenize", "-m", str(model), "-p", "</think>", "--add-bos", "off"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (close_id,) = r.stdout.split()
    extra = json.dumps({"ignore_eos": True, "seed": 7, "logit_bias": {close_id: 5}})
    ctx, page, watch = new_page(browser)
    try:
        page.goto(server.url)
        expect(page.locator("#model-name")).to_have_text(ALIAS)
        set_settings(page, max_tokens=900, thinking=True, extra=extra)
        page.fill("#input", "Tell me\na story")
        content, reasoning, t, _ = send_and_capture(page, lambda: page.keyboard.press("Enter"))
        assert reasoning and content, (len(reasoning), len(content))
        a = last_assistant(page)
        think = a.locator("details.thinking")
        assert think.evaluate("d => d.open") is False
        assert a.locator(".thinking-body").text_content() == reasoning
        assert a.locator(".content").inner_html() == page.evaluate(RENDERED, content)
        think.locator("summary").click()
        expect(a.locator(".thinking-body")).to_be_visible()
        assert watch.errors == []
    finally:
        ctx.close()


def test_api_key_prompt(browser, kiln_bin, model, work_dir):
    s = Server(kiln_bin, model, ["--api-key", "sekrit"])
    ctx, page, watch = new_page(browser)
    try:
        page.goto(s.url)
        # /props answers 401: the settings dialog asks for the key.
        expect(page.locator("#settings")).to_be_visible()
        expect(page.locator("#settings-note")).to_contain_text("API key")
        expect(page.locator("#model-name")).to_have_text("API key needed")
        page.fill("#s-api-key", "wrong")
        page.click("#s-save")
        expect(page.locator("#settings")).to_be_visible()  # asked again
        page.fill("#s-api-key", "sekrit")
        page.fill("#s-max-tokens", "4")
        page.click("#s-save")
        expect(page.locator("#settings")).to_be_hidden()
        expect(page.locator("#model-name")).to_have_text(ALIAS)
        page.fill("#input", "hello")
        content, reasoning, t, _ = send_and_capture(page, lambda: page.click("#send"))
        assert t["predicted_n"] <= 4
        assert not last_assistant(page).locator(".status").text_content().startswith("error")
        assert "sekrit" in page.evaluate("localStorage.getItem('kiln.settings')")
        assert watch.errors == []
    finally:
        ctx.close()
        s.stop()


def test_waits_for_model_load(browser, kiln_bin, model, work_dir):
    # Listening at once (the page is public), but /health and /props answer 503 for 4 s more.
    s = Server(kiln_bin, model, ["--test-load-delay-ms", "4000"], ready_path="")
    ctx, page, watch = new_page(browser)
    try:
        assert http(s.url + "props")[0] == 503
        page.goto(s.url)
        expect(page.locator("#model-name")).to_have_text("loading the model\u2026")
        expect(page.locator("#model-name")).to_have_text(ALIAS, timeout=20000)
        assert http(s.url + "props")[0] == 200
        assert watch.errors == []
    finally:
        ctx.close()
        s.stop()


# Dispatches a paste (into the target) or a dragover + drop (onto it) carrying one file.
FILE_EVENT = """({ target, kind, b64, name, mime }) => {
  const bin = atob(b64), u = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
  const dt = new DataTransfer();
  dt.items.add(new File([u], name, { type: mime }));
  const el = document.querySelector(target);
  if (kind === 'paste') {
    const ev = new ClipboardEvent('paste', { clipboardData: dt, bubbles: true, cancelable: true });
    el.dispatchEvent(ev);
    return { prevented: ev.defaultPrevented };
  }
  const over = new DragEvent('dragover', { dataTransfer: dt, bubbles: true, cancelable: true });
  el.dispatchEvent(over);
  const highlighted = document.getElementById('composer').classList.contains('dropping');
  const drop = new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true });
  el.dispatchEvent(drop);
  return { prevented: over.defaultPrevented && drop.defaultPrevented, highlighted,
           after: document.getElementById('composer').classList.contains('dropping') };
}"""


def test_images_attach_paste_drop(browser, kiln_bin, work_dir):
    """Issue #17's web UI part, against kiln serve with the tiny Qwen3.5-VL fixture and its projector:
    an image from the file chooser, one pasted into the input and one dropped on the page become
    thumbnails (one removed again, a dropped text file ignored); the request carries the remaining two
    as image_url parts, byte for byte (Playwright's view of the request); the server counts their
    tokens (the same request without them has fewer prompt tokens, asked here directly); the
    conversation keeps them across a reload."""
    tmpl = pathlib.Path(work_dir) / "webui-vision.jinja"
    tmpl.write_text(VISION_TEMPLATE)
    s = KilnServer(kiln_bin, VISION / "model.gguf", ["-c", "512", "--alias", ALIAS, "--mmproj", VISION / "mmproj.gguf",
                                                     "--chat-template-file", tmpl, "--image-min-tokens", "4"])
    imgs = [(VISION / "img0.png").read_bytes(), png(16, 16, bytes(range(256)) * 3 + b"\0" * 16 * 1),
            png(24, 12, (b"\0" + b"\x80\x10\xf0" * 24) * 12)]
    ctx, page, watch = new_page(browser)
    try:
        page.goto(s.url + "/")
        expect(page.locator("#model-name")).to_have_text(ALIAS)
        expect(page.locator("#attach")).to_be_visible()
        set_settings(page, max_tokens=4, extra=EXTRA)
        thumbs = page.locator("#attachments img")
        page.set_input_files("#file-input", files=[{"name": "a.png", "mimeType": "image/png", "buffer": imgs[0]}])
        expect(thumbs).to_have_count(1)
        ev = page.evaluate(FILE_EVENT, {"target": "#input", "kind": "paste", "b64": base64.b64encode(imgs[1]).decode(),
                                        "name": "b.png", "mime": "image/png"})
        assert ev["prevented"], ev
        expect(thumbs).to_have_count(2)
        ev = page.evaluate(FILE_EVENT, {"target": "#messages", "kind": "drop", "b64": base64.b64encode(imgs[2]).decode(),
                                        "name": "c.png", "mime": "image/png"})
        assert ev == {"prevented": True, "highlighted": True, "after": False}, ev
        expect(thumbs).to_have_count(3)
        page.evaluate(FILE_EVENT, {"target": "#messages", "kind": "drop", "b64": base64.b64encode(b"notes").decode(),
                                   "name": "n.txt", "mime": "text/plain"})
        page.wait_for_timeout(300)
        expect(thumbs).to_have_count(3)  # not an image: ignored (and the page stayed)
        page.locator("#attachments .thumb").nth(1).locator("button").click()
        expect(thumbs).to_have_count(2)
        page.fill("#input", "what is in these pictures?")
        with page.expect_request(lambda r: "chat/completions" in r.url) as req:
            content, reasoning, t, _ = send_and_capture(page, lambda: page.click("#send"))
        body = req.value.post_data_json
        parts = body["messages"][-1]["content"]
        assert [p["image_url"]["url"] for p in parts if p["type"] == "image_url"] == [data_url(imgs[0]), data_url(imgs[2])]
        assert t["predicted_n"] <= 4
        expect(thumbs).to_have_count(0)
        expect(page.locator(".msg.user").last.locator("img")).to_have_count(2)
        # The server took both images: without them the same request has fewer prompt tokens.
        ask = lambda msgs: requests.post(s.url + "/v1/chat/completions", json={**body, "messages": msgs, "stream": False,
                                                                               "max_tokens": 1}, timeout=60).json()
        with_images = ask(body["messages"])["usage"]["prompt_tokens"]
        text_only = ask(body["messages"][:-1] + [{"role": "user", "content": "what is in these pictures?"}])
        assert with_images >= text_only["usage"]["prompt_tokens"] + 2 * 4, (with_images, text_only["usage"])
        page.reload()
        expect(page.locator(".msg.user").last.locator("img")).to_have_count(2)
        assert watch.errors == []
    finally:
        ctx.close()
        s.stop()


def test_large_image_is_scaled_down(browser, kiln_bin, work_dir):
    """An image above the most pixels the server gives the model (/props image_max_pixels =
    --image-max-tokens x (patch x merge)^2, read here from the projector's own metadata) is scaled down
    in the page before it is sent, aspect kept; a small one goes as it is."""
    import gguf
    meta = gguf.GGUFReader(str(VISION / "mmproj.gguf")).fields
    tok_px = int(meta["clip.vision.patch_size"].parts[-1][0]) * int(meta["clip.vision.spatial_merge_size"].parts[-1][0])
    tmpl = pathlib.Path(work_dir) / "webui-vision.jinja"
    tmpl.write_text(VISION_TEMPLATE)
    s = KilnServer(kiln_bin, VISION / "model.gguf", ["-c", "512", "--alias", ALIAS, "--mmproj", VISION / "mmproj.gguf",
                                                     "--chat-template-file", tmpl, "--image-max-tokens", "64"])
    max_px = 64 * tok_px * tok_px
    big = png(600, 400, (b"\0" + b"\x20\x90\xe0" * 600) * 400)  # 240000 pixels > 64 x 32^2 = 65536
    small = png(40, 30)
    ctx, page, watch = new_page(browser)
    try:
        assert requests.get(s.url + "/props", timeout=10).json()["image_max_pixels"] == max_px
        page.goto(s.url + "/")
        expect(page.locator("#attach")).to_be_visible()
        set_settings(page, max_tokens=2, extra=EXTRA)
        page.set_input_files("#file-input", files=[{"name": "big.png", "mimeType": "image/png", "buffer": big},
                                                  {"name": "small.png", "mimeType": "image/png", "buffer": small}])
        expect(page.locator("#attachments img")).to_have_count(2)
        page.fill("#input", "look")
        with page.expect_request(lambda r: "chat/completions" in r.url) as req:
            send_and_capture(page, lambda: page.click("#send"))
        urls = [p["image_url"]["url"] for p in req.value.post_data_json["messages"][-1]["content"]
                if p["type"] == "image_url"]
        assert len(urls) == 2 and urls[1] == data_url(small)  # in the order given; the small one untouched
        head = base64.b64decode(urls[0].split(",", 1)[1])
        assert urls[0].startswith("data:image/png;base64,") and head[12:16] == b"IHDR"
        w, h = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        assert w * h <= max_px and w * h > 0.95 * max_px and abs(w / h - 1.5) < 0.02, (w, h)
        assert watch.errors == []
    finally:
        ctx.close()
        s.stop()


def test_phone_layout(browser, server, artifacts):
    ctx, page, watch = new_page(browser, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                                device_scale_factor=2)
    try:
        page.goto(server.url)
        expect(page.locator("#model-name")).to_have_text(ALIAS)
        side = page.locator("#sidebar")
        # The conversation list is off-screen until the menu button opens it.
        assert side.bounding_box()["x"] + side.bounding_box()["width"] <= 0
        expect(page.locator("#open-side")).to_be_visible()
        page.click("#open-side")
        page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().x >= 0")
        page.screenshot(path=str(artifacts / "webui-phone-menu.png"))
        page.mouse.click(380, 400)  # the backdrop
        page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().right <= 0")
        # Nothing wider than the screen; the composer fits.
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
        for sel in ("#input", "#send"):
            box = page.locator(sel).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (sel, box)
        page.screenshot(path=str(artifacts / "webui-phone.png"))
        assert watch.errors == []
    finally:
        ctx.close()
