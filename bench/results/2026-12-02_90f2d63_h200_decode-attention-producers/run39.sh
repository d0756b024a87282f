#!/usr/bin/env bash
# Device run 39 (session 7): gated-delta norm kernel over clusters of 4 blocks per head; the row-norm
# kernels' launch bounds (test_cuda_fused at k = 12288); GPU tests; tg128 A/B of the cluster switch;
# draft-mtp speed through the servers (kiln serve vs llama-server, synthetic acceptance 2 / 3 / 4 and
# real drafting of a random MTP block, i.e. ~zero acceptance) on the 9B shape (8 layers + MTP block).
R=$PWD
S=$(date +%s)
tar xJf .gpu-run/bins.tar.xz && tar xJf .gpu-run/llama-all.tar.xz && xz -dk .gpu-run/vocab-qwen35.gguf.xz
B=$R/.gpu/bin LL=$R/llama-cuda-sm90a
export LD_LIBRARY_PATH=$B
O=/tmp/o; mkdir -p $O; M=/tmp/m; mkdir -p $M
( t0=$(date +%s); $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 --mtp --vocab .gpu-run/vocab-qwen35.gguf -q -o $M/9b8m.gguf; echo "gen $(( $(date +%s) - t0 )) s" > $O/gen.txt ) &
G=$!
for t in test_cuda_fused test_cuda_seq test_cuda_model test_cuda_backend test_cuda_mtp test_cuda_spec; do
  s0=$(date +%s); timeout 150 $B/$t --gtest_brief=1 > $O/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
done
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -30
grep "fused \]" $O/test_cuda_fused.log | tail -4
LD_LIBRARY_PATH=$LL $LL/llama-server --help 2>&1 | grep -E "spec-synth|spec-type|draft-max" | head -5
wait $G; cat $O/gen.txt
bench() { timeout 100 $B/kiln bench -m $M/9b8m.gguf -ngl all -fa on -p 0 -n 128 -r 3 "$@" 2>&1; }
for i in 1 2; do bench > $O/kiln-tg-$i.md; KILN_CUDA_GDN_CLUSTER=0 bench > $O/kiln-tg-nocl-$i.md; done
for f in kiln-tg-1 kiln-tg-nocl-1 kiln-tg-2 kiln-tg-nocl-2; do echo "$f: $(grep -E 'tg128' $O/$f.md | head -1 | awk -F'|' '{print $(NF-1)}')"; done
C="python3 .gpu-run/spec_client.py"
K="$B/kiln serve -m $M/9b8m.gguf -ngl all -fa on -c 4096 -np 1 --no-warmup"
L="$LL/llama-server -m $M/9b8m.gguf -ngl 99 -fa on -c 4096 -np 1"
run() { echo "$1 | kiln: $($C 8090 3 128 -- $K $2) | llama: $(LD_LIBRARY_PATH=$LL $C 8091 3 128 -- $L $2)"; }
{
run "plain        " ""
run "mtp synth 2  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 2"
run "mtp synth 3  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 3"
run "mtp synth 4  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 4"
run "mtp real p0  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0"
run "mtp real     " "--spec-type draft-mtp --spec-draft-n-max 3"
} 2>&1 | tee $O/spec.txt
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run39.tar.xz
