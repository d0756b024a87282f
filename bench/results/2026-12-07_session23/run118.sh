#!/usr/bin/env bash
# Device run 118 (session 23): K = main 2e0d276 (the mmq split switches: KILN_CUDA_MMQ_MIN_STEPS, the fewest 256-k steps
# a split keeps, default 4; KILN_CUDA_MMQ_CTAS, the grid the splits fill up to, default 264). test_cuda_matmul's mmq
# cases at the deepest splits; batched-bench 16 / 32 streams default / MIN_STEPS 2 / 1, two rounds, on the 9B shape
# with 8 of its 32 layers (the device budget left: a full-size file takes ~165 s to write); op-by-op profiles at 32
# streams, default and MIN_STEPS=1.
S=$(date +%s); P=/tmp/p; O=/tmp/o118; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
xz -dc .gpu-run/r118/K.tar.xz | tar x -C $P/K; K=$P/K/.gpu/bin; export LD_LIBRARY_PATH=$K
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
F=$P/m/9b8.gguf
$K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --n-layer 8 --mix iq4_xs --fast -t 14 -o $F > $O/gen.log 2>&1 &
G=$!
s0=$(date +%s); KILN_CUDA_MMQ_MIN_STEPS=1 KILN_CUDA_MMQ_CTAS=4096 timeout 90 $K/test_cuda_matmul --gtest_brief=1 \
  --gtest_filter='CudaMatmul.EveryTypeEveryPath:CudaMatmul.MatmulNSharedX:CudaMatmul.BackToBackSharedWorkspace' > $O/ms1-matmul.log 2>&1
echo "ms1 test_cuda_matmul rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/ms1-matmul.log | tr '\n' ' ')" >> $O/t.txt
grep -h -B2 -A8 "Failure" $O/ms1-matmul.log | head -20 >> $O/t.txt; cp $O/t.txt $OUT/
wait $G; echo "gen done $(el) s" >> $O/t.txt; cp $O/t.txt $OUT/
bb() {  # label [env]
  echo "$1 $(env $2 timeout 30 $K/kiln batched-bench -m $F -ngl all -fa on -npp 512 -ntg 128 -npl 16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}') $(el)s" >> $O/t.txt
  cp $O/t.txt $OUT/
}
bb "def r1"; bb "ms2 r1" KILN_CUDA_MMQ_MIN_STEPS=2; bb "ms1 r1" KILN_CUDA_MMQ_MIN_STEPS=1
bb "def r2"; bb "ms2 r2" KILN_CUDA_MMQ_MIN_STEPS=2; bb "ms1 r2" KILN_CUDA_MMQ_MIN_STEPS=1
for v in 4 1; do [ $(el) -lt 170 ] || break
  KILN_CUDA_MMQ_MIN_STEPS=$v KILN_CUDA_PROFILE=1 timeout 25 $K/kiln batched-bench -m $F -ngl all -fa on -npp 128 -ntg 32 -npl 32 > $O/prof-ms$v.txt 2>&1
done
tar cf - -C $O . | xz -T8 > $OUT/run118.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
