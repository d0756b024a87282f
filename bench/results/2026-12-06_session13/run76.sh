#!/usr/bin/env bash
# Device run 76 (session 13): the bulk int8 mat-vec with two half-steps per ring slot, lane 0 issuing the
# copies, the x of the first half-step before the wait. A = the session's start (main fbe3b04 + KV catch-up,
# same decode code as main), B = this change. GPU tests of B; tg128 A/B alternating (9B IQ4_XS, 27B Q4_K_M);
# op-by-op profile of both (KILN_CUDA_PROFILE=1).
S=$(date +%s); P=/tmp/p; O=/tmp/o76; mkdir -p $O $P/m; I=.gpu-run/r76
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
xz -dc $I/kiln-old.xz > $B/kiln-old && chmod +x $B/kiln-old
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $O/gpu.txt
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/9b.gguf &
$B/kiln gguf gen --preset qwen35-27b --mix q4_k_m --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/27b.gguf &
( for t in test_cuda_matmul test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend test_cuda_model test_cuda_seq; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt )
wait; echo "gen+tests $(( $(date +%s) - S )) s"
for r in 1 2; do for v in kiln-old kiln; do
  for m in 9b 27b; do
    echo "$v $m r$r $(timeout 60 $B/$v bench -m $P/m/$m.gguf -ngl all -fa on -p 0 -n 128 -r 3 2>/dev/null | grep CUDA | awk -F'|' '{print $(NF-1)}')"
  done
done; done > $O/tg.txt
for v in kiln-old kiln; do
  KILN_CUDA_PROFILE=1 timeout 60 $B/$v bench -m $P/m/9b.gguf -ngl all -fa on -p 0 -n 8 -r 1 > $O/prof-$v.out 2> $O/prof-$v.err
done
SB9="$B/kiln spec-bench -m $P/m/9b.gguf -npp 64 -ntg 128 -r 3"; M="--spec-type draft-mtp --spec-draft-n-max 3"
for a in "" "$M --spec-draft-p-min 0" "$M --spec-synth-len 4"; do
  echo "9b $a | $(timeout 40 $SB9 $a 2>$O/sb.err | grep -E '^\| (none|draft)')"; grep -h "draft:" $O/sb.err | tail -1 | sed 's/^.*draft:/  draft:/'
done > $O/spec.txt 2>&1
cat $O/gpu.txt $O/tests.txt; grep -B2 -A8 "Failure" $O/test_cuda_*.log | head -30
cat $O/tg.txt $O/spec.txt
for v in kiln-old kiln; do echo "== $v"; cat $O/prof-$v.out $O/prof-$v.err | grep -A22 "CUDA op times" | head -24; done
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run76.tar.xz
