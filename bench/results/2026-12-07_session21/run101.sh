#!/usr/bin/env bash
# Device run 101 (session 21): binaries of the session's commit (delta-chunk auto = 64 on the GPU, -ub auto,
# Q4_K mat-vec at 8 CTAs). Carry .gpu-run/r101 (bins, vocab) and .gpu-run/fid (llama.cpp parts) with
# tests/fixtures, bench/results, src, docs, tests moved aside. (1) GPU tests; (2) kiln bench vs llama-bench on the
# same files in the same run: 9B pp512/2048/8192/32768 + tg128 at -ub 512 and 2048, 27B pp512/2048 + tg128;
# (3) serving: kiln serve (defaults: -ub auto) vs llama-server -np 32, serve_load.py 1/8/32 clients;
# (4) a per-op profile of one 9B decode step if time is left.
S=$(date +%s); P=/tmp/p; O=/tmp/o101; I=.gpu-run/fid; R=.gpu-run/r101; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
tar xJf $R/bins.tar.xz -C $P/K; K=$P/K/.gpu/bin
xz -dc $R/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
( LD_LIBRARY_PATH=$K $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf
  LD_LIBRARY_PATH=$K $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-27b --mix q4_k_m --fast -t 8 -o $P/m/27b.gguf ) > $O/gen.log 2>&1 &
GEN=$!
( cat $I/llama-*.part-0* | xz -d | tar x -C $P ) > $O/llama-unpack.log 2>&1 &
LLU=$!
export LD_LIBRARY_PATH=$K
fin() { cp $O/t.txt $OUT/; }
for t in test_cuda_matmul test_cuda_model test_cuda_seq test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend; do
  s0=$(date +%s); timeout 120 $K/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
done
grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -30 >> $O/t.txt; fin
wait $GEN; wait $LLU; LL=$P/llama-cuda-sm90a; echo "files ready $(el) s" >> $O/t.txt
kb() { timeout $1 $K/kiln bench -m $P/m/$2.gguf -ngl all -fa on "${@:3}" -o jsonl > $O/kiln-$2$SUF.jsonl 2> $O/kiln-$2$SUF.err; }
lb() { LD_LIBRARY_PATH=$LL timeout $1 $LL/llama-bench -m $P/m/$2.gguf -ngl 99 -fa 1 "${@:3}" -o jsonl > $O/llama-$2$SUF.jsonl 2> $O/llama-$2$SUF.err; }
SUF= kb 150 9b -p 512,2048,8192,32768 -n 128 -ub 512,2048 -r 2; echo "kiln 9b rc=$? $(el) s" >> $O/t.txt
SUF= lb 120 9b -p 512,2048,8192,32768 -n 128 -r 2; echo "llama 9b rc=$? $(el) s" >> $O/t.txt
SUF=-ub2048 lb 60 9b -p 8192 -n 0 -ub 2048 -r 2; echo "llama 9b ub2048 rc=$? $(el) s" >> $O/t.txt; fin
SUF= kb 100 27b -p 512,2048 -n 128 -ub 512,2048 -r 2; echo "kiln 27b rc=$? $(el) s" >> $O/t.txt
SUF= lb 90 27b -p 512,2048 -n 128 -r 2; echo "llama 27b rc=$? $(el) s" >> $O/t.txt; fin
python3 - $O >> $O/t.txt <<'PY'
import json, sys, glob, os
o = sys.argv[1]
for f in sorted(glob.glob(o + "/*.jsonl")):
    for line in open(f):
        try: r = json.loads(line)
        except Exception: continue
        test = f"pp{r['n_prompt']}" if r.get("n_gen", 0) == 0 else f"tg{r['n_gen']}"
        print(f"{os.path.basename(f):24s} ub={r.get('n_ubatch')} {test:8s} {r['avg_ts']:10.1f} ± {r.get('stddev_ts', 0):.1f}")
PY
fin
# Serving: one server at a time, kiln serve's defaults (-ub auto) vs llama-server -np 32.
up() { for i in $(seq 1 120); do python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null && return 0; sleep 1; done; return 1; }
serve() {  # name port cmd...
  local n=$1 p=$2; shift 2; "$@" --host 127.0.0.1 --port $p > $O/server-$n.log 2>&1 & local pid=$!
  if up $p; then echo "$n up $(el) s" >> $O/t.txt
    timeout 200 python3 bench/serve_load.py --url http://127.0.0.1:$p --clients 1,8,32 --requests 2 --max-tokens 128 --kind shared,unique --timeout 60 --json $O/load-$n.json > $O/load-$n.md 2>&1
    echo "$n load rc=$? $(el) s" >> $O/t.txt; cat $O/load-$n.md >> $O/t.txt
  else echo "$n did not come up" >> $O/t.txt; tail -5 $O/server-$n.log >> $O/t.txt; fi
  kill $pid; sleep 2; kill -9 $pid 2>/dev/null; fin
}
[ $(el) -lt 330 ] && serve kiln 8090 $K/kiln serve -m $P/m/9b.gguf -ngl all -fa on -c 65536 -np 32
grep -E "tokens per step|steps of up to|ubatch" $O/server-kiln.log | head -3 >> $O/t.txt
[ $(el) -lt 430 ] && LD_LIBRARY_PATH=$LL serve llama 8091 $LL/llama-server -m $P/m/9b.gguf -ngl 99 -fa on -c 65536 -np 32
if [ $(el) -lt 480 ]; then
  KILN_CUDA_PROFILE=1 timeout 40 $K/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 0 -n 16 -r 1 > $O/profile-9b-tg.txt 2>&1
  echo "profile rc=$? $(el) s" >> $O/t.txt
fi
tar cf - -C $O . | xz -T8 > $OUT/run101.tar.xz; fin
cat $O/t.txt; echo "total $(el) s"
