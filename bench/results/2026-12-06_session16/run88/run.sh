#!/usr/bin/env bash
# Device run 88 (session 16): the fidelity table (scripts/gpu_fidelity.sh: kiln on the GPU and llama.cpp's CUDA
# build vs the exact-weights base, every architecture x weight type x KV type, and partial offload) on the final code.
S=$(date +%s); I=.gpu-run/r88; P=/tmp/p9; mkdir -p $P
tar xJf $I/bins.tar.xz -C $P && xz -dc $I/pride.txt.xz > $P/pride.txt
mkdir -p $P/ll && cat .gpu-run/ll/llama-cuda-sm90a.tar.xz.part-0* | xz -d | tar x -C $P/ll
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $I/gguf*.whl && export PYTHONPATH=/tmp/site
B=$P/.gpu/bin LL=$P/ll/llama-cuda-sm90a; O=/tmp/o88; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $O/gpu.txt
timeout 500 env LD_LIBRARY_PATH=$B:$LL scripts/gpu_fidelity.sh $B/kiln $LL $P/pride.txt $O/fid > $O/fidelity.md 2>&1; echo "fidelity rc=$?"
rm -f $O/fid/*.gguf $O/fid/*.kld
cat $O/gpu.txt; tail -62 $O/fidelity.md
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run79.tar.xz
