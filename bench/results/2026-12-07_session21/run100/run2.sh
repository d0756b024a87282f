#!/usr/bin/env bash
# Device run 100 (session 19), one call: carry .gpu-run/r100 and .gpu-run/fid with tests/fixtures, bench/results,
# src, docs and tests moved aside (64 MiB). Binaries of main at 8b27d2f (packed in session 20; no C++/CUDA change after it). (1) test_cuda_seq with the tensor-core
# chunked delta rule and with KILN_GDN_PASS=1 (the CUDA-core kernels), their gated_delta timings; (2) kiln pp with
# --delta-chunk 0 / 64; (3) every other GPU test; (4) the fidelity table; (5) llama-bench and kiln bench on the same
# files in the same run, tg128 with 7 / 8 CTAs (KILN_CUDA_MV_OCC); (6) ncu of the chunked kernels; -ub 2048.
S=$(date +%s); P=/tmp/p; O=/tmp/o100; I=.gpu-run/fid; mkdir -p $O $P/m $P/K3
el() { echo $(( $(date +%s) - S )); }
tar xJf .gpu-run/r100/bins.tar.xz -C $P/K3; K=$P/K3/.gpu/bin
xz -dc .gpu-run/r100/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
( [ -s $P/m/9b.gguf ] || LD_LIBRARY_PATH=$K $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 8 -o $P/m/9b.gguf
  [ -s $P/m/27b.gguf ] || LD_LIBRARY_PATH=$K $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-27b --mix q4_k_m --fast -t 8 -o $P/m/27b.gguf ) > $O/gen.log 2>&1 &
GEN=$!
( xz -dc $I/pride.txt.xz > $P/pride.txt; cat $I/llama-*.part-0* | xz -d | tar x -C $P
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $I/gguf*.whl ) > $O/llama-unpack.log 2>&1 &
LLU=$!
export LD_LIBRARY_PATH=$K
tst() {  # name [env…]
  local t=$1; shift; s0=$(date +%s); env "$@" timeout 150 $K/$t --gtest_brief=1 > $O/$t$SUF.log 2>&1
  echo "$t$SUF rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t$SUF.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $O/$t$SUF.log $OUT/
}
SUF= tst test_cuda_seq
SUF=-pass1 tst test_cuda_seq KILN_GDN_PASS=1
grep -E '^\[gdn' $O/test_cuda_seq.log > $O/gdn.txt; echo "-- pass1" >> $O/gdn.txt; grep -E '^\[gdn' $O/test_cuda_seq-pass1.log >> $O/gdn.txt
for v in 0 1; do
  KILN_GDN_PASS=$v KILN_CUDA_BENCH=1 timeout 100 $K/test_cuda_seq --gtest_filter='*BenchTimings*' > $O/seq-bench$v.log 2>&1
  echo "pass1=$v" >> $O/t.txt; grep -E 'gated_delta' $O/seq-bench$v.log >> $O/t.txt
done; cp $O/seq-bench*.log $O/t.txt $O/gdn.txt $OUT/
wait $GEN; echo "files ready $(el) s" >> $O/t.txt
for m in 9b 27b; do
  pp=512,2048; [ $m = 9b ] && pp=512,2048,8192
  timeout 120 $K/kiln bench -m $P/m/$m.gguf -ngl all -fa on -p $pp -n 0 -r 3 --delta-chunk 0,64 > $O/pp-$m.log 2>&1
  echo "$m pp rc=$? $(el) s" >> $O/t.txt; grep -E '^\| qwen' $O/pp-$m.log | head -6 >> $O/t.txt; cp $O/t.txt $O/pp-$m.log $OUT/
done
KILN_GDN_PASS=1 timeout 60 $K/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 512,2048 -n 0 -r 3 --delta-chunk 64 > $O/pp-9b-pass1.log 2>&1
echo "9b pp pass1 rc=$? $(el) s" >> $O/t.txt; grep -E '^\| qwen' $O/pp-9b-pass1.log | head -2 >> $O/t.txt; cp $O/t.txt $O/pp-9b-pass1.log $OUT/
for t in test_cuda_matmul test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend test_cuda_model; do SUF= tst $t; done
grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -30 >> $O/t.txt
wait $LLU; export PYTHONPATH=/tmp/site; LL=$P/llama-cuda-sm90a
ARCHS="llama qwen35 qwen35moe" WEIGHTS="q4_k_m iq4_xs" KVS="f16 q8_0" timeout 150 env LD_LIBRARY_PATH=$K:$LL scripts/gpu_fidelity.sh $K/kiln $LL $P/pride.txt $O/fid > $O/fidelity.md 2>&1
echo "fidelity rc=$? $(el) s" >> $O/t.txt; tail -22 $O/fidelity.md >> $O/t.txt
rm -f $O/fid/*.gguf $O/fid/*.kld; cp -r $O/fidelity.md $O/fid $O/t.txt $OUT/
for m in 9b 27b; do [ $(el) -lt 420 ] || break
  pp=512,2048; [ $m = 9b ] && pp=512,2048,8192
  LD_LIBRARY_PATH=$LL timeout 90 $LL/llama-bench -m $P/m/$m.gguf -ngl 99 -fa 1 -p $pp -n 128 -r 2 > $O/llama-$m.md 2> $O/llama-$m.err
  echo "$m llama rc=$? $(el) s" >> $O/t.txt; grep -E '^\| qwen' $O/llama-$m.md >> $O/t.txt; cp $O/t.txt $O/llama-$m.md $OUT/
  for v in 7 8 7 8; do [ $(el) -lt 450 ] || break
    echo "$m tg128 occ=$v $(KILN_CUDA_MV_OCC=$v timeout 40 $K/kiln bench -m $P/m/$m.gguf -ngl all -fa on -p 0 -n 128 -r 3 2>/dev/null | grep -E '\| *tg' | awk -F'|' '{print $8}' | head -1)" >> $O/t.txt
  done; cp $O/t.txt $OUT/
done
[ $(el) -lt 470 ] && SUF=-occ8 tst test_cuda_matmul KILN_CUDA_MV_OCC=8
if [ $(el) -lt 480 ]; then
  KILN_CUDA_BENCH=1 timeout 60 ncu --clock-control none -k 'regex:gdn_(plan|prep|pass)' -s 3 -c 6 \
    --metrics gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
    $K/test_cuda_seq --gtest_filter='*BenchTimings*' > $O/ncu-gdn.log 2>&1
  grep -E 'gdn_|gpu__time|issue_active|warps_active|grid_size|bank' $O/ncu-gdn.log | head -40 > $O/ncu-gdn.txt; cp $O/ncu-gdn.* $OUT/
fi
if [ $(el) -lt 500 ]; then
  timeout 30 $K/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 2048 -ub 2048 -n 0 -r 2 --delta-chunk 0,64 > $O/pp-9b-ub2048.log 2>&1
  grep -E '^\| qwen' $O/pp-9b-ub2048.log | head -2 >> $O/t.txt
  LD_LIBRARY_PATH=$LL timeout 30 $LL/llama-bench -m $P/m/9b.gguf -ngl 99 -fa 1 -p 2048 -ub 2048 -n 0 -r 2 > $O/llama-9b-ub2048.md 2>&1
  grep -E '^\| qwen' $O/llama-9b-ub2048.md >> $O/t.txt; cp $O/*.log $O/*.md $O/t.txt $OUT/ 2>/dev/null
fi
cat $O/t.txt; echo "total $(el) s"
