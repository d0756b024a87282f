#!/usr/bin/env bash
# Device run 68 (session 11): llama.cpp's side of run 67 on the same warm machine and files (/tmp/p/m):
# llama-server draft-mtp rows (9B, 27B), llama-bench long-context prefill rows, and the trained MTP fixture
# (tests/fixtures/mtp-kjv) through both servers: greedy texts with and without draft-mtp, acceptance.
R=$PWD; S=$(date +%s); I=.gpu-run/r68
P=/tmp/p; LL=$P/llama-cuda-sm90a; B=$P/.gpu/bin
cat $I/llama-*.part-0* | xz -d | tar x -C $P
O=/tmp/o68; mkdir -p $O
ls $P/m $B | head -30
F=tests/fixtures/mtp-kjv/model.gguf
{
for e in kiln llama; do
  if [ $e = kiln ]; then SV="env LD_LIBRARY_PATH=$B $B/kiln serve -m $F -ngl all -c 2048 --no-warmup"; else SV="env LD_LIBRARY_PATH=$LL $LL/llama-server -m $F -ngl 99 -c 2048"; fi
  echo "fixture $e plain : $(timeout 60 python3 $I/fix_client.py 8095 $O/fix-$e-plain.log -- $SV --port 8095)"
  echo "fixture $e mtp   : $(timeout 60 python3 $I/fix_client.py 8095 $O/fix-$e-mtp.log -- $SV --port 8095 --spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0)"
done
} 2>&1 | tee $O/fixture.txt
sed -i "s#/tmp/o/server#$O/server#; s#/tmp/o67/server#$O/server#" $I/spec_client.py
C="python3 $I/spec_client.py"
export LD_LIBRARY_PATH=$LL
for m in 9b 27b; do
  L="$LL/llama-server -m $P/m/$m-mtp.gguf -ngl 99 -fa on -c 4096 -np 1"
  run() { echo "$m $1 | llama: $(timeout 90 $C 8091 2 128 -- $L --port 8091 $2)"; }
  {
  run "plain        " ""
  run "mtp synth 2  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 2"
  run "mtp synth 3  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 3"
  run "mtp synth 4  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 4"
  run "mtp real p0  " "--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0"
  } 2>&1 | tee -a $O/spec.txt
done
row() { grep -E '\| +(pp[0-9]+|tg[0-9]+)' $1 | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}'; }
lb() { local tag=$1; shift; timeout 120 "$@" > $O/$tag.md 2> $O/$tag.err; echo "$tag: $(row $O/$tag.md)"; }
{
lb l9-f16 $LL/llama-bench -m $P/m/9b-mtp.gguf -ngl 99 -fa 1 -p 512 -n 0 -d 32768 -r 2
lb l9-q4 $LL/llama-bench -m $P/m/9b-mtp.gguf -ngl 99 -fa 1 -p 512 -n 0 -d 32768 -r 2 -ctk q4_0 -ctv q4_0
lb l9-long $LL/llama-bench -m $P/m/9b-mtp.gguf -ngl 99 -fa 1 -p 8192,32768 -n 0 -r 1
lb l27-q4 $LL/llama-bench -m $P/m/27b-mtp.gguf -ngl 99 -fa 1 -p 512 -n 0 -d 32768 -r 2 -ctk q4_0 -ctv q4_0
} 2>&1 | tee $O/bench.txt
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run68.tar.xz
