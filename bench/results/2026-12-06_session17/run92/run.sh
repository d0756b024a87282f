#!/usr/bin/env bash
# Device run 92 (session 17; carry .gpu-run/r86 .gpu-run/r92 .gpu-run/r93 with tests/fixtures and bench/results aside):
# the GPU tests of main (D = 81ec164, the mtp_rows helper) and of branch mtp-step-inputs rebased on it (E = 3a6ed4e),
# then spec-bench 9B with three binaries alternating on one machine: A = f95fe87 (per-step catch-up; run 86's pack),
# D, E — plain, zero acceptance and synth-len 3 with the 65,536-id head, -r 8, rounds until 500 s.
S=$(date +%s); P=/tmp/p; O=/tmp/o92; mkdir -p $O $P/m $P/A $P/D $P/E
tar xJf .gpu-run/r86/bins.tar.xz -C $P/A; tar xJf .gpu-run/r92/bins.tar.xz -C $P/D; tar xJf .gpu-run/r93/bins.tar.xz -C $P/E
xz -dc .gpu-run/r86/vocab-qwen35.gguf.xz > $P/vocab.gguf
D=$P/D/.gpu/bin
[ -s $P/m/9b-mtp.gguf ] || LD_LIBRARY_PATH=$D $D/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 10 -o $P/m/9b-mtp.gguf &
GEN=$!
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $O/ab.txt
for b in D E; do for t in test_cuda_mtp test_cuda_spec test_cuda_model; do
  B=$P/$b/.gpu/bin; s0=$(date +%s); LD_LIBRARY_PATH=$B timeout 120 $B/$t --gtest_brief=1 > $O/$b-$t.log 2>&1
  echo "$b $t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$b-$t.log | tr '\n' ' ')" >> $O/ab.txt
done; done
grep -h -B2 -A6 "Failure" $O/*test_cuda_*.log | head -30 >> $O/ab.txt; cp $O/ab.txt $O/*.log $OUT/
wait $GEN; echo "file ready $(( $(date +%s) - S )) s" >> $O/ab.txt
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536"
for r in 1 2 3 4 5; do for a in "" "$M --spec-draft-p-min 0" "$M --spec-synth-len 3"; do for b in A D E; do
  [ $(( $(date +%s) - S )) -gt 500 ] && break 3
  B=$P/$b/.gpu/bin
  echo "$b r$r $a | $(LD_LIBRARY_PATH=$B timeout 40 $B/kiln spec-bench -m $P/m/9b-mtp.gguf -npp 64 -ntg 128 -r 8 $a 2>$O/sb.err | grep -E '^\| (none|draft)') $(grep -h 'draft:' $O/sb.err | tail -1 | sed 's/^.*draft:/draft:/')" >> $O/ab.txt
  cp $O/ab.txt $OUT/
done; done; done
cat $O/ab.txt; echo "total $(( $(date +%s) - S )) s"
