#!/usr/bin/env bash
# Device run 66 (session 10), sm_90a, kiln at 96e51d7 (the encoder's per-layer workspace columns, the last
# change before the end): test_cuda_model (CudaVision) and test_cuda_seq, and the image encode timings.
I=.gpu-run/o; P=/tmp/p; mkdir -p $P/m; tar xJf $I/bins.tar.xz -C $P
B=$P/.gpu/bin; export LD_LIBRARY_PATH=$B; O=/tmp/o66; mkdir -p $O
$B/kiln gguf gen --mmproj --preset qwen35-9b -q -t 8 -o $P/m/mm9b.gguf &
for t in test_cuda_model test_cuda_seq; do timeout 120 $B/$t --gtest_brief=1 > $O/$t.log 2>&1; echo "$t rc=$? $(grep -E '^\[  PASSED|^\[  FAILED' $O/$t.log | tr '\n' ' ')"; done | tee $O/tests.txt
grep -h "\[cuda-vision\]\|\[attn-enc\]" $O/*.log
wait
python3 -c "
import numpy as np, struct, zlib
for W,H in [(1024,768),(2048,2048)]:
    rgb=(np.random.default_rng(1).integers(0,255,(H,W,3))).astype(np.uint8); raw=b''.join(b'\0'+rgb[r].tobytes() for r in range(H))
    ch=lambda t,d: struct.pack('>I',len(d))+t+d+struct.pack('>I',zlib.crc32(t+d)&0xffffffff)
    open(f'$P/img-{W}x{H}.png','wb').write(b'\x89PNG\r\n\x1a\n'+ch(b'IHDR',struct.pack('>IIBBBBB',W,H,8,2,0,0,0))+ch(b'IDAT',zlib.compress(raw,1))+ch(b'IEND',b''))
"
timeout 60 $B/kiln image-embd --mmproj $P/m/mm9b.gguf --image $P/img-1024x768.png --image $P/img-2048x2048.png --repeat 3 > $O/kiln-gpu.txt 2>&1; grep -v "^I " $O/kiln-gpu.txt
tar cf - -C $O . | xz -T8 > $OUT/run66.tar.xz
