#!/usr/bin/env bash
# Device run 120 (session 24): A = main 02ac4ef (run 119's package), B = A + mmq's weights requested before
# pdl::wait and the split sum from registers (one latency round per split). (1) every GPU test with B; (2) ncu of B's
# mmq launches at 32 columns (8-layer 9B); (3) 8-layer A/B batched-bench 8/16/32, alternating x3; op-by-op profiles
# at 32 streams A and B; (4) full-size 9B (with MTP) A/B at 16/32, twice; (5) #16 spec-bench plain vs synth-len 3 (B)
# and an op-by-op profile of the latter.
S=$(date +%s); P=/tmp/p; O=/tmp/o120; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
xz -dc .gpu-run/r119/AS.tar.xz | tar x -C $P/K; xz -dc .gpu-run/r120/B.tar.xz | tar x -C $P/K
A=$P/K/A/bin; B=$P/K/B; cp $A/lib*.so* $B/
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
F8=$P/m/9b8.gguf F=$P/m/9b-mtp.gguf
LD_LIBRARY_PATH=$A $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --n-layer 8 --mix iq4_xs --fast -t 14 -o $F8 > $O/gen8.log 2>&1
echo "gen8 $(el) s" >> $O/t.txt
LD_LIBRARY_PATH=$A nice $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 8 -o $F > $O/gen.log 2>&1 &
G=$!
for t in test_cuda_matmul test_cuda_model test_cuda_seq test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend; do
  s0=$(date +%s); LD_LIBRARY_PATH=$B timeout 120 $B/$t --gtest_brief=1 > $O/B-$t.log 2>&1
  echo "B $t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/B-$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -h -B2 -A8 "Failure" $O/B-*.log | head -30 >> $O/t.txt
bb8() {  # label dir
  echo "8L $1 $(LD_LIBRARY_PATH=$2 timeout 30 $2/kiln batched-bench -m $F8 -ngl all -fa on -npp 512 -ntg 128 -npl 8,16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}') $(el)s" >> $O/t.txt
  cp $O/t.txt $OUT/
}
for r in 1 2 3; do bb8 A $A; bb8 B $B; done
for v in A B; do D=${!v}
  LD_LIBRARY_PATH=$D KILN_CUDA_PROFILE=1 timeout 25 $D/kiln batched-bench -m $F8 -ngl all -fa on -npp 128 -ntg 32 -npl 32 > $O/prof-$v-npl32.txt 2>&1
done
echo "profiles $(el) s" >> $O/t.txt
NCU="ncu --clock-control none --graph-profiling node"
LD_LIBRARY_PATH=$B timeout 100 $NCU --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis -k regex:mmq_kernel --launch-skip 40 \
  --launch-count 8 --log-file $O/ncu-B.txt $B/kiln batched-bench -m $F8 -ngl all -fa on -npp 64 -ntg 4 -npl 32 > $O/ncu-B.out 2>&1
echo "ncu B rc=$? $(el) s" >> $O/t.txt; cp $O/t.txt $OUT/
# Every kernel of decode steps (batch 1, graph nodes), 8-layer file: duration, DRAM throughput.
LD_LIBRARY_PATH=$B timeout 60 $NCU --section SpeedOfLight --launch-skip 250 --launch-count 130 --log-file $O/ncu-tg-B.txt \
  $B/kiln bench -m $F8 -ngl all -fa on -p 0 -n 12 -r 1 --no-warmup > $O/ncu-tg-B.out 2>&1
echo "ncu tg rc=$? $(el) s" >> $O/t.txt; cp $O/t.txt $OUT/
wait $G; echo "gen done $(el) s" >> $O/t.txt; cp $O/t.txt $OUT/
bb() {  # label dir
  echo "9B $1 $(LD_LIBRARY_PATH=$2 timeout 45 $2/kiln batched-bench -m $F -ngl all -fa on -npp 512 -ntg 128 -npl 16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}') $(el)s" >> $O/t.txt
  cp $O/t.txt $OUT/
}
bb A $A; bb B $B; bb A $A; bb B $B
export LD_LIBRARY_PATH=$B
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536 --spec-synth-len 3"
for r in 1 2; do [ $(el) -lt 470 ] || break
  timeout 40 $B/kiln spec-bench -m $F -npp 64 -ntg 128 -r 6 > $O/sb-plain-$r.txt 2>$O/sb-plain-$r.err
  echo "plain r$r $(grep -E '^\| none' $O/sb-plain-$r.txt)" >> $O/t.txt
  timeout 40 $B/kiln spec-bench -m $F -npp 64 -ntg 128 -r 6 $M > $O/sb-s3-$r.txt 2>$O/sb-s3-$r.err
  echo "synth3 r$r $(grep -E '^\| draft' $O/sb-s3-$r.txt) $(el)s" >> $O/t.txt; cp $O/t.txt $OUT/
done
# A verify-sized step (4 tokens) and a one-token step, op by op (spec-bench of this build prints no profile).
[ $(el) -lt 530 ] && KILN_CUDA_PROFILE=1 timeout 30 $B/kiln bench -m $F -ngl all -fa on -p 1,4 -n 0 -r 20 > $O/prof-p14.txt 2>&1
tar cf - -C $O . | xz -T8 > $OUT/run120.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
