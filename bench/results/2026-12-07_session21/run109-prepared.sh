#!/usr/bin/env bash
# Device run 109 (prepared in session 21): A/B of branch gdn-pass-8warps (edc4adf: the chunked pass kernel on 8 warps)
# against main (f2225d8) on one machine: test_cuda_seq of both (correctness), their gated_delta timings, test_cuda_model
# of the branch, then kiln bench pp2048 / pp8192 at -ub 2048 with both kiln binaries, alternating.
# Carry .gpu-run/r109 and .gpu-run/r101/vocab-qwen35.gguf.xz (~35 MiB); move tests/fixtures and bench/results aside.
S=$(date +%s); P=/tmp/p; O=/tmp/o109; R=.gpu-run/r109; mkdir -p $O $P/m $P/A $P/B
el() { echo $(( $(date +%s) - S )); }
tar xJf $R/main.tar.xz -C $P/A; tar xJf $R/branch.tar.xz -C $P/B; A=$P/A/.gpu/bin; B=$P/B/.gpu/bin
xz -dc .gpu-run/r101/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name --format=csv,noheader > $O/t.txt
LD_LIBRARY_PATH=$A $A/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --fast -t 8 -o $P/m/9b.gguf > $O/gen.log 2>&1 &
GEN=$!
for v in A B; do D=${!v}
  LD_LIBRARY_PATH=$D timeout 60 $D/test_cuda_seq --gtest_brief=1 > $O/seq-$v.log 2>&1
  echo "$v test_cuda_seq rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' $O/seq-$v.log | tr '\n' ' ')" >> $O/t.txt
  LD_LIBRARY_PATH=$D KILN_CUDA_BENCH=1 timeout 40 $D/test_cuda_seq --gtest_filter='*BenchTimings*' 2>&1 | grep -E 'gated_delta.*(512|2048)' | sed "s/^/$v /" >> $O/t.txt
  cp $O/t.txt $OUT/
done
grep -E '^\[gdn' $O/seq-B.log | head -6 >> $O/t.txt
LD_LIBRARY_PATH=$B timeout 60 $B/test_cuda_model --gtest_brief=1 > $O/model-B.log 2>&1
echo "B test_cuda_model rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' $O/model-B.log | tr '\n' ' ')" >> $O/t.txt; cp $O/t.txt $OUT/
wait $GEN
for r in 1 2; do for v in A B; do D=${!v}; [ $(el) -lt 250 ] || break
  echo "$v r$r $(LD_LIBRARY_PATH=$D timeout 60 $D/kiln bench -m $P/m/9b.gguf -ngl all -fa on -p 2048,8192 -n 0 -ub 2048 -r 2 2>/dev/null | grep -E '^\| qwen' | awk -F'|' '{print $7 $8}' | tr '\n' ' ')" >> $O/t.txt
  cp $O/t.txt $OUT/
done; done
cat $O/t.txt; echo "total $(el) s"
