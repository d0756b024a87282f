#!/usr/bin/env bash
# Device run 104 (session 21): host-tier states on transparent huge pages, not zeroed first; kiln serve vs llama-server -np 32.
S=$(date +%s); P=/tmp/p; O=/tmp/o104; I=.gpu-run/fid; R=.gpu-run/r104; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
tar xJf $R/bins.tar.xz -C $P/K; K=$P/K/.gpu/bin
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
( cat $I/llama-*.part-0* | xz -d | tar x -C $P ) > $O/llama-unpack.log 2>&1 &
LLU=$!
( LD_LIBRARY_PATH=$K $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 12 -o $P/m/9b.gguf > $O/gen.log 2>&1 ) &
GEN=$!
export LD_LIBRARY_PATH=$K
fin() { cp $O/t.txt $OUT/; }
wait $GEN; echo "file ready $(el) s" >> $O/t.txt
up() { for i in $(seq 1 120); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null && return 0; sleep 0.5; done; return 1; }
serve() {  # name port clients cmd...
  local n=$1 p=$2 c=$3; shift 3; KILN_LOG_LEVEL=debug "$@" --host 127.0.0.1 --port $p > $O/server-$n.log 2>&1 & local pid=$!
  if up $p; then
    timeout 200 python3 bench/serve_load.py --url http://127.0.0.1:$p --clients $c --requests 2 --max-tokens 128 --kind shared,unique --timeout 60 --json $O/load-$n.json > $O/load-$n.md 2>&1
    echo "$n load rc=$? $(el) s" >> $O/t.txt; grep -E '^\| http' $O/load-$n.md | cut -d'|' -f3-11 >> $O/t.txt
  else echo "$n did not come up" >> $O/t.txt; tail -5 $O/server-$n.log >> $O/t.txt; fi
  kill $pid; sleep 1; kill -9 $pid 2>/dev/null
  python3 - $O/server-$n.log >> $O/t.txt <<'PY'
import re, sys
rows = [tuple(float(x) for x in m.groups()) for m in re.finditer(r"step: (\d+) tokens \((\d+) decode, (\d+) prompt\), admit ([\d.]+) ms, forward ([\d.]+) ms, step ([\d.]+) ms", open(sys.argv[1]).read())]
if rows:
    tot = sum(r[3] + r[5] for r in rows); adm = sum(r[3] for r in rows); fwd = sum(r[4] for r in rows); post = sum(r[5] - r[4] for r in rows)
    print(f"  steps {len(rows)}: total {tot:.0f} ms = admit {adm:.0f} + forward {fwd:.0f} + post {post:.0f}")
    for r in sorted(rows, key=lambda r: -(r[3] + r[5]))[:4]:
        print(f"  slow: {int(r[0])} tok ({int(r[1])} dec), admit {r[3]:.1f}, fwd {r[4]:.1f}, step {r[5]:.1f}")
PY
  fin
}
M="-m $P/m/9b.gguf -ngl all -fa on -c 65536 -np 32"
serve kiln 8090 1,8,32 $K/kiln serve $M
wait $LLU; LL=$P/llama-cuda-sm90a
LD_LIBRARY_PATH=$LL serve llama 8091 1,8,32 $LL/llama-server -m $P/m/9b.gguf -ngl 99 -fa on -c 65536 -np 32
tar cf - -C $O . | xz -T8 > $OUT/run104.tar.xz; fin
cat $O/t.txt; echo "total $(el) s"
