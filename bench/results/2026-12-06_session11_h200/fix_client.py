# Device helper: greedy /completion of KJV prompts on the trained MTP fixture; prints the texts' hash,
# drafted / accepted. usage: fix_client.py PORT LOG -- server command...
import hashlib, json, subprocess, sys, time, urllib.request
port, logp = int(sys.argv[1]), sys.argv[2]
cmd = sys.argv[sys.argv.index("--") + 1:]
p = subprocess.Popen(cmd, stdout=open(logp, "w"), stderr=subprocess.STDOUT)
t0 = time.time()
while True:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            if r.status == 200: break
    except Exception: pass
    if p.poll() is not None or time.time() - t0 > 40: print("server not ready"); p.kill(); sys.exit(1)
    time.sleep(0.05)
P = ["In the beginning God created the heaven and the earth.\nAnd the earth was", "And God said, Let there be light:",
     "The LORD is my shepherd; I shall not", "And the LORD spake unto Moses, saying,",
     "For God so loved the world, that he gave", "Blessed are the poor in spirit: for theirs is",
     "And it came to pass, when the king heard", "Praise ye the LORD. O give thanks unto the LORD; for he is good:"]
texts, dn, da = [], 0, 0
for pr in P:
    body = json.dumps({"prompt": pr, "n_predict": 64, "temperature": 0, "cache_prompt": False, "ignore_eos": True}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"}), timeout=60) as r:
        js = json.load(r)
    texts.append(js["content"]); t = js.get("timings", {})
    dn += t.get("draft_n", 0) or 0; da += t.get("draft_n_accepted", 0) or 0
p.terminate(); p.wait()
h = hashlib.sha1("\x00".join(texts).encode()).hexdigest()[:12]
print(f"texts {h}  drafted {dn} accepted {da} ({100.0 * da / max(dn, 1):.1f} %)  first: {texts[0][:60]!r}")
