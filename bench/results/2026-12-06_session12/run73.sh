#!/usr/bin/env bash
# Device run 73 (session 12): (1) device memory of recorded step graphs: kiln bench -p 1..40 (one new graph
# per size), nvidia-smi every 50 ms; (2) soak after the step-graph cache bound (48, least recently used
# dropped): 32 streaming clients, 40 s unmeasured warm-up (prefix cache to its 512 MiB bound), then 2 minutes.
S=$(date +%s); P=/tmp/p; O=/tmp/o73; mkdir -p $O $P/m; I=.gpu-run/r73
tar xJf $I/bins.tar.xz -C $P && xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/9b.gguf
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 > $O/mem-graphs.csv & MP=$!
timeout 120 $B/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p $(seq -s, 1 40) -n 0 -r 1 --progress > $O/graphs.md 2> $O/graphs.err
kill $MP
python3 - $O/mem-graphs.csv <<'PY' | tee $O/graphs.txt
import sys
v = [int(x) for x in open(sys.argv[1]).read().split() if x.strip().isdigit()]
nz = [x for x in v if x > 0]
print(f"samples {len(v)}; first non-zero {nz[0] if nz else 0} MiB, max {max(v) if v else 0} MiB; levels:", sorted(set(nz))[:8], "...", sorted(set(nz))[-8:])
PY
$B/kiln serve -m $P/m/9b.gguf -ngl all -np 32 -c 32768 --cache-ram 512 --port 8093 > $O/server.log 2>&1 &
KS=$!
python3 bench/soak.py --url http://127.0.0.1:8093 --pid $KS --clients 32 --minutes 2 --warmup 40 --max-tokens 128 --every 10 \
  --json $O/soak.json > $O/soak.txt 2>&1
echo "soak rc=$?" >> $O/soak.txt
kill $KS; wait $KS 2>/dev/null
echo "total $(( $(date +%s) - S )) s" >> $O/soak.txt
xz -T4 $O/server.log; cp -r $O $OUT/
tail -16 $O/soak.txt
