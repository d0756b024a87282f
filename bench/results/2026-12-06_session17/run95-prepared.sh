#!/usr/bin/env bash
# Device run 95 (prepared in session 17; carry .gpu-run/r95 with tests/fixtures and bench/results moved aside):
# binaries of main at 3ca019e (the session's last CUDA change: the 7-CTA one-column mat-vec on by default, run 94
# ran only test_cuda_matmul with it). (1) every GPU test binary; (2) tg128 with KILN_CUDA_MV_OCC7=0 / 1
# alternating on the 9B IQ4_XS and the 27B Q4_K_M (Q4_K / Q5_K take the 7-CTA kernels too: not yet measured);
# (3) KILN_CUDA_MV_M4_CTAS5=0 / 1 (the 3-4-column bulk kernels at 5 CTAs per SM, 96 registers; measurement
# only): test_cuda_matmul / _mtp / _spec with it, then batched-bench -npl 4 and spec-bench synth-len 3 alternating.
S=$(date +%s); P=/tmp/p; O=/tmp/o95; mkdir -p $O $P/m $P/K
tar xJf .gpu-run/r95/bins.tar.xz -C $P/K; K=$P/K/.gpu/bin; export LD_LIBRARY_PATH=$K
xz -dc .gpu-run/r95/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
( [ -s $P/m/9b.gguf ] || $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 8 -o $P/m/9b.gguf
  [ -s $P/m/27b.gguf ] || $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-27b --mix q4_k_m --fast -t 8 -o $P/m/27b.gguf ) > $O/gen.log 2>&1 &
GEN=$!
for t in test_cuda_matmul test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend test_cuda_model test_cuda_seq; do
  s0=$(date +%s); timeout 150 $K/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $O/$t.log $OUT/
done
grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -30 >> $O/t.txt
wait $GEN; echo "files ready $(( $(date +%s) - S )) s" >> $O/t.txt
for r in 1 2; do for m in 9b 27b; do for v in 0 1; do
  echo "$m tg128 occ7=$v r$r $(KILN_CUDA_MV_OCC7=$v timeout 60 $K/kiln bench -m $P/m/$m.gguf -ngl all -fa on -p 0 -n 128 -r 3 2>/dev/null | grep -E '\| *tg' | awk -F'|' '{print $8}' | head -1)" >> $O/t.txt
  cp $O/t.txt $OUT/
done; done; done
for t in test_cuda_matmul test_cuda_mtp test_cuda_spec; do
  s0=$(date +%s); KILN_CUDA_MV_M4_CTAS5=1 timeout 150 $K/$t --gtest_brief=1 > $O/$t-m4c5.log 2>&1
  echo "$t (M4 CTAS5) rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t-m4c5.log | tr '\n' ' ')" >> $O/t.txt
done
cp $O/t.txt $OUT/
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536 --spec-synth-len 3"
for r in 1 2; do for v in 0 1; do
  echo "m4c5=$v r$r npl4 $(KILN_CUDA_MV_M4_CTAS5=$v timeout 60 $K/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 128 -ntg 128 -npl 4 2>/dev/null | grep -E '^\|' | tail -1)" >> $O/t.txt
  echo "m4c5=$v r$r spec $(KILN_CUDA_MV_M4_CTAS5=$v timeout 60 $K/kiln spec-bench -m $P/m/9b.gguf -npp 64 -ntg 128 -r 8 $M 2>/dev/null | grep -E '^\| draft')" >> $O/t.txt
  cp $O/t.txt $OUT/
done; done
cat $O/t.txt; echo "total $(( $(date +%s) - S )) s"
