#!/usr/bin/env python3
"""Trains a small Qwen3.5 (qwen35: Gated-DeltaNet + gated full attention) language model WITH its MTP
("nextn") block on public-domain text and writes it as a GGUF in llama.cpp's layout: the fixture of
issue 16's "real acceptance" proof (tests/py/test_mtp_fixture.py; docs/engine.md, speculative decoding).

Training text: the King James Version of the Bible (1611), as Debian's package `bible-kjv-text`
(apt-get install bible-kjv-text; its `bible` program prints the text). The KJV is in the public
domain (outside the United Kingdom, where the Crown's letters patent apply; the package's copyright
file: "The copyright for the King James Version text of the Bible is expired since the translation
was done in 1611"). The text is read with `bible -l100000 gen1:1-rev22:21`, one verse a line, the
verse numbers and chapter headings dropped (about 4.3 MB).

Tokenizer: byte-level BPE (GPT-2's byte <-> unicode map, hf_fixtures.bytes_to_unicode), merges learned
here on the text, pre-tokenized with Qwen2's regex (the GGUF says tokenizer.ggml.pre = "qwen2", so
kiln / llama.cpp split text the same way); 256 bytes + N_VOCAB - 259 merges + 3 control tokens.

Model: transformers' Qwen3_5ForCausalLM (the trunk; layer types linear / full attention) plus an MTP
module in torch with HF's checkpoint names (mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden,
mtp.layers.0.* = one HF Qwen3_5DecoderLayer of full attention, mtp.norm) computing exactly kiln's
src/model/mtp.cpp (= llama.cpp's graph_mtp): for the token x_p at position p and h_{p-1}, the trunk's
hidden state of the token before it AFTER the final norm (zeros for p = 0),
    u = fc([RMSNorm(e(x_p)) * enorm ; RMSNorm(h_{p-1}) * hnorm]);  u = DecoderLayer(u) (causal, RoPE at p)
    logits = lm_head(RMSNorm(u) * mtp.norm)                        (the trunk's own lm_head, shared)
These logits predict x_{p+1}, the token two after the one h_{p-1} belongs to. Loss: the trunk's
next-token cross entropy + MTP_WEIGHT * the MTP's (gradients of both reach the shared parts).

GGUF: hf_fixtures.convert (llama.cpp's convert_hf_to_gguf conventions, extended there for mtp.*:
blk.<n_layer>.nextn.{eh_proj,enorm,hnorm,shared_head_norm}, the block's attention / FFN as
blk.<n_layer>.*, block_count = n_layer + 1, qwen35.nextn_predict_layers = 1), matrices F16 (1-D
tensors and ssm_conv1d F32, as llama.cpp's converter does). Outputs in --out:
    model.gguf           the fixture
    meta.json            config, training log, final losses, the reference token sequence
    ref_logits.npz       torch's trunk and MTP logits of that sequence, with the F16-rounded weights
                         (what the GGUF holds), for tests/py/test_mtp_fixture.py

Deterministic: seeded (torch, numpy; deterministic algorithms); two runs with the same torch build
on the same machine wrote the same file. The committed fixture: the defaults (4 layers, hidden 128,
250 steps of 16 x 128 tokens, 512k tokens seen, lr 4e-3 cosine), 1.37M parameters, 2.7 MB;
training took 17 minutes on 2 CPU threads of a box shared with compilers (1.5 s/step unloaded);
meta.json holds the log. It runs on CUDA too (default when available; --device, --text for a machine
without the `bible` program: --save-text writes its output here first); a GPU can afford more
(e.g. --batch 64 --seq 256 --steps 2000) but writes a different file.

  python3 scripts/train_mtp_fixture.py --out tests/fixtures/mtp-kjv
  (needs torch, transformers 5.x (5.25 made the fixture), numpy, regex, gguf; the text from `bible-kjv-text`)
"""
import argparse
import json
import math
import pathlib
import shutil
import subprocess
import sys
import time

import os

import numpy as np

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_fixtures as hf  # noqa: E402

N_VOCAB = 1024
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer (llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2)
QWEN2_PAT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
CONFIG = dict(vocab_size=N_VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=len(LAYER_TYPES),
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
              max_position_embeddings=4096, tie_word_embeddings=False, layer_types=LAYER_TYPES,
              full_attention_interval=2,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                               "mrope_section": [3, 3, 2], "mrope_interleaved": True},
              linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
              linear_num_key_heads=2, linear_num_value_heads=4,
              bos_token_id=N_VOCAB - 3, eos_token_id=N_VOCAB - 1, pad_token_id=None,
              mtp_num_hidden_layers=1)
MTP_WEIGHT = 0.5
HOLDOUT = 2000  # last verses (Revelation ...): validation only


# ---------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------
def kjv_raw(text_file=None) -> str:
    """`bible`'s output (or a saved copy of it: --text, for a machine without the package)."""
    if text_file is not None:
        return pathlib.Path(text_file).read_text()
    if shutil.which("bible") is None:
        sys.exit("the `bible` program is missing: apt-get install bible-kjv-text (or pass --text)")
    return subprocess.run(["bible", "-l100000", "gen1:1-rev22:21"], capture_output=True, text=True,
                          check=True).stdout


def kjv_verses(text_file=None) -> list[str]:
    out = kjv_raw(text_file)
    verses = []
    for line in out.splitlines():
        s = line.strip()
        if not line.startswith(" ") or not s:  # chapter headings ("Genesis 1") and blank lines
            continue
        num, _, text = s.partition(" ")
        assert num.isdigit(), line
        verses.append(" ".join(text.split()))
    assert len(verses) == 31102, len(verses)  # the KJV's verse count
    return verses


# ---------------------------------------------------------------------------------------------
# byte-level BPE: training (merges) and encoding (llama.cpp's rank order)
# ---------------------------------------------------------------------------------------------
def pretokenize(text: str) -> list[str]:
    import regex

    b2u = hf.bytes_to_unicode()
    return ["".join(b2u[b] for b in m.encode("utf-8")) for m in regex.findall(QWEN2_PAT, text)]


def train_bpe(text: str, n_merges: int) -> list[tuple[str, str]]:
    """Classic BPE on word types: merge the most frequent adjacent pair (ties: the smallest pair)."""
    from collections import Counter, defaultdict

    counts = Counter(pretokenize(text))
    words = [list(w) for w in counts]
    freq = [counts[w] for w in counts]
    pairs = Counter()
    where = defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[a, b] += freq[i]
            where[a, b].add(i)
    merges = []
    while len(merges) < n_merges and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], tuple(-ord(c) for c in kv[0][0] + "\0" + kv[0][1])))[0]
        if pairs[best] <= 0:
            break
        merges.append(best)
        a, b = best
        for i in list(where[best]):
            w = words[i]
            for x, y in zip(w, w[1:]):  # remove this word's pairs
                pairs[x, y] -= freq[i]
                if pairs[x, y] == 0:
                    del pairs[x, y]
            j, nw = 0, []
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(a + b)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            words[i] = nw
            for x, y in zip(nw, nw[1:]):
                pairs[x, y] += freq[i]
                where[x, y].add(i)
        del where[best]
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.ranks = {p: i for i, p in enumerate(merges)}
        b2u = hf.bytes_to_unicode()
        self.tokens = [b2u[i] for i in range(256)] + [a + b for a, b in merges] + SPECIALS
        assert len(set(self.tokens)) == len(self.tokens), "duplicate token"
        self.id = {t: i for i, t in enumerate(self.tokens)}
        self.cache = {}

    def bpe(self, word: str) -> list[int]:
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            r = [(self.ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(r)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids = [self.id[p] for p in parts]
        self.cache[word] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        return [t for w in pretokenize(text) for t in self.bpe(w)]

    def decode(self, ids) -> str:
        u2b = {u: b for b, u in hf.bytes_to_unicode().items()}
        return bytes(u2b[c] for i in ids for c in self.tokens[i]).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# model: HF trunk + MTP module (HF checkpoint names)
# ---------------------------------------------------------------------------------------------
def build(seed: int, device):
    import torch
    import torch.nn as nn
    import transformers
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

    cfg_kwargs = {k: v for k, v in CONFIG.items() if k != "full_attention_interval"}
    config = transformers.Qwen3_5TextConfig(**cfg_kwargs)
    config._attn_implementation = "sdpa"  # attention_mask=None: causal (is_causal)
    torch.manual_seed(seed)
    model = transformers.Qwen3_5ForCausalLM(config)
    full_idx = LAYER_TYPES.index("full_attention")

    class MTP(nn.Module):
        def __init__(self):
            super().__init__()
            E = config.hidden_size
            self.fc = nn.Linear(2 * E, E, bias=False)
            self.pre_fc_norm_embedding = mq.Qwen3_5RMSNorm(E, eps=config.rms_norm_eps)
            self.pre_fc_norm_hidden = mq.Qwen3_5RMSNorm(E, eps=config.rms_norm_eps)
            self.layers = nn.ModuleList([mq.Qwen3_5DecoderLayer(config, full_idx)])  # a full-attention layer
            self.norm = mq.Qwen3_5RMSNorm(E, eps=config.rms_norm_eps)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = model
            self.mtp = MTP()

        def forward(self, ids):
            """ids [B, T] -> (trunk logits, MTP logits), both [B, T, V]; row p of both predicts ids[:, p+1]."""
            tm = self.trunk.model
            h = tm(input_ids=ids).last_hidden_state  # after the final norm (llama.cpp's t_h_nextn)
            logits = self.trunk.lm_head(h)
            e = tm.embed_tokens(ids)
            hprev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
            u = self.mtp.fc(torch.cat([self.mtp.pre_fc_norm_embedding(e), self.mtp.pre_fc_norm_hidden(hprev)], -1))
            pos = torch.arange(ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
            pe = tm.rotary_emb(u, pos)
            u = self.mtp.layers[0](u, position_embeddings=pe, attention_mask=None)
            mlogits = self.trunk.lm_head(self.mtp.norm(u))
            return logits, mlogits

    m = Model()
    with torch.no_grad():  # HF's init for the MTP block too (normal 0.02, zero-centered norms at 0)
        for mod in m.mtp.modules():
            model._init_weights(mod)
    return m.to(device), config


def state_dict_hf(m) -> dict:
    """HF checkpoint names: model.*, lm_head.weight, mtp.*"""
    sd = {}
    for k, v in m.state_dict().items():
        k = k[len("trunk."):] if k.startswith("trunk.") else k
        sd[k] = v.detach().float().cpu().numpy()
    return sd


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------
def batches(stream: np.ndarray, rng, n_batch: int, seq: int):
    starts = rng.integers(0, len(stream) - seq - 1, n_batch)
    return np.stack([stream[s:s + seq + 1] for s in starts])


def train(args):
    import torch
    import torch.nn.functional as F

    t_start = time.time()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    np_rng = np.random.default_rng(args.seed)
    verses = kjv_verses(args.text)
    train_text = "\n".join(verses[:-HOLDOUT]) + "\n"
    val_text = "\n".join(verses[-HOLDOUT:]) + "\n"
    t0 = time.time()
    merges = train_bpe(train_text, N_VOCAB - 256 - len(SPECIALS))
    tok = Tokenizer(merges)
    assert len(tok.tokens) == N_VOCAB, len(tok.tokens)
    train_ids = np.array(tok.encode(train_text), dtype=np.int64)
    val_ids = np.array(tok.encode(val_text), dtype=np.int64)
    print(f"text: {len(verses)} verses, {len(train_text)} + {len(val_text)} chars -> {len(train_ids)} + "
          f"{len(val_ids)} tokens ({len(train_text) / len(train_ids):.2f} chars/token); BPE {time.time() - t0:.0f} s",
          flush=True)

    m, config = build(args.seed, device)
    n_params = sum(p.numel() for p in m.parameters())
    print(f"model: {n_params} parameters on {device} (torch {torch.__version__})", flush=True)
    decay = [p for n, p in m.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in m.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    warm = max(1, args.steps // 20)

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm))))

    def losses(x):
        ids = torch.from_numpy(x).to(device)
        logits, mlogits = m(ids[:, :-1])
        V = logits.shape[-1]
        lt = F.cross_entropy(logits.reshape(-1, V).float(), ids[:, 1:].reshape(-1))
        lm = F.cross_entropy(mlogits.reshape(-1, V).float(), ids[:, 1:].reshape(-1))
        return lt, lm

    def evaluate():
        m.eval()
        rng = np.random.default_rng(12345)
        with torch.no_grad():
            r = [losses(batches(val_ids, rng, args.batch, args.seq)) for _ in range(4)]
        m.train()
        return float(np.mean([a.item() for a, _ in r])), float(np.mean([b.item() for _, b in r]))

    log = []
    m.train()
    t0 = time.time()
    ema = None
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        lt, lm = losses(batches(train_ids, np_rng, args.batch, args.seq))
        loss = lt + MTP_WEIGHT * lm
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        cur = (lt.item(), lm.item())
        ema = cur if ema is None else tuple(0.95 * a + 0.05 * b for a, b in zip(ema, cur))
        if step % 10 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step:5d}/{args.steps} lr {lr_at(step):.2e} trunk {ema[0]:.3f} mtp {ema[1]:.3f} "
                  f"({el:.0f} s, {el / (step + 1):.2f} s/step)", flush=True)
        if step % 100 == 0 or step == args.steps - 1:
            vt, vm = evaluate()
            log.append({"step": step, "train_trunk": ema[0], "train_mtp": ema[1], "val_trunk": vt, "val_mtp": vm})
            print(f"  val: trunk {vt:.3f} mtp {vm:.3f}", flush=True)
    train_s = time.time() - t0
    return m, config, tok, merges, log, train_s, time.time() - t_start, str(device), train_ids, verses


def greedy(m, ids, n):
    """Greedy trunk continuation (full recompute; for the log only)."""
    import torch

    x = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits, _ = m(torch.tensor([x], device=next(m.parameters()).device))
            x.append(int(logits[0, -1].argmax()))
    return x[len(ids):]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--seed", type=int, default=1611)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    ap.add_argument("--text", type=pathlib.Path, help="a saved copy of `bible -l100000 gen1:1-rev22:21`'s output")
    ap.add_argument("--save-text", type=pathlib.Path, help="write `bible`'s output there and stop")
    args = ap.parse_args()
    if args.save_text:
        args.save_text.write_text(kjv_raw())
        return 0

    import torch

    torch.manual_seed(args.seed)
    m, config, tok, merges, log, train_s, total_s, device, train_ids, verses = train(args)
    m = m.cpu().float().eval()
    sd = state_dict_hf(m)
    cfg = config.to_dict()
    cfg["full_attention_interval"] = CONFIG["full_attention_interval"]
    vocab = (tok.tokens, [1] * (N_VOCAB - len(SPECIALS)) + [3] * len(SPECIALS), [f"{a} {b}" for a, b in merges])
    args.out.mkdir(parents=True, exist_ok=True)
    gguf_path = args.out / "model.gguf"
    tensors = hf.convert("qwen35", cfg, sd, gguf_path, vocab=vocab, ftype="f16",
                         name="kiln qwen35 MTP fixture (KJV)")
    # Reference logits with the weights as the GGUF holds them (F16-rounded matrices): load them back.
    with torch.no_grad():
        for k, p in m.named_parameters():
            if p.ndim >= 2 and "conv1d" not in k:  # hf.f16_in_gguf's matrices (conv1d stays F32)
                p.copy_(p.half().float())
    ref_text = verses[0] + "\n" + verses[1] + "\n"
    ref_ids = tok.encode(ref_text)
    with torch.no_grad():
        lt, lm = m(torch.tensor([ref_ids]))
    np.savez_compressed(args.out / "ref_logits.npz", trunk=lt[0].numpy().astype(np.float32),
                        mtp=lm[0].numpy().astype(np.float32), tokens=np.array(ref_ids, dtype=np.int32))
    prompt = tok.encode("In the beginning God created")
    cont = tok.decode(greedy(m, prompt, 24))
    print("greedy after 'In the beginning God created':", repr(cont), flush=True)
    meta = {
        "source": "King James Version (1611, public domain), Debian package bible-kjv-text",
        "config": {k: cfg[k] for k in sorted(CONFIG) if k in cfg},
        "n_params": int(sum(v.size for v in sd.values())),
        "args": {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items()},
        "device": device, "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "train_tokens_seen": args.steps * args.batch * args.seq, "train_stream_tokens": int(len(train_ids)),
        "train_seconds": round(train_s, 1), "total_seconds": round(total_s, 1), "mtp_weight": MTP_WEIGHT,
        "log": log, "final": log[-1], "greedy_in_the_beginning": cont,
        "ref_text": ref_text, "gguf_bytes": gguf_path.stat().st_size, "n_tensors": len(tensors),
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {gguf_path} ({gguf_path.stat().st_size} bytes, {len(tensors)} tensors); "
          f"training {train_s:.0f} s, total {total_s:.0f} s; final {log[-1]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
