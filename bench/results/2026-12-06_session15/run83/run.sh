#!/usr/bin/env bash
# Device run 83 (session 15), first call: GPU tests at 4399cd2 (test_cuda_mtp has the draft-vocabulary case, never
# run on a GPU before); spec-bench 9B and 27B with the draft head at all 248,320 ids vs the first 65,536
# (--spec-draft-vocab), plain / zero acceptance / synth-len 3 / 4. Files and projectors stay in /tmp/p/m for the
# next calls (if they land on the same warm machine).
S=$(date +%s); P=/tmp/p; O=/tmp/o83; mkdir -p $O $P/m; I=.gpu-run/r83
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf; cp $I/*.py /tmp/
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader > $O/gpu.txt
G="$B/kiln gguf gen --vocab $P/vocab.gguf -q"
$G --preset qwen35-9b --mix iq4_xs --mtp --fast -t 8 -o $P/m/9b-mtp.gguf & G9=$!
( $B/kiln gguf gen --mmproj --preset qwen35-9b -q -t 1 -o $P/m/mm9b.gguf; $B/kiln gguf gen --mmproj --preset qwen35-27b -q -t 1 -o $P/m/mm27b.gguf ) &
( sleep 20; $G --preset qwen35-27b --mix q4_k_m --mtp --fast -t 6 -o $P/m/27b-mtp.gguf ) &
( for t in test_cuda_matmul test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend test_cuda_model test_cuda_seq; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt )
wait $G9; echo "9b + tests $(( $(date +%s) - S )) s" >> $O/tests.txt
KILN_CUDA_PROFILE=1 timeout 60 $B/kiln bench -m $P/m/9b-mtp.gguf -ngl all -p 0 -n 16 -r 1 > $O/profile-9b.md 2>&1
M="--spec-type draft-mtp --spec-draft-n-max 3"
for m in 9b; do
  r=3; [ $m = 27b ] && r=2
  SB="$B/kiln spec-bench -m $P/m/$m-mtp.gguf -npp 64 -ntg 128 -r $r"
  for a in "" "$M --spec-draft-p-min 0" "$M --spec-synth-len 3" "$M --spec-synth-len 4" \
           "$M --spec-draft-p-min 0 --spec-draft-vocab 65536" "$M --spec-synth-len 3 --spec-draft-vocab 65536" "$M --spec-synth-len 4 --spec-draft-vocab 65536" ""; do
    [ $(( $(date +%s) - S )) -gt 540 ] && { echo "$m $a | skipped: time"; continue; }
    echo "$m $a | $(timeout 60 $SB $a 2>$O/sb.err | grep -E '^\| (none|draft)')"; grep -h "draft:" $O/sb.err | tail -1 | sed 's/^.*draft:/  draft:/'
  done
done > $O/spec.txt 2>&1
wait; echo "all files $(( $(date +%s) - S )) s" >> $O/tests.txt; ls -la $P/m > $O/files.txt
cat $O/gpu.txt $O/tests.txt; grep -B2 -A8 "Failure" $O/test_cuda_*.log | head -30; cat $O/spec.txt; grep -A6 "CUDA op times" $O/profile-9b.md
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run83.tar.xz
