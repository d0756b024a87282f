#!/usr/bin/env bash
# Device run 111 (session 22): N = main a7f5bef (mmq stream-K + matmul_n segments + x made once; x producers fused into
# mmq's F16 x for 9..32 columns; delta_prep per (head, run); the CUDA-core chunked kernels removed): every GPU test; O = main 1119aa4's kiln: batched-bench
# -npp 512 -ntg 128 -npl 8,16,32 alternating O / N; N with KILN_CUDA_MMQ_MIN_M=5 at 4 / 8 streams; N's per-op
# profile at 32 streams; N's tg128 / pp2048. Carry .gpu-run/r111, .gpu-run/r101/vocab-qwen35.gguf.xz.
S=$(date +%s); P=/tmp/p; O=/tmp/o111; R=.gpu-run/r111; mkdir -p $O $P/m
el() { echo $(( $(date +%s) - S )); }
xz -dc $R/NO.tar.xz | tar x -C $P; N=$P/N/.gpu/bin; Q=$P/O/.gpu/bin; cp $N/lib*.so* $Q/
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
LD_LIBRARY_PATH=$N $N/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf > $O/gen.log 2>&1 &
GEN=$!
for t in test_cuda_matmul test_cuda_fused test_cuda_model test_cuda_seq test_cuda_mtp test_cuda_spec test_cuda_backend; do
  s0=$(date +%s); LD_LIBRARY_PATH=$N timeout 120 $N/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -h -B2 -A8 "Failure" $O/test_cuda_*.log | head -40 >> $O/t.txt
wait $GEN
bb() {  # label bin [env]
  local lab=$1 D=$2; shift 2
  echo "$lab $(env LD_LIBRARY_PATH=$D "$@" timeout 60 $D/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 512 -ntg 128 -npl ${NPL:-8,16,32} 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}')" >> $O/t.txt
  cp $O/t.txt $OUT/
}
for r in 1 2; do [ $(el) -lt 380 ] || break; bb "O r$r" $Q; bb "N r$r" $N; done
NPL=4,8 bb "N min5" $N KILN_CUDA_MMQ_MIN_M=5
NPL=4,8 bb "N min9" $N
for n in 8 32; do LD_LIBRARY_PATH=$N KILN_CUDA_PROFILE=1 timeout 40 $N/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 128 -ntg 32 -npl $n > $O/prof-npl$n.txt 2>&1; done
[ $(el) -lt 480 ] && LD_LIBRARY_PATH=$N timeout 40 $N/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 2048 -n 128 -r 2 2>/dev/null | grep -E '^\| qwen' >> $O/t.txt
tar cf - -C $O . | xz -T8 > $OUT/run111.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
