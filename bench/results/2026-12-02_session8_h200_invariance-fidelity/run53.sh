#!/usr/bin/env bash
# Device run 53 (session 8): the 27B-shape Q4_K_M (8 of its 64 layers) and the 35B-A3B-shape qwen35moe
# Q4_K_M (8 of its 40 layers) at this session's code, side by side with llama.cpp (the rows of
# bench/RESULTS.md's session 3 were at commit 67deeb0): pp512 and tg128, kiln before and after llama-bench.
R=$PWD; S=$(date +%s)
P=/tmp/p; mkdir -p $P $P/m
tar xJf .gpu-run/c1/bins.tar.xz -C $P && cat .gpu-run/a/llama-*.part-0* | xz -d | tar x -C $P
B=$P/.gpu/bin LL=$P/llama-cuda-sm90a; export LD_LIBRARY_PATH=$B
O=/tmp/o53; mkdir -p $O
t0=$(date +%s)
$B/kiln gguf gen --preset qwen35-27b --mix q4_k_m --n-layer 8 -q -t 8 -o $P/m/27b8.gguf &
$B/kiln gguf gen --preset qwen35moe-35b-a3b --mix q4_k_m --n-layer 8 -q -t 8 -o $P/m/moe8.gguf &
wait; echo "gen $(( $(date +%s) - t0 )) s"; ls -la $P/m
for f in 27b8 moe8; do
  kb() { timeout 120 $B/kiln bench -m $P/m/$f.gguf -ngl all -fa on -p 512 -n 128 -r 2 > $O/kiln-$f-$1.md 2>&1; }
  kb 1
  LD_LIBRARY_PATH=$LL timeout 150 $LL/llama-bench -m $P/m/$f.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 2 > $O/llama-$f.md 2> $O/llama-$f.err
  kb 2
  for g in kiln-$f-1 llama-$f kiln-$f-2; do echo "$g: $(grep -E '\| +(pp512|tg128) +\|' $O/$g.md | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}')"; done
  echo "$f done $(( $(date +%s) - S )) s"
done
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run53.tar.xz
