#!/usr/bin/env bash
# Run 81's soak (started detached by run.sh, so it outlives the first call): kiln serve -ngl all -np 32
# --cache-ram 512 on the 9B-shape IQ4_XS, 32 streaming clients, 45 s warm-up + 10 minutes sampled every 15 s;
# the prefix cache's bytes and the recorded step graphs sampled beside it. Writes /tmp/o81/done at the end.
REPO=${REPO:-$PWD}  # the repository root (soak.py imports bench/serve_load.py); call 2 started it so
P=/tmp/p; O=/tmp/o81; B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
KILN_LOG_LEVEL=debug $B/kiln serve -m $P/m/9b.gguf -ngl all -np 32 -c 32768 --cache-ram 512 --port 8093 > $O/server.log 2>&1 &
KS=$!
for i in $(seq 240); do curl -sf localhost:8093/health > /dev/null && break; sleep 0.5; done
( while kill -0 $KS 2>/dev/null; do
    echo "$(date +%s) $(curl -s localhost:8093/metrics | grep -E '^kiln:prefix_cache_(bytes|entries|states) ' | awk '{printf "%s=%s ", $1, $2}') graphs=$(grep -c 'step graph recorded' $O/server.log)"
    sleep 30
  done > $O/metrics.txt ) &
python3 $REPO/bench/soak.py --url http://127.0.0.1:8093 --pid $KS --clients 32 --minutes 10 --warmup 45 --max-tokens 128 --every 15 \
  --json $O/soak.json > $O/soak.txt 2>&1
echo "soak rc=$?" >> $O/soak.txt
kill $KS; wait $KS 2>/dev/null
echo "finished requests $(grep -c 'finish:' $O/server.log)" >> $O/soak.txt
grep -E " E |error" $O/server.log | head -5 >> $O/soak.txt
grep 'step graph recorded' $O/server.log | tail -3 >> $O/soak.txt
touch $O/done
