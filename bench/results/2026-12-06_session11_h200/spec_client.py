# Device helper: start a server, send greedy /completion requests of random token ids, print the
# median decode speed and draft counts. usage: spec_client.py PORT REPS NPRED -- server command...
import json, subprocess, sys, time, urllib.request, random, statistics
port, reps, npred = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cmd = sys.argv[sys.argv.index("--") + 1:]
log = open(f"/tmp/o67/server-{port}-{int(time.time()*1000)%100000}.log", "w")
p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
t0 = time.time()
while True:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            if r.status == 200: break
    except Exception: pass
    if p.poll() is not None: print("server exited", p.returncode); sys.exit(1)
    if time.time() - t0 > 40: print("server not ready"); p.kill(); sys.exit(1)
    time.sleep(0.05)
rng = random.Random(1)
out = []
for i in range(reps + 1):
    prompt = [rng.randrange(1000, 100000) for _ in range(64)]
    body = json.dumps({"prompt": prompt, "n_predict": npred, "ignore_eos": True, "temperature": 0,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        t = json.load(r).get("timings", {})
    if i > 0: out.append(t)
p.terminate(); p.wait()
pps = [t.get("predicted_per_second", 0) for t in out]
dn = sum(t.get("draft_n", 0) or 0 for t in out); da = sum(t.get("draft_n_accepted", 0) or 0 for t in out)
print(f"{statistics.median(pps):9.1f} t/s  drafted {dn:5d} accepted {da:5d}  ({' '.join(f'{x:.0f}' for x in pps)})")
