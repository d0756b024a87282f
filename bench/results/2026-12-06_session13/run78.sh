#!/usr/bin/env bash
# Device run 78 (session 13): the one-column bulk mat-vec with one 2-D tensor-map box per step for a warp's
# four rows (KILN_CUDA_MV_TMAP=0: the per-row bulk copies, same binary). GPU tests; tg128 A/B alternating
# (9B IQ4_XS, 27B Q4_K_M); kiln vs llama.cpp in the same run (tg128, pp512, pp2048); spec-bench (9B);
# device copy bandwidth (torch) for the roofline.
S=$(date +%s); P=/tmp/p; O=/tmp/o78; mkdir -p $O $P/m; I=.gpu-run/r78
tar xJf $I/bins.tar.xz -C $P && B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B
mkdir -p $P/ll && cat .gpu-run/ll/llama-cuda-sm90a.tar.xz.part-0* | xz -d | tar x -C $P/ll; LL=$P/ll/llama-cuda-sm90a
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader > $O/gpu.txt
xz -dc $I/vocab-qwen35.gguf.xz > $P/vocab.gguf
$B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --mtp --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/9b.gguf &
$B/kiln gguf gen --preset qwen35-27b --mix q4_k_m --vocab $P/vocab.gguf --fast -q -t 8 -o $P/m/27b.gguf &
( for t in test_cuda_matmul test_cuda_fused test_cuda_mtp test_cuda_spec test_cuda_backend test_cuda_model test_cuda_seq; do
    s0=$(date +%s); timeout 200 $B/$t --gtest_brief=1 > $O/$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
  done > $O/tests.txt )
wait; echo "gen+tests $(( $(date +%s) - S )) s"; ls -la $P/m > $O/files.txt
python3 - > $O/copy-bw.txt 2>&1 <<'PY'
import torch
a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
e0.record()
for _ in range(20): b.copy_(a)
e1.record(); torch.cuda.synchronize()
s = e0.elapsed_time(e1) / 1e3 / 20
print(f"copy {a.numel()/2**30:.0f} GiB: {2*a.numel()/s/1e12:.3f} TB/s (read+write)")
PY
for r in 1 2; do for v in 0 1; do for m in 9b 27b; do
  echo "tmap=$v $m r$r $(KILN_CUDA_MV_TMAP=$v timeout 60 $B/kiln bench -m $P/m/$m.gguf -ngl all -fa on -p 0 -n 128 -r 2 2>/dev/null | grep CUDA | awk -F'|' '{print $(NF-1)}')"
done; done; done > $O/tg-ab.txt
for m in 9b 27b; do
  timeout 90 $B/kiln bench -m $P/m/$m.gguf -ngl all -fa on -p 512,2048 -n 128 -r 2 -o json > $O/kiln-$m.json 2> $O/kiln-$m.err
  LD_LIBRARY_PATH=$LL timeout 120 $LL/llama-bench -m $P/m/$m.gguf -ngl 99 -fa 1 -p 512,2048 -n 128 -r 2 -o json > $O/llama-$m.json 2> $O/llama-$m.err
done
SB9="$B/kiln spec-bench -m $P/m/9b.gguf -npp 64 -ntg 128 -r 3"; M="--spec-type draft-mtp --spec-draft-n-max 3"
for a in "" "$M --spec-draft-p-min 0" "$M --spec-synth-len 3" "$M --spec-synth-len 4"; do
  echo "9b $a | $(timeout 40 $SB9 $a 2>$O/sb.err | grep -E '^\| (none|draft)')"; grep -h "draft:" $O/sb.err | tail -1 | sed 's/^.*draft:/  draft:/'
done > $O/spec.txt 2>&1
cat $O/gpu.txt $O/copy-bw.txt $O/tests.txt; grep -B2 -A8 "Failure" $O/test_cuda_*.log | head -30
sort -k2,2 -k1,1 $O/tg-ab.txt
python3 - $O <<'PY'
import json, sys, re
o = sys.argv[1]
bw = float(re.search(r"([0-9.]+) TB/s", open(f"{o}/copy-bw.txt").read()).group(1))  # copy rate, bytes read + written
for m in ("9b", "27b"):
    def load(e):
        t = open(f"{o}/{e}-{m}.json").read()
        return json.loads(t[t.index("["):])
    k, l = load("kiln"), load("llama")
    for rk, rl in zip(k, l):
        name = f"pp{rk['n_prompt']}" if rk["n_prompt"] else f"tg{rk['n_gen']}"
        extra = ""
        if rk["n_prompt"] == 0:
            extra = f"  {rk['avg_ts'] * rk['decode_weight_read_bytes'] / (bw * 1e12) * 100:.1f} % of the copy rate {bw:.2f} TB/s"
        print(f"{m} {name}: kiln {rk['avg_ts']:.1f}  llama {rl['avg_ts']:.1f}  ratio {rk['avg_ts'] / rl['avg_ts']:.2f}x{extra}")
PY
cat $O/spec.txt
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run78.tar.xz
