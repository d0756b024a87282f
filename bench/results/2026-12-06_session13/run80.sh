#!/usr/bin/env bash
# Device run 80 (session 13): soak on the final code — 32 concurrent streaming clients, 45 s of warm-up then
# 7.5 minutes sampled, against kiln serve -ngl all -np 32 --cache-ram 512 (9B-shape IQ4_XS, real tokenizer):
# errors, tokens/s over time, the server's RSS and the GPU's used memory (bench/soak.py). Logs straight to $OUT.
S=$(date +%s); P=/tmp/p; O=$OUT; mkdir -p $P/m; I=.gpu-run/r80
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $O/gpu.txt
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --vocab $P/vocab.gguf --fast -q -t 12 -o $P/m/9b.gguf
$B/kiln serve -m $P/m/9b.gguf -ngl all -np 32 -c 32768 --cache-ram 512 --port 8093 > /tmp/server.log 2>&1 &
KS=$!
python3 bench/soak.py --url http://127.0.0.1:8093 --pid $KS --clients 32 --minutes 7.5 --warmup 45 --max-tokens 128 --every 15 \
  --json $O/soak.json > $O/soak.txt 2>&1
echo "soak rc=$?" >> $O/soak.txt
kill $KS; wait $KS 2>/dev/null
grep -c "finish:" /tmp/server.log >> $O/soak.txt
grep -E " E |error" /tmp/server.log | head -5 >> $O/soak.txt
echo "total $(( $(date +%s) - S )) s" >> $O/soak.txt
xz -T4 -c /tmp/server.log > $O/server.log.xz
cat $O/gpu.txt; tail -40 $O/soak.txt
