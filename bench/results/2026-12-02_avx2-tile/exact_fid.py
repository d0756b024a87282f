# Fidelity rule vs the exact weights: kiln (KILN_CPU as set) and llama.cpp, each on the quantized file,
# against llama.cpp on the F32 file (same generated weights), over the harness's sequences.
import sys, pathlib, subprocess, json
sys.path.insert(0, "tests/py")
import numpy as np
import test_model_llamacpp as T
kiln = pathlib.Path("build/bin/kiln").resolve()
work = pathlib.Path("/tmp/avx2bench/fidx")
def gen(arch, wt):
    out = work / f"{arch}-{wt}.gguf"
    if not out.exists():
        subprocess.run([str(kiln), "gguf", "gen", "-q", "--preset", f"tiny-{arch}", "-o", str(out), *T.WEIGHTS[wt]], check=True)
    return out
print("| arch | weights | kiln vs exact: top-1 / mean KL | llama.cpp vs exact: top-1 / mean KL |")
print("| --- | --- | --- | --- |")
for arch in T.ARCHS:
    f32 = gen(arch, "F32")
    seqs = T.sequences(T.n_vocab_of(f32), seed=T.ARCHS.index(arch))
    exact = T.llama_logits(f32, seqs, "f16")
    for wt in ["Q8_0", "Q4_K", "Q4_0", "IQ4_XS-mix"]:
        p = gen(arch, wt)
        ref = T.llama_logits(p, seqs, "f16")
        got = T.kiln_logits(kiln, p, seqs, "f16", work / f"{arch}-{wt}.npy")
        kt, kk, _ = T.compare(exact, got)
        lt, lk, _ = T.compare(exact, ref)
        print(f"| {arch} | {wt} | {100*kt:.1f}% / {kk:.3e} | {100*lt:.1f}% / {lk:.3e} |", flush=True)
