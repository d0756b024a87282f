#!/usr/bin/env bash
# Device run 71 (session 12): (1) GPU tests after the plan's CUDA-context line and the probe back-off;
# (2) the 8 GiB cap (9B + MTP + projector, 64K q8_0) under the new plan: an image and a 64K prompt, peak vs plan;
# (3) the 24 GiB cap (27B + MTP + projector, q4_0, -c left to fitting: the largest context with every layer): an image and
#     a prompt filling that context;
# (4) spec-bench through the engine: plain, draft-mtp synth-len 2/3/4 and zero acceptance (9B), plain/3/zero (27B).
R=$PWD; S=$(date +%s); I=.gpu-run/r71
P=/tmp/p; mkdir -p $P $P/m
tar xJf $I/bins.tar.xz -C $P && xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
O=/tmp/o71; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader > $O/gpu.txt
( for t in test_cuda_backend test_cuda_model test_cuda_mtp test_cuda_spec; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt ) &
T=$!
t0=$(date +%s)
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp --vocab $P/vocab.gguf --fast -q -t 4 -o $P/m/9b-mtp.gguf &
$B/kiln gguf gen --preset qwen35-27b --mix q4_k_m --mtp --vocab $P/vocab.gguf --fast -q -t 4 -o $P/m/27b-mtp.gguf &
$B/kiln gguf gen --mmproj --preset qwen35-9b -q -t 2 -o $P/m/mm9b.gguf &
$B/kiln gguf gen --mmproj --preset qwen35-27b -q -t 2 -o $P/m/mm27b.gguf &
wait $(jobs -p | grep -v "^$T$") 2>/dev/null; echo "gen $(( $(date +%s) - t0 )) s"
wait $T; cat $O/tests.txt; grep -B2 -A6 "Failure" $O/test_cuda_*.log | head -30
capped() {  # tag model mmproj cap ctx ctype n_prompt timeout
  local tag=$1; base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $O/mem-$tag.csv & local MP=$!
  timeout $(( $8 + 90 )) $B/kiln serve -m $2 --mmproj $3 -c $5 -ctk $6 -ctv $6 --spec-type draft-mtp --device-memory $4 --port 8092 > $O/kiln-$tag.log 2>&1 &
  local KS=$!
  for i in $(seq 240); do curl -sf localhost:8092/health > /dev/null && break; sleep 0.5; done
  echo "$tag idle: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  timeout 100 python3 $I/img_client.py 8092 >> $O/stages.txt 2>&1
  echo "$tag after image: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  timeout $(( $8 + 5 )) python3 $I/long_client.py 8092 $7 $8 >> $O/stages.txt 2>&1
  echo "$tag after prompt: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/stages.txt
  kill $KS; wait $KS 2>/dev/null; kill $MP; sleep 1
  echo "$tag: baseline $base MiB, peak $(sort -n $O/mem-$tag.csv | tail -1) MiB; $(grep -E 'the plan needs' $O/kiln-$tag.log | sed 's/^ *//')" >> $O/stages.txt
  grep -E "layers|prompt eval|eval time|draft:" $O/kiln-$tag.log | head -6 >> $O/stages.txt
}
capped 8g $P/m/9b-mtp.gguf $P/m/mm9b.gguf 8GiB 65536 q8_0 64000 60
capped 24g $P/m/27b-mtp.gguf $P/m/mm27b.gguf 24GiB 0 q4_0 0 230
SB9="$B/kiln spec-bench -m $P/m/9b-mtp.gguf -npp 64 -ntg 128 -r 3"
SB27="$B/kiln spec-bench -m $P/m/27b-mtp.gguf -npp 64 -ntg 128 -r 2"
M="--spec-type draft-mtp --spec-draft-n-max 3"
{
for a in "" "$M --spec-synth-len 2" "$M --spec-synth-len 3" "$M --spec-synth-len 4" "$M --spec-draft-p-min 0"; do
  echo "9b  $a | $(timeout 60 $SB9 $a 2>$O/sb.err | grep -E '^\| (none|draft)' )"; grep -h "draft:" $O/sb.err | tail -1 | sed 's/^.*draft:/  draft:/'
done
for a in "" "$M --spec-synth-len 3" "$M --spec-draft-p-min 0"; do
  echo "27b $a | $(timeout 80 $SB27 $a 2>$O/sb.err | grep -E '^\| (none|draft)' )"; grep -h "draft:" $O/sb.err | tail -1 | sed 's/^.*draft:/  draft:/'
done
} > $O/spec.txt 2>&1
echo "total $(( $(date +%s) - S )) s" >> $O/stages.txt
tar cf - -C $O . | xz -T8 > $OUT/run71.tar.xz
cat $O/gpu.txt $O/stages.txt $O/spec.txt
