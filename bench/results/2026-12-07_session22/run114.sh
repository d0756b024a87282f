#!/usr/bin/env bash
# Device run 114 (session 22; replaces the prepared runs 112 / 113, which never got a machine): N3 = HEAD (mmq
# stream-K, its PDL trigger at each CTA's last unit; KILN_CUDA_MMQ_PDL_EARLY=1 restores the trigger at the start).
# test_cuda_fused / test_cuda_matmul; batched-bench 16 / 32 streams N3 vs N3 early vs N3 with KILN_CUDA_PDL_ALL=0 (the
# PDL hypothesis of run 111); then against llama.cpp in the same run: batched-bench -c 20480 -npp 512 -ntg 128
# -npl 1,8,16,32, bench tg128 / pp2048. Carry .gpu-run/r114, .gpu-run/fid, .gpu-run/r101/vocab-qwen35.gguf.xz.
S=$(date +%s); P=/tmp/p; O=/tmp/o114; I=.gpu-run/fid; mkdir -p $O $P/m $P/K
el() { echo $(( $(date +%s) - S )); }
xz -dc .gpu-run/r114/N3.tar.xz | tar x -C $P/K; K=$P/K/.gpu/bin
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
( cat $I/llama-*.part-0* | xz -d | tar x -C $P ) > $O/llama-unpack.log 2>&1 &
LLU=$!
LD_LIBRARY_PATH=$K $K/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf > $O/gen.log 2>&1 &
GEN=$!
for t in test_cuda_fused test_cuda_matmul; do
  s0=$(date +%s); LD_LIBRARY_PATH=$K timeout 120 $K/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -h -B2 -A8 "Failure" $O/test_cuda_*.log | head -30 >> $O/t.txt
wait $GEN
bb() {  # label [env]
  local lab=$1; shift
  echo "$lab $(env LD_LIBRARY_PATH=$K "$@" timeout 60 $K/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 512 -ntg 128 -npl 16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}')" >> $O/t.txt
  cp $O/t.txt $OUT/
}
wait $LLU; LL=$P/llama-cuda-sm90a
LD_LIBRARY_PATH=$K timeout 100 $K/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -c 20480 -npp 512 -ntg 128 -npl 1,8,16,32 > $O/kbb.txt 2>&1; echo "kiln bb rc=$? $(el) s" >> $O/t.txt
grep -E '^\| +512' $O/kbb.txt >> $O/t.txt; cp $O/t.txt $OUT/
s32=$(grep -E '^\| +512 +\| +128 +\| +32 ' $O/kbb.txt | awk -F'|' '{printf "%d", $9}')
if [ "${s32:-0}" -gt 2800 ]; then  # the fix holds: llama.cpp in the same run, then the PDL evidence
  LD_LIBRARY_PATH=$LL timeout 120 $LL/llama-batched-bench -m $P/m/9b.gguf -ngl 99 -fa on -c 20480 -npp 512 -ntg 128 -npl 1,8,16,32 > $O/lbb.txt 2>&1; echo "llama bb rc=$? $(el) s" >> $O/t.txt
  grep -E '^\| +512' $O/lbb.txt >> $O/t.txt; cp $O/t.txt $OUT/
fi
bb "N3 early" KILN_CUDA_MMQ_PDL_EARLY=1; bb N3
[ $(el) -lt 300 ] && LD_LIBRARY_PATH=$K timeout 50 $K/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 2048 -n 128 -r 3 -o jsonl > $O/kiln-9b.jsonl 2> $O/kiln-9b.err
[ $(el) -lt 330 ] && LD_LIBRARY_PATH=$LL timeout 60 $LL/llama-bench -m $P/m/9b.gguf -ngl 99 -fa 1 -p 2048 -n 128 -r 3 -o jsonl > $O/llama-9b.jsonl 2> $O/llama-9b.err
grep -h -oE '"(n_prompt|n_gen)": *[0-9]+|"avg_ts": *[0-9.]+' $O/*-9b.jsonl | paste - - - >> $O/t.txt
tar cf - -C $O . | xz -T8 > $OUT/run114.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
