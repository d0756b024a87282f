#!/usr/bin/env bash
# Device run 74 (session 12): the KV-only MTP catch-up — test_cuda_mtp / test_cuda_spec, then spec-bench
# plain / zero acceptance / synth-len 3 on the 9B (as run 71).
S=$(date +%s); P=/tmp/p; O=/tmp/o74; mkdir -p $O $P/m; I=.gpu-run/r74
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
for t in test_cuda_mtp test_cuda_spec; do timeout 60 $B/$t --gtest_brief=1 > $O/$t.log 2>&1; echo "$t rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"; done | tee $O/tests.txt
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp --vocab $P/vocab.gguf --fast -q -t 12 -o $P/m/9b-mtp.gguf
SB9="$B/kiln spec-bench -m $P/m/9b-mtp.gguf -npp 64 -ntg 128 -r 3"; M="--spec-type draft-mtp --spec-draft-n-max 3"
for a in "" "$M --spec-draft-p-min 0" "$M --spec-synth-len 3"; do
  echo "9b $a | $(timeout 40 $SB9 $a 2>$O/sb.err | grep -E '^\| (none|draft)')"; grep -h "draft:" $O/sb.err | tail -1 | sed 's/^.*draft:/  draft:/'
done | tee $O/spec.txt
echo "total $(( $(date +%s) - S )) s"; cp -r $O $OUT/
