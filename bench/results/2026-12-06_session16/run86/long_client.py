# One /completion request of N random tokens + 32 generated (argv: port N timeout); prints time and timings.
import json, random, sys, time, urllib.request
port, n, to = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if n <= 0:  # the slot's whole context (as fitted) less 40 positions
    with urllib.request.urlopen(f"http://localhost:{port}/props", timeout=10) as r:
        n = json.loads(r.read())["default_generation_settings"]["n_ctx"] - 40
    print("prompt of", n, "tokens", end=": ")
random.seed(7)
toks = [random.randrange(1000, 150000) for _ in range(n)]
body = json.dumps({"prompt": toks, "n_predict": 32, "temperature": 0, "cache_prompt": False, "ignore_eos": True}).encode()
t = time.time()
try:
    with urllib.request.urlopen(urllib.request.Request(f"http://localhost:{port}/completion", body, {"Content-Type": "application/json"}), timeout=to) as r:
        js = json.loads(r.read())
    print(round(time.time() - t, 2), json.dumps(js.get("timings")))
except Exception as e:
    print(round(time.time() - t, 2), "stopped:", e)
