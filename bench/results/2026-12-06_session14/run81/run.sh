#!/usr/bin/env bash
# Device run 81 (session 14), first call: GPU tests at the final code (the tensor-map switch moved beside the
# bulk switch); the files for later calls generated meanwhile; then the 10-minute soak started detached (soak.sh)
# with decode-only step graphs (6173e16). This call returns at ~590 s with the soak's first samples.
S=$(date +%s); P=/tmp/p; O=/tmp/o81; mkdir -p $O $P/m; I=.gpu-run/r81
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
cp $I/soak.sh bench/soak.py $I/img_client.py $I/long_client.py /tmp/
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader > $O/gpu.txt
G="$B/kiln gguf gen --vocab $P/vocab.gguf -q"
$G --preset qwen35-9b --mix iq4_xs --fast -t 4 -o $P/m/9b.gguf &
$G --preset qwen35-9b --mix iq4_xs --mtp --fast -t 3 -o $P/m/9b-mtp.gguf &
$G --preset qwen35-27b --mix q4_k_m --mtp --fast -t 4 -o $P/m/27b-mtp.gguf &
$B/kiln gguf gen --mmproj --preset qwen35-9b -q -t 2 -o $P/m/mm9b.gguf &
$B/kiln gguf gen --mmproj --preset qwen35-27b -q -t 2 -o $P/m/mm27b.gguf &
( for t in test_cuda_matmul test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend test_cuda_model test_cuda_seq; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt )
wait; echo "gen+tests $(( $(date +%s) - S )) s" >> $O/tests.txt; ls -la $P/m > $O/files.txt
# One KILN_CUDA_MV_TMAP=0 pass of the tensor-map test (the environment switch, now read by matmul.cu).
KILN_CUDA_MV_TMAP=0 timeout 100 $B/test_cuda_matmul --gtest_brief=1 > $O/matmul-tmap0.log 2>&1; echo "matmul tmap=0 rc=$?" >> $O/tests.txt
setsid nohup bash /tmp/soak.sh > $O/soak.out 2>&1 < /dev/null &
echo "soak started at $(( $(date +%s) - S )) s" >> $O/tests.txt
while [ $(( $(date +%s) - S )) -lt 580 ]; do sleep 5; done
cp $O/tests.txt $O/test_cuda_*.log $O/matmul-tmap0.log $O/gpu.txt $O/files.txt $O/soak.txt $O/metrics.txt $OUT/ 2>/dev/null
cat $O/gpu.txt $O/tests.txt; grep -B2 -A8 "Failure" $O/test_cuda_*.log | head -30; tail -25 $O/soak.txt; tail -3 $O/metrics.txt
