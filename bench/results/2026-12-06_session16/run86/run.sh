#!/usr/bin/env bash
# Device run 86 (session 15; session 16 added the KILN_MTP_NO_CATCHUP rows): GPU tests after the draft graph's logits-view fix (run 83: test_cuda_mtp aborted, the
# full-vocabulary graph drafts took the logits view before binding); spec-bench 9B at all ids vs 65,536; then #15's
# 8 GiB cap filled to the end (9B IQ4_XS + MTP + projector, 64K q8_0, draft-mtp, the plan's own -ngl); then load
# time (kiln serve vs llama-server, 9B and 27B, page cache warm / cold). Files stay in /tmp/p/m for run 85 (24 GiB).
S=$(date +%s); P=/tmp/p; O=/tmp/o86; mkdir -p $O $P/m; I=.gpu-run/r86
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf; cp $I/*.py /tmp/
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader > $O/gpu.txt
G="$B/kiln gguf gen --vocab $P/vocab.gguf -q"
$G --preset qwen35-9b --mix iq4_xs --mtp --fast -t 8 -o $P/m/9b-mtp.gguf & G9=$!
$B/kiln gguf gen --mmproj --preset qwen35-9b -q -t 2 -o $P/m/mm9b.gguf & GM=$!
( sleep 20; $G --preset qwen35-27b --mix q4_k_m --mtp --fast -t 6 -o $P/m/27b-mtp.gguf ) &
( for t in test_cuda_mtp test_cuda_matmul test_cuda_fused test_cuda_spec test_cuda_backend test_cuda_model test_cuda_seq; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt )
cp $O/tests.txt $O/test_cuda_*.log $O/gpu.txt $OUT/   # each stage's results to $OUT at once (a cut call keeps them)
wait $G9; echo "9b + tests $(( $(date +%s) - S )) s" >> $O/tests.txt
M="--spec-type draft-mtp --spec-draft-n-max 3"; SB="$B/kiln spec-bench -m $P/m/9b-mtp.gguf -npp 64 -ntg 128 -r 3"
V="--spec-draft-vocab 65536"
for a in "" "$M --spec-draft-p-min 0" "$M --spec-synth-len 3" "$M --spec-draft-p-min 0 $V" "NC $M --spec-draft-p-min 0 $V" "" "NC $M --spec-synth-len 3 $V" "$M --spec-synth-len 3 $V"; do
  e=""; [ "${a:0:3}" = "NC " ] && e="KILN_MTP_NO_CATCHUP=1" && a="${a:3}"
  echo "9b $e $a | $(env $e timeout 60 $SB $a 2>$O/sb.err | grep -E '^\| (none|draft)')"; grep -h "draft:" $O/sb.err | tail -1 | sed 's/^.*draft:/  draft:/'
  cp $O/spec.txt $OUT/ 2>/dev/null
done > $O/spec.txt 2>&1
cp $O/spec.txt $OUT/
wait $GM
capped() {  # tag model mmproj cap ctx ctype n_prompt timeout
  local tag=$1; base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $O/mem-$tag.csv & local MP=$!
  timeout $(( $8 + 60 )) $B/kiln serve -m $2 --mmproj $3 -c $5 -ctk $6 -ctv $6 --spec-type draft-mtp --metrics --device-memory $4 --port 8092 > $O/kiln-$tag.log 2>&1 &
  local KS=$!
  for i in $(seq 480); do curl -sf localhost:8092/health > /dev/null && break; sleep 0.25; done
  echo "$tag ready at $(( $(date +%s) - S )) s: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits) MiB" >> $O/stages.txt
  timeout 60 python3 /tmp/img_client.py 8092 >> $O/stages.txt 2>&1
  echo "$tag after image: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  timeout $(( $8 + 5 )) python3 /tmp/long_client.py 8092 $7 $8 >> $O/stages.txt 2>&1
  echo "$tag after prompt ($(( $(date +%s) - S )) s): $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  curl -s localhost:8092/metrics | grep -E "draft|accepted|prompt_tokens" >> $O/stages.txt
  kill $KS; wait $KS 2>/dev/null; kill $MP; sleep 0.5
  echo "$tag: baseline $base MiB, peak $(sort -n $O/mem-$tag.csv | tail -1) MiB" >> $O/stages.txt
  grep -E "the plan|plan needs|total|layers|prompt eval|eval time|draft:" $O/kiln-$tag.log | head -14 >> $O/stages.txt
  cp $O/stages.txt $O/kiln-$tag.log $OUT/
}
capped 8g $P/m/9b-mtp.gguf $P/m/mm9b.gguf 8GiB 65536 q8_0 0 $(( 500 - ($(date +%s) - S) ))
mkdir -p $P/ll && cat .gpu-run/ll/llama-cuda-sm90a.tar.xz.part-0* | xz -d | tar x -C $P/ll; LL=$P/ll/llama-cuda-sm90a
evict() { sync; python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" $1; }
load() {  # engine file state -> seconds from start to /health 200
  local f=$2; [ $3 = cold ] && evict $f; [ $3 = warm ] && cat $f > /dev/null
  local res=$(fincore -n -o RES -b $f | tr -d ' ')
  local t0=$(date +%s.%N)
  if [ $1 = kiln ]; then $B/kiln serve -m $f -ngl all -c 8192 --port 8095 > $O/load-$1.log 2>&1 &
  else LD_LIBRARY_PATH=$LL $LL/llama-server -m $f -ngl 99 -c 8192 --port 8095 > $O/load-$1.log 2>&1 & fi
  local pid=$!
  for i in $(seq 3000); do curl -sf localhost:8095/health > /dev/null && break; sleep 0.01; done
  local t1=$(date +%s.%N); kill $pid; wait $pid 2>/dev/null
  echo "$1 $(basename $f) $3 (resident before: $res bytes): $(python3 -c "print(round($t1 - $t0, 3))") s" >> $O/load.txt
  cp $O/load.txt $OUT/
}
wait
for m in 9b 27b; do for st in warm cold; do for r in 1 2; do for e in kiln llama; do
  [ $m = 27b ] && [ $r = 2 ] && continue
  [ $(( $(date +%s) - S )) -gt 550 ] && break 4
  load $e $P/m/$m-mtp.gguf $st
done; done; done; done
wait; ls -la $P/m > $O/files.txt
cat $O/gpu.txt $O/tests.txt; grep -B2 -A8 "Failure" $O/test_cuda_*.log | head -30; cat $O/spec.txt $O/stages.txt $O/load.txt
echo "total $(( $(date +%s) - S )) s"
xz -T8 -c $O/mem-8g.csv > $OUT/mem-8g.csv.xz; cp $O/files.txt $O/load-*.log $OUT/
