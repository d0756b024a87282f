# Ad hoc (bench/results/2026-12-06_session14/cpu-pp): kiln vs llama.cpp logits on qwen35-0.8b-shape files (S = 128: the fused delta-rule kernel;
# head_dim 256: the blocked attention), 2 sequences of 160 random tokens, prompt chunks of 64.
import subprocess, sys, numpy as np, llama_cpp
kiln = sys.argv[1]
for path in sys.argv[2:]:
    m = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=160, n_batch=160, n_threads=2, verbose=False,
                        flash_attn=True)
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, m.n_vocab(), 160).tolist() for _ in range(2)]
    ref = []
    for s in seqs:
        m.reset(); m.eval(s); ref.append(np.array(m.scores[:len(s)], dtype=np.float32))
    ref = np.concatenate(ref); del m
    toks = ";".join(",".join(map(str, s)) for s in seqs)
    r = subprocess.run([kiln, "logits", "-m", path, "--tokens", toks, "-o", "/tmp/fid08.npy", "-c", "160", "--chunk", "64",
                        "-t", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = np.load("/tmp/fid08.npy").astype(np.float32)
    same = float((ref == got).all(axis=1).mean())
    print(f"{path}: rows {len(ref)}, bit-identical rows {100*same:.1f}%, max abs diff {float(np.abs(ref-got).max()):.3g}, "
          f"top-1 agree {100*float((ref.argmax(1)==got.argmax(1)).mean()):.1f}%", flush=True)
