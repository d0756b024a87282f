#!/usr/bin/env bash
# Device run 116 (session 23): A = main aa3c62c (code of b7238ce): every GPU test binary, the fidelity table, then
# the copy bandwidth, kiln vs llama.cpp bench (9B IQ4_XS pp2048 / tg128) and batched-bench 8/16/32 on the same file.
# Carry .gpu-run/r116, .gpu-run/fid, .gpu-run/r101/vocab-qwen35.gguf.xz; aside.sh out all.
S=$(date +%s); P=/tmp/p; O=/tmp/o116; R=.gpu-run/r116; I=.gpu-run/fid; mkdir -p $O $P/m
el() { echo $(( $(date +%s) - S )); }
xz -dc $R/A.tar.xz | tar x -C $P; A=$P/A/bin
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/t.txt
echo "unpacked $(el) s" >> $O/t.txt
LD_LIBRARY_PATH=$A $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf > $O/gen.log 2>&1 &
GEN=$!
( xz -dc $I/pride.txt.xz > $P/pride.txt; cat $I/llama-*.part-0* | xz -d | tar x -C $P
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $I/gguf*.whl ) > $O/llama-unpack.log 2>&1 &
LLU=$!
for t in test_cuda_matmul test_cuda_model test_cuda_seq test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend; do
  s0=$(date +%s); LD_LIBRARY_PATH=$A timeout 120 $A/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -30 >> $O/t.txt
wait $LLU; export PYTHONPATH=/tmp/site; LL=$P/llama-cuda-sm90a
echo "fidelity start $(el) s" >> $O/t.txt
ARCHS="llama qwen35 qwen35moe" WEIGHTS="q4_k_m iq4_xs" KVS="f16 q8_0" timeout 220 env LD_LIBRARY_PATH=$A:$LL scripts/gpu_fidelity.sh $A/kiln $LL $P/pride.txt $O/fid > $O/fidelity.md 2>&1
echo "fidelity rc=$? $(el) s" >> $O/t.txt; tail -22 $O/fidelity.md >> $O/t.txt
rm -f $O/fid/*.gguf $O/fid/*.kld; cp $O/t.txt $OUT/
wait $GEN; echo "gen done $(el) s" >> $O/t.txt
python3 - >> $O/t.txt 2>&1 <<'PY'
import torch
n = 1 << 30
a = torch.empty(n, dtype=torch.float32, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): b.copy_(a)
e.record(); torch.cuda.synchronize()
print(f"copy bandwidth {2 * 4 * n * 10 / (s.elapsed_time(e) / 1e3) / 1e9:.0f} GB/s")
PY
[ $(el) -lt 430 ] && echo "kiln bench $(LD_LIBRARY_PATH=$A timeout 60 $A/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 2048 -n 128 -r 2 2>/dev/null | grep -E '^\| qwen' | awk -F'|' '{print $7 $8}' | tr '\n' ' ')" >> $O/t.txt
[ $(el) -lt 450 ] && echo "llama bench $(LD_LIBRARY_PATH=$LL timeout 60 $LL/llama-bench -m $P/m/9b.gguf -ngl 99 -fa 1 -p 2048 -n 128 -r 2 2>/dev/null | grep -E '^\| qwen' | awk -F'|' '{print $7 $8}' | tr '\n' ' ')" >> $O/t.txt
cp $O/t.txt $OUT/
[ $(el) -lt 480 ] && echo "kiln bb $(LD_LIBRARY_PATH=$A timeout 40 $A/kiln batched-bench -m $P/m/9b.gguf -ngl all -fa on -npp 512 -ntg 128 -npl 8,16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}')" >> $O/t.txt
cp $O/t.txt $OUT/
[ $(el) -lt 520 ] && echo "llama bb $(LD_LIBRARY_PATH=$LL timeout 50 $LL/llama-batched-bench -m $P/m/9b.gguf -ngl 99 -fa on -c 24576 -npp 512 -ntg 128 -npl 8,16,32 2>/dev/null | grep -E '^\| +512' | awk -F'|' '{printf "B=%s S_TG=%s ", $4, $9}')" >> $O/t.txt
tar cf - -C $O . | xz -T8 > $OUT/run116.tar.xz; cp $O/t.txt $OUT/
cat $O/t.txt; echo "total $(el) s"
