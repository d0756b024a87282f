# One chat request with a 1024x768 PNG (random pixels) to the kiln server on the given port.
import base64, json, random, struct, sys, time, urllib.request, zlib
def png(w, h):
    random.seed(3)
    raw = b"".join(b"\x00" + bytes(random.randrange(256) for _ in range(3 * w)) for _ in range(h))
    ch = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + ch(b"IDAT", zlib.compress(raw)) + ch(b"IEND", b"")
url = "data:image/png;base64," + base64.b64encode(png(1024, 768)).decode()
body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe."}]}],
        "max_tokens": 16, "temperature": 0}
t = time.time()
req = urllib.request.Request(f"http://localhost:{sys.argv[1]}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=100) as r:
    js = json.loads(r.read())
print(round(time.time() - t, 2), json.dumps(js.get("usage")), json.dumps(js.get("timings")))
