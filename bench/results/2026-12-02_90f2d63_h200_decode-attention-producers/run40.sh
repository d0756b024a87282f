#!/usr/bin/env bash
# Device run 40 (session 7): run 39's server part again with the ports given (draft-mtp speed, kiln serve
# vs llama-server, synthetic acceptance 2 / 3 / 4, real drafting of a random MTP block).
R=$PWD
S=$(date +%s)
[ -d .gpu/bin ] || tar xJf .gpu-run/bins.tar.xz; [ -d llama-cuda-sm90a ] || tar xJf .gpu-run/llama-all.tar.xz
[ -f .gpu-run/vocab-qwen35.gguf ] || xz -dk .gpu-run/vocab-qwen35.gguf.xz
B=$R/.gpu/bin LL=$R/llama-cuda-sm90a
export LD_LIBRARY_PATH=$B
O=/tmp/o; mkdir -p $O; M=/tmp/m; mkdir -p $M
ls -la $M/ 2>&1 | tail -2
[ -f $M/9b8m.gguf ] || $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 --mtp --vocab .gpu-run/vocab-qwen35.gguf -q -o $M/9b8m.gguf
echo "ready after $(( $(date +%s) - S )) s"
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
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run40.tar.xz
