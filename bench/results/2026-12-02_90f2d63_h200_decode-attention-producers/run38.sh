#!/usr/bin/env bash
# Device run 38 (session 7): decode attention kernel (attention_decode.cu), wide x producers (SwiGLU over
# many blocks, add_rms_norm over a cluster), kiln bench -d (depth): all GPU tests; attention timings with
# the new kernel and KILN_CUDA_ATTN_DEC=0; tg128 at depth 0 / 8192 / 32768 vs llama-bench, A/B of both
# switches; SASS of the IQ4_XS int8 mat-vec and ncu's instruction mix of one launch.
R=$PWD
S=$(date +%s)
tar xJf .gpu-run/bins.tar.xz && tar xJf .gpu-run/llama-all.tar.xz && xz -dk .gpu-run/kq.cubin.xz
B=$R/.gpu/bin LL=$R/llama-cuda-sm90a
export LD_LIBRARY_PATH=$B
O=/tmp/o; mkdir -p $O; M=/tmp/m; mkdir -p $M
( t0=$(date +%s); $B/kiln gguf gen --preset qwen35-9b --mix iq4_xs --n-layer 8 -q -o $M/9b8.gguf; echo "gen $(( $(date +%s) - t0 )) s" > $O/gen.txt ) &
G=$!
for t in test_cuda_seq test_cuda_fused test_cuda_backend test_cuda_model test_cuda_matmul test_cuda_mtp test_cuda_spec; do
  s0=$(date +%s); timeout 150 $B/$t --gtest_brief=1 > $O/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s0 ))s $(grep -E '^\[  PASSED|^\[  SKIPPED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"
done
grep -B3 -A8 "Failure" $O/test_cuda_*.log | head -30
grep "^\[attn\].*batch 1" $O/test_cuda_seq.log | cut -c1-170 | head -20
KILN_CUDA_BENCH=1 timeout 60 $B/test_cuda_seq --gtest_filter='*Bench*' > $O/bench-seq.log 2>&1
KILN_CUDA_ATTN_DEC=0 KILN_CUDA_BENCH=1 timeout 60 $B/test_cuda_seq --gtest_filter='*Bench*' > $O/bench-seq-old.log 2>&1
echo "decode attention, new | old:"; paste <(grep "decode" $O/bench-seq.log | cut -c18-100) <(grep "decode" $O/bench-seq-old.log | cut -c60-100)
F=_ZN4kiln4cuda6detail16matvec_q8_kernelILNS_4gguf8GgmlTypeE23ELi1ELi8ELb1ELb1EEEvNS1_6MvArgsE
cuobjdump -sass -fun $F .gpu-run/kq.cubin > $O/sass-iq4xs-seg.txt 2>&1; wc -l $O/sass-iq4xs-seg.txt
wait $G; cat $O/gen.txt
bench() { timeout 150 $B/kiln bench -m $M/9b8.gguf -ngl all -fa on -p 0 -n 128 -d 0,8192,32768 -r 2 "$@" 2>&1; }
bench > $O/kiln-tg.md; KILN_CUDA_ATTN_DEC=0 bench > $O/kiln-tg-olddec.md; KILN_CUDA_PRODUCE_WIDE=0 bench > $O/kiln-tg-oldprod.md
bench > $O/kiln-tg-2.md
LD_LIBRARY_PATH=$LL timeout 150 $LL/llama-bench -m $M/9b8.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0,8192,32768 -r 2 > $O/llama-tg.md 2> $O/llama-tg.err
for f in kiln-tg kiln-tg-olddec kiln-tg-oldprod kiln-tg-2 llama-tg; do echo "$f: $(grep -E 'tg128' $O/$f.md | awk -F'|' '{printf "%s=%s  ", $(NF-2), $(NF-1)}')"; done
timeout 100 ncu --clock-control none --section InstructionStats --section WarpStateStats --section SourceCounters -k regex:matvec_q8 --launch-skip 40 --launch-count 3 --log-file $O/ncu-mv-inst.txt \
  $B/kiln bench -m $M/9b8.gguf -ngl all -fa on -p 0 -n 4 -r 1 > /dev/null 2>&1
echo "ncu rc=$?"; grep -E "matvec_q8_kernel<|Executed Instructions |Issued Instructions |Stall " $O/ncu-mv-inst.txt | head -30
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run38.tar.xz
