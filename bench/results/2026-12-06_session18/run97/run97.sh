#!/usr/bin/env bash
# Device run 97 (session 18; carry .gpu-run/r97 with tests/fixtures and bench/results moved aside): the chunked
# gated delta rule on CUDA (deltanet_chunked.cuh). (1) test_cuda_seq (its gated-delta test now has runs of 64,
# 70 and 150 tokens: the chunked path, and the device plan's counts) and the gated_delta timings, recurrent vs
# chunked, 512 / 2048 tokens; (2) every other GPU test binary; (3) kiln bench pp512 / pp2048 on the 9B and the 27B
# with --delta-chunk 0 / 64; (4) if time is left: run 95's tg128 A/B of the 7-CTA default and the M4 switch.
S=$(date +%s); P=/tmp/p; O=/tmp/o97; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
tar xJf .gpu-run/r97/bins.tar.xz -C $P/K; K=$P/K/.gpu/bin; export LD_LIBRARY_PATH=$K
xz -dc .gpu-run/r97/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
( [ -s $P/m/9b.gguf ] || $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 8 -o $P/m/9b.gguf
  [ -s $P/m/27b.gguf ] || $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-27b --mix q4_k_m --fast -t 8 -o $P/m/27b.gguf ) > $O/gen.log 2>&1 &
GEN=$!
tst() {  # name [env]
  local t=$1; shift; s0=$(date +%s); env "$@" timeout 150 $K/$t --gtest_brief=1 > $O/$t$SUF.log 2>&1
  echo "$t$SUF rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t$SUF.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $O/$t$SUF.log $OUT/
}
SUF= tst test_cuda_seq
grep -E '^\[gdn' $O/test_cuda_seq.log >> $O/gdn.txt
KILN_CUDA_BENCH=1 timeout 120 $K/test_cuda_seq --gtest_filter='*BenchTimings*' > $O/seq-bench.log 2>&1
grep -E 'gated_delta' $O/seq-bench.log >> $O/t.txt; cp $O/seq-bench.log $O/t.txt $O/gdn.txt $OUT/
for t in test_cuda_matmul test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend test_cuda_model; do SUF= tst $t; done
grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -30 >> $O/t.txt
wait $GEN; echo "files ready $(el) s" >> $O/t.txt
for m in 9b 27b; do
  timeout 120 $K/kiln bench -m $P/m/$m.gguf -ngl all -fa on -p 512,2048 -n 0 -r 3 --delta-chunk 0,64 > $O/pp-$m.log 2>&1
  echo "$m pp rc=$? $(el) s" >> $O/t.txt; grep -E '^\|' $O/pp-$m.log >> $O/t.txt; cp $O/t.txt $O/pp-$m.log $OUT/
done
for m in 9b 27b; do for v in 0 1; do [ $(el) -lt 420 ] || break
  echo "$m tg128 occ7=$v $(KILN_CUDA_MV_OCC7=$v timeout 60 $K/kiln bench -m $P/m/$m.gguf -ngl all -fa on -p 0 -n 128 -r 3 2>/dev/null | grep -E '\| *tg' | awk -F'|' '{print $8}' | head -1)" >> $O/t.txt
done; done; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
