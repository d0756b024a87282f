#!/usr/bin/env bash
# Device run 90 (prepared in session 16; carry .gpu-run/r86 .gpu-run/r89 .gpu-run/r91 .gpu-run/r90 with tests/fixtures
# and bench/results moved aside): first the GPU tests of branch mtp-step-inputs (6b32ba8: the MTP indices in one
# upload, deferred steps without the embeddings), then spec-bench 9B with three binaries alternating on one machine:
# A = f95fe87 (per-step catch-up; run 86's pack), B = 9cf047e (deferred catch-up; run 89's), C = 6b32ba8 —
# plain, zero acceptance and synth-len 3 with the 65,536-id head, -r 8, rounds until 480 s.
S=$(date +%s); P=/tmp/p; O=/tmp/o90; mkdir -p $O $P/m $P/A $P/B $P/C
tar xJf .gpu-run/r86/bins.tar.xz -C $P/A; tar xJf .gpu-run/r89/bins.tar.xz -C $P/B; tar xJf .gpu-run/r91/bins.tar.xz -C $P/C
xz -dc .gpu-run/r89/vocab-qwen35.gguf.xz > $P/vocab.gguf
C=$P/C/.gpu/bin
[ -s $P/m/9b-mtp.gguf ] || LD_LIBRARY_PATH=$C $C/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 10 -o $P/m/9b-mtp.gguf &
GEN=$!
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/ab.txt
for t in test_cuda_mtp test_cuda_spec test_cuda_model; do
  s0=$(date +%s); LD_LIBRARY_PATH=$C timeout 120 $C/$t --gtest_brief=1 > $O/$t.log 2>&1
  echo "C $t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')" >> $O/ab.txt
done
grep -h -B2 -A6 "Failure" $O/test_cuda_*.log | head -30 >> $O/ab.txt; cp $O/ab.txt $OUT/
wait $GEN; echo "file ready $(( $(date +%s) - S )) s" >> $O/ab.txt
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536"
for r in 1 2 3 4; do for a in "" "$M --spec-draft-p-min 0" "$M --spec-synth-len 3"; do for b in A B C; do
  [ $(( $(date +%s) - S )) -gt 480 ] && break 3
  B=$P/$b/.gpu/bin
  echo "$b r$r $a | $(LD_LIBRARY_PATH=$B timeout 40 $B/kiln spec-bench -m $P/m/9b-mtp.gguf -npp 64 -ntg 128 -r 8 $a 2>$O/sb.err | grep -E '^\| (none|draft)') $(grep -h 'draft:' $O/sb.err | tail -1 | sed 's/^.*draft:/draft:/')" >> $O/ab.txt
  cp $O/ab.txt $OUT/
done; done; done
cat $O/ab.txt; echo "total $(( $(date +%s) - S )) s"
