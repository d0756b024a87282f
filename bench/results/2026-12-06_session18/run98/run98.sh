#!/usr/bin/env bash
# Device run 98 (session 18): the fidelity table (scripts/gpu_fidelity.sh: kiln on the GPU and llama.cpp's CUDA
# build vs the exact-weights base, every architecture x weight type x KV type) with the chunked gated delta rule
# (kiln perplexity's delta_chunk_min 64) and the 7-CTA mat-vec. Carry .gpu-run/fid2 and fid's llama parts, whl, text.
S=$(date +%s); I=.gpu-run/fid; P=/tmp/p9; mkdir -p $P
tar xJf .gpu-run/fid2/bins.tar.xz -C $P && xz -dc $I/pride.txt.xz > $P/pride.txt
cat $I/llama-*.part-0* | xz -d | tar x -C $P
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $I/gguf*.whl && export PYTHONPATH=/tmp/site
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; O=/tmp/o98; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv,noheader > $O/gpu.txt
ARCHS="llama qwen35 qwen35moe" WEIGHTS="q4_k_m iq4_xs" KVS="f16 q8_0" timeout 300 env LD_LIBRARY_PATH=$B:$LL scripts/gpu_fidelity.sh $B/kiln $LL $P/pride.txt $O/fid > $O/fidelity.md 2>&1; echo "fidelity rc=$?"
rm -f $O/fid/*.gguf $O/fid/*.kld
cat $O/gpu.txt; cat $O/fidelity.md | tail -60
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run98.tar.xz
