#!/usr/bin/env bash
# Device run 68b: llama-server on the trained MTP fixture (run 68's llama rows failed: port still bound).
I=.gpu-run/r68b; P=/tmp/p; LL=$P/llama-cuda-sm90a; O=/tmp/o68b; mkdir -p $O
F=tests/fixtures/mtp-kjv/model.gguf
SV="env LD_LIBRARY_PATH=$LL $LL/llama-server -m $F -ngl 99 -c 2048"
echo "fixture llama plain : $(timeout 60 python3 $I/fix_client.py 8096 $O/fix-llama-plain.log -- $SV --port 8096)"
echo "fixture llama mtp   : $(timeout 60 python3 $I/fix_client.py 8097 $O/fix-llama-mtp.log -- $SV --port 8097 --spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0)"
tail -3 $O/fix-llama-mtp.log
tar cf - -C $O . | xz -T8 > $OUT/run68b.tar.xz
