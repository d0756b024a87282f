#!/usr/bin/env bash
# Device run 119 (prepared in session 23 for the next one): A = main 02ac4ef (code), SK = the
# stream-K build of run 117 (a33c382, kiln only). (1) ncu of the small-batch mat-mul at 32 columns, A and SK, on an
# 8-layer 9B (stall reasons, issue activity, occupancy, memory); (2) every GPU test at KILN_CUDA_MMQ_MIN_STEPS=2 (the
# candidate default); (3) full-size 9B (with MTP): batched-bench 16 / 32 streams, MIN_STEPS 4 vs 2, twice; (4) #16:
# spec-bench plain vs draft-mtp synth-len 3 and an op-by-op profile of the latter.
# Carry .gpu-run/r119 and .gpu-run/r101/vocab-qwen35.gguf.xz (aside.sh out all).
S=$(date +%s); P=/tmp/p; O=/tmp/o119; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
xz -dc .gpu-run/r119/AS.tar.xz | tar x -C $P/K; A=$P/K/A/bin; SK=$P/K/SK; cp $A/lib*.so* $SK/
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
F8=$P/m/9b8.gguf F=$P/m/9b-mtp.gguf
LD_LIBRARY_PATH=$A $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --n-layer 8 --mix iq4_xs --fast -t 14 -o $F8 > $O/gen8.log 2>&1
echo "gen8 $(el) s" >> $O/t.txt
LD_LIBRARY_PATH=$A $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 10 -o $F > $O/gen.log 2>&1 &
G=$!
NCU="ncu --clock-control none --graph-profiling node"
for v in A SK; do D=${!v}
  LD_LIBRARY_PATH=$D timeout 100 $NCU --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis -k regex:mmq_kernel --launch-skip 40 \
    --launch-count 10 --log-file $O/ncu-$v.txt $D/kiln batched-bench -m $F8 -ngl all -fa on -npp 64 -ntg 4 -npl 32 > $O/ncu-$v.out 2>&1
  echo "ncu $v rc=$? $(el) s" >> $O/t.txt; cp $O/t.txt $OUT/
done
for t in test_cuda_matmul test_cuda_model test_cuda_fused test_cuda_mtp test_cuda_spec; do
  s0=$(date +%s); LD_LIBRARY_PATH=$A KILN_CUDA_MMQ_MIN_STEPS=2 timeout 120 $A/$t --gtest_brief=1 > $O/ms2-$t.log 2>&1
  echo "ms2 $t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/ms2-$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -h -B2 -A8 "Failure" $O/ms2-*.log | head -30 >> $O/t.txt
wait $G; echo "gen done $(el) s" >> $O/t.txt; cp $O/t.txt $OUT/
export LD_LIBRARY_PATH=$A
bb() {  # label [env]
  echo "$1 $(env $2 timeout 45 $A/kiln batched-bench -m $F -ngl all -fa on -npp 512 -ntg 128 -npl 16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}') $(el)s" >> $O/t.txt
  cp $O/t.txt $OUT/
}
bb "ms4 r1"; bb "ms2 r1" KILN_CUDA_MMQ_MIN_STEPS=2; bb "ms4 r2"; bb "ms2 r2" KILN_CUDA_MMQ_MIN_STEPS=2
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536 --spec-synth-len 3"
for r in 1 2; do [ $(el) -lt 480 ] || break
  timeout 40 $A/kiln spec-bench -m $F -npp 64 -ntg 128 -r 6 > $O/sb-plain-$r.txt 2>$O/sb-plain-$r.err
  echo "plain r$r $(grep -E '^\| none' $O/sb-plain-$r.txt)" >> $O/t.txt
  timeout 40 $A/kiln spec-bench -m $F -npp 64 -ntg 128 -r 6 $M > $O/sb-s3-$r.txt 2>$O/sb-s3-$r.err
  echo "synth3 r$r $(grep -E '^\| draft' $O/sb-s3-$r.txt) $(el)s" >> $O/t.txt; cp $O/t.txt $OUT/
done
[ $(el) -lt 540 ] && KILN_CUDA_PROFILE=1 timeout 40 $A/kiln spec-bench -m $F -npp 64 -ntg 64 -r 1 $M > $O/prof-sb-s3.txt 2>&1
tar cf - -C $O . | xz -T8 > $OUT/run119.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
