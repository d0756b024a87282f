#!/usr/bin/env bash
# Device run 90 (session 16): A/B of the deferred MTP catch-up, same machine, alternating binaries —
# A = f95fe87 (per-step catch-up; run 86's pack), B = 9cf047e (deferred; run 89's pack): spec-bench 9B
# plain, zero acceptance and synth-len 3 with the 65,536-id head, -r 8, three rounds.
S=$(date +%s); P=/tmp/p; O=/tmp/o90; mkdir -p $O $P/m $P/A $P/B
tar xJf .gpu-run/r86/bins.tar.xz -C $P/A; tar xJf .gpu-run/r89/bins.tar.xz -C $P/B
xz -dc .gpu-run/r89/vocab-qwen35.gguf.xz > $P/vocab.gguf
[ -s $P/m/9b-mtp.gguf ] || LD_LIBRARY_PATH=$P/B/.gpu/bin $P/B/.gpu/bin/kiln gguf gen --vocab $P/vocab.gguf -q --preset qwen35-9b --mix iq4_xs --mtp --fast -t 14 -o $P/m/9b-mtp.gguf
echo "file ready $(( $(date +%s) - S )) s" > $O/ab.txt
M="--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-vocab 65536"
for r in 1 2 3; do for a in "" "$M --spec-draft-p-min 0" "$M --spec-synth-len 3"; do for b in A B; do
  [ $(( $(date +%s) - S )) -gt 200 ] && break 3
  B=$P/$b/.gpu/bin
  echo "$b r$r $a | $(LD_LIBRARY_PATH=$B timeout 40 $B/kiln spec-bench -m $P/m/9b-mtp.gguf -npp 64 -ntg 128 -r 8 $a 2>$O/sb.err | grep -E '^\| (none|draft)') $(grep -h 'draft:' $O/sb.err | tail -1 | sed 's/^.*draft:/draft:/')" >> $O/ab.txt
  cp $O/ab.txt $OUT/
done; done; done
cat $O/ab.txt; echo "total $(( $(date +%s) - S )) s"
