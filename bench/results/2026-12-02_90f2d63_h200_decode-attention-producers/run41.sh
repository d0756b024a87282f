#!/usr/bin/env bash
# Device run 41 (session 7): the drafter's greedy token over the vocabulary by a block per row
# (topk_route k = 1), synthetic acceptance drafting whatever the confidence, empty model drafts in the
# back-off: test_cuda_backend (topk at 248,320), test_cuda_mtp / spec; draft-mtp through the servers again.
R=$PWD
S=$(date +%s)
tar xJf .gpu-run/bins.tar.xz && tar xJf .gpu-run/llama-all.tar.xz && xz -dk .gpu-run/vocab-qwen35.gguf.xz
B=$R/.gpu/bin LL=$R/llama-cuda-sm90a
export LD_LIBRARY_PATH=$B
O=/tmp/o41; mkdir -p $O; M=/tmp/m; mkdir -p $M
[ -f $M/9b8m.gguf ] || ( $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 --mtp --vocab .gpu-run/vocab-qwen35.gguf -q -o $M/9b8m.gguf ) &
G=$!
for t in test_cuda_backend test_cuda_mtp test_cuda_spec; do
  s0=$(date +%s); timeout 100 $B/$t --gtest_brief=1 > $O/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
done
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -20
wait $G; echo "model ready after $(( $(date +%s) - S )) s"
sed -i 's#/tmp/o/server#/tmp/o41/server#' .gpu-run/spec_client.py
C="python3 .gpu-run/spec_client.py"
K="$B/kiln serve -m $M/9b8m.gguf -ngl all -fa on -c 4096 -np 1 --no-warmup"
L="$LL/llama-server -m $M/9b8m.gguf -ngl 99 -fa on -c 4096 -np 1"
run() { echo "$1 | kiln: $($C 8090 3 128 -- $K --port 8090 $2) | llama: $(LD_LIBRARY_PATH=$LL $C 8091 3 128 -- $L --port 8091 $2)"; }
{
run "plain        " ""
run "mtp synth 2  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 2"
run "mtp synth 3  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 3"
run "mtp synth 4  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 4"
run "mtp real p0  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0"
run "mtp real     " "--spec-type draft-mtp --spec-draft-n-max 3"
} 2>&1 | tee $O/spec.txt
grep -h "draft:" $O/server-8090-*.log | head -20
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run41.tar.xz
