#!/usr/bin/env bash
# Device run 49 (session 8), call 1 of 3: kiln (this session's final code) and llama.cpp into /tmp/p (kept
# for calls 2-3 on the same warm machine). The two qwen3 q4_0-cache fidelity rows outside the top-1
# bound at 1,016 positions, rescored at 4,064 (CHUNKS=32) to separate noise from a real gap; decode and
# prefill side by side on the 9B-shape 8-layer IQ4_XS file (pp512, pp2048, tg128), kiln with and without
# --batch-invariant.
R=$PWD; S=$(date +%s)
P=/tmp/p; mkdir -p $P $P/m
tar xJf .gpu-run/c1/bins.tar.xz -C $P && xz -dc .gpu-run/a/pride.txt.xz > $P/pride.txt
cat .gpu-run/a/llama-*.part-0* | xz -d | tar x -C $P
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu-run/a/gguf*.whl && export PYTHONPATH=/tmp/site
O=/tmp/o49; mkdir -p $O
( t0=$(date +%s); $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 -q -o $P/m/9b8.gguf; echo "gen $(( $(date +%s) - t0 )) s" > $O/gen.txt ) &
G=$!
ARCHS=qwen3 WEIGHTS="q4_k_m iq4_xs" KVS="q4_0 f16" CHUNKS=32 timeout 240 env LD_LIBRARY_PATH=$B:$LL scripts/gpu_fidelity.sh $B/kiln $LL $P/pride.txt $O/fid4k > $O/fidelity-4064.md 2>&1
echo "fidelity rc=$?"; grep -E "^\| qwen3|outside" $O/fidelity-4064.md
rm -f $O/fid4k/*.gguf $O/fid4k/*.kld
wait $G; cat $O/gen.txt
kb() { local n=$1; shift; timeout 150 $B/kiln bench -m $P/m/9b8.gguf -ngl all -fa on -p 512,2048 -n 128 -r 3 "$@" > $O/$n.md 2>&1; }
kb kiln-1; kb kiln-inv --batch-invariant
LD_LIBRARY_PATH=$LL timeout 200 $LL/llama-bench -m $P/m/9b8.gguf -ngl 99 -fa 1 -p 512,2048 -n 128 -r 3 > $O/llama.md 2> $O/llama.err
kb kiln-2
for f in kiln-1 kiln-inv llama kiln-2; do echo "$f: $(grep -E '\| +(pp512|pp2048|tg128) +\|' $O/$f.md | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}')"; done
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run49.tar.xz
