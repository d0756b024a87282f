#!/usr/bin/env bash
# Device run 89 (session 16): the deferred MTP catch-up (Batch::mtp_defer + Context::mtp_flush) on the GPU —
# the GPU tests that run the MTP block and step graphs, then spec-bench 9B: plain, zero acceptance (65,536-id
# head and every id), synth-len 3; results to $OUT as each stage ends.
S=$(date +%s); P=/tmp/p; O=/tmp/o89; mkdir -p $O $P/m; I=.gpu-run/r89
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
xz -dc $I/test_cuda_mtp.xz > $B/test_cuda_mtp && chmod +x $B/test_cuda_mtp  # with the deferred case
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/gpu.txt
[ -s $P/m/9b-mtp.gguf ] || ($B/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 10 -o $P/m/9b-mtp.gguf) & G9=$!
( for t in test_cuda_mtp test_cuda_spec test_cuda_model; do
    s0=$(date +%s); timeout 120 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt; grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -30 >> $O/tests.txt )
cp $O/tests.txt $O/gpu.txt $OUT/
wait $G9; echo "9b ready $(( $(date +%s) - S )) s" >> $O/tests.txt
M="--spec-type draft-mtp --spec-draft-n-max 3"; V="--spec-draft-vocab 65536"
SB="$B/kiln spec-bench -m $P/m/9b-mtp.gguf -npp 64 -ntg 128 -r 3"
for a in "" "$M --spec-draft-p-min 0 $V" "$M --spec-draft-p-min 0" "" "$M --spec-synth-len 3 $V" "$M --spec-draft-p-min 0 $V"; do
  echo "9b $a | $(timeout 60 $SB $a 2>$O/sb.err | grep -E '^\| (none|draft)')"; grep -h "draft:" $O/sb.err | tail -1 | sed 's/^.*draft:/  draft:/'
  cp $O/spec.txt $OUT/ 2>/dev/null
done > $O/spec.txt 2>&1
cp $O/spec.txt $OUT/
cat $O/gpu.txt $O/tests.txt $O/spec.txt; echo "total $(( $(date +%s) - S )) s"
