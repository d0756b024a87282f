#!/usr/bin/env bash
# Device run 112 (session 22): why run 111's stream-K mmq (N1) made batched decode 2.5-3x slower at 16 / 32 streams.
# O = 1119aa4, N1 = a7f5bef (run 111), N2 = the unit loop without 64-bit divisions and the reduction's loads
# batched, N3 = N2 with mmq's PDL trigger at each CTA's last unit instead of its start. test_cuda_matmul /
# test_cuda_fused (N3); batched-bench 16 / 32 streams for O, N1, N2, N3 and N2 / O with KILN_CUDA_PDL_ALL=0 (the PDL
# cascade hypothesis); the mmq microbench (Q4_K rows) and ncu of the first mmq launches in batched decode, O / N3.
# Carry .gpu-run/r111, .gpu-run/r112, .gpu-run/r101/vocab-qwen35.gguf.xz.
S=$(date +%s); P=/tmp/p; O=/tmp/o112; mkdir -p $O $P/m
el() { echo $(( $(date +%s) - S )); }
xz -dc .gpu-run/r111/NO.tar.xz | tar x -C $P; xz -dc .gpu-run/r112/N23.tar.xz | tar x -C $P
N1=$P/N/.gpu/bin; Q=$P/O/.gpu/bin; N2=$P/N2/.gpu/bin; N3=$P/N3/.gpu/bin; cp $N1/lib*.so* $Q/
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name --format=csv,noheader > $O/t.txt
LD_LIBRARY_PATH=$N3 $N3/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf > $O/gen.log 2>&1 &
GEN=$!
for t in test_cuda_fused test_cuda_matmul; do
  s0=$(date +%s); LD_LIBRARY_PATH=$N3 timeout 120 $N3/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "N3 $t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -h -B2 -A8 "Failure" $O/test_cuda_*.log | head -30 >> $O/t.txt
wait $GEN
bb() {  # label bin [env]
  local lab=$1 D=$2; shift 2
  echo "$lab $(env LD_LIBRARY_PATH=$D "$@" timeout 60 $D/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 512 -ntg 128 -npl 16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}')" >> $O/t.txt
  cp $O/t.txt $OUT/
}
bb O $Q; bb N1 $N1; bb N2 $N2; bb N3 $N3; bb "N2 pdl0" $N2 KILN_CUDA_PDL_ALL=0; bb "O pdl0" $Q KILN_CUDA_PDL_ALL=0; bb N3 $N3; bb O $Q
for v in Q N3; do D=${!v}
  LD_LIBRARY_PATH=$D KILN_CUDA_BENCH=1 timeout 30 $D/test_cuda_matmul --gtest_filter='*Bench*' 2>&1 | grep -E 'batched' | head -8 | sed "s/^/$v /" >> $O/t.txt
  cp $O/t.txt $OUT/
done
for v in Q N3; do D=${!v}; [ $(el) -lt 420 ] || break
  LD_LIBRARY_PATH=$D timeout 90 ncu --graph-profiling node -k regex:mmq_kernel -c 2 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats $D/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 64 -ntg 4 -npl 32 > $O/ncu-$v.txt 2>&1
  echo "ncu $v rc=$? $(el) s" >> $O/t.txt
done
tar cf - -C $O . | xz -T8 > $OUT/run112.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
