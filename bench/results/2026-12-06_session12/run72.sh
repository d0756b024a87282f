#!/usr/bin/env bash
# Device run 72 (session 12): soak — 32 concurrent streaming clients for 5 minutes against kiln serve -ngl all
# (9B-shape IQ4_XS with the real tokenizer, -np 32, --cache-ram 512 so the prefix cache reaches its bound early):
# errors, tokens/s over time, the server's RSS and the GPU's used memory (bench/soak.py).
S=$(date +%s); P=/tmp/p; O=/tmp/o72; mkdir -p $O $P/m
if [ ! -x $P/.gpu/bin/kiln ]; then tar xJf .gpu-run/r71/bins.tar.xz -C $P; fi
[ -f $P/vocab.gguf ] || xz -dc .gpu-run/r71/vocab-qwen35.gguf.xz > $P/vocab.gguf
B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
[ -f $P/m/9b-mtp.gguf ] || $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/9b-mtp.gguf
$B/kiln serve -m $P/m/9b-mtp.gguf -ngl all -np 32 -c 32768 --cache-ram 512 --port 8093 > $O/server.log 2>&1 &
KS=$!
python3 bench/soak.py --url http://127.0.0.1:8093 --pid $KS --clients 32 --minutes ${SOAK_MIN:-5} --max-tokens 128 --every 15 \
  --json $O/soak.json > $O/soak.txt 2>&1
echo "soak rc=$?" >> $O/soak.txt
kill $KS; wait $KS 2>/dev/null
grep -c "finish:" $O/server.log >> $O/soak.txt
grep -E " E |error" $O/server.log | head -5 >> $O/soak.txt
echo "total $(( $(date +%s) - S )) s" >> $O/soak.txt
xz -T4 $O/server.log; cp -r $O $OUT/
tail -30 $O/soak.txt
