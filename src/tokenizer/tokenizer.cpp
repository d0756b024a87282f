// tokenizer/tokenizer.cpp — BPE and SPM tokenization, special-token partitioning, detokenization.
// Behaviour follows llama.cpp's tokenizer (llama-vocab.cpp / unicode.cpp) as a specification;
// the code is our own. See docs/tokenizer.md.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/log.h"
#include "tokenizer/utf8.h"

namespace kiln::tokenizer {

namespace {

// ---------------------------------------------------------------------------------------------
// GPT-2 byte ⇄ unicode mapping: printable bytes map to themselves, the other 68 bytes to
// U+0100 + n in byte order.
struct ByteMap {
  std::array<uint32_t, 256> byte_to_cpt{};
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<uint32_t, uint8_t> cpt_to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cpt = printable ? uint32_t(b) : uint32_t(256 + n++);
      byte_to_cpt[b] = cpt;
      byte_to_utf8[b] = utf8_encode(cpt);
      cpt_to_byte[cpt] = uint8_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer regexes (llama.cpp's per-`pre` patterns; facts of the tokenizers they mirror).
// `\s` is rewritten below to the Unicode White_Space set so PCRE2 agrees with llama.cpp and HF.
constexpr const char* kRxGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kRxLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kRxQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kRxQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kRxDigit = R"(\p{N})";

struct PreSpec {
  const char* name;
  std::vector<const char*> regexes;
  PreDefaults defaults;
};

const std::vector<PreSpec>& pre_table() {
  static const std::vector<PreSpec> t = {
      {"default",
       {R"([\p{P}\$\+<=>\^~\|]+)", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))",
        R"(\p{N}+)", "[0-9][0-9][0-9]"},
       {false, false, true}},
      {"llama3", {kRxLlama3}, {true, true, true}},
      {"llama-v3", {kRxLlama3}, {true, true, true}},
      {"llama-bpe", {kRxLlama3}, {true, true, true}},
      {"falcon3", {kRxLlama3}, {true, true, true}},
      {"pixtral", {kRxLlama3}, {true, true, true}},
      {"dbrx", {kRxLlama3}, {false, false, true}},
      {"smaug-bpe", {kRxLlama3}, {false, false, true}},
      {"qwen2", {kRxQwen2}, {false, false, false}},
      {"deepseek-r1-qwen", {kRxQwen2}, {false, false, false}},
      {"stablelm2", {kRxQwen2}, {false, false, true}},
      {"qwen35", {kRxQwen35}, {false, false, false}},
      {"smollm", {kRxDigit, kRxGpt2}, {false, false, false}},
      {"starcoder", {kRxDigit, kRxGpt2}, {false, false, true}},
      {"refact", {kRxDigit, kRxGpt2}, {false, false, true}},
      {"codeshell", {kRxDigit, kRxGpt2}, {false, false, true}},
      {"gpt-2", {kRxGpt2}, {false, false, true}},
      {"gpt2", {kRxGpt2}, {false, false, true}},
      {"phi-2", {kRxGpt2}, {false, false, true}},
      {"mpt", {kRxGpt2}, {false, false, true}},
      {"olmo", {kRxGpt2}, {false, false, true}},
  };
  return t;
}

const PreSpec* find_pre(std::string_view name) {
  for (const auto& p : pre_table())
    if (name == p.name) return &p;
  return nullptr;
}

// Unicode White_Space (what llama.cpp's unicode tables and HF's regex call \s).
constexpr const char* kWhiteSpace = R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string expand_whitespace(std::string_view rx) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < rx.size(); ++i) {
    char c = rx[i];
    if (c == '\\' && i + 1 < rx.size()) {
      char n = rx[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) in_class = true;
    else if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct Regex {
  pcre2_code* code = nullptr;
  ~Regex() { if (code) pcre2_code_free(code); }
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

// =============================================================================================
using WordCache = std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>>;

struct Tokenizer::Impl {
  Vocab v;
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> text_to_id;
  std::vector<std::string> pieces;  // detokenized bytes per token (special = true)
  std::vector<TokenId> eog;
  std::unordered_set<TokenId> eog_set;
  std::string pre_name;

  // BPE
  std::vector<std::unique_ptr<Regex>> regexes;
  std::array<TokenId, 256> byte_tok{};  // byte → token of its byte-level char (BPE) / <0xXX> (SPM)
  struct Merge {
    int32_t rank;
    TokenId result;
  };
  std::unordered_map<uint64_t, Merge> merges;

  // special-token matching: trie over the texts of control / user-defined / unknown tokens
  std::unordered_map<uint64_t, int32_t> trie_edges;  // (node << 8 | byte) → child node
  std::vector<TokenId> trie_value;                    // node → token ending here
  std::array<bool, 256> trie_first{};
  std::vector<int32_t> special_priority;              // token id → priority (lower first), -1 none

  bool is_special_type(TokenId id) const {
    auto t = type(id);
    return t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
  }
  TokenType type(TokenId id) const { return v.types.empty() ? TokenType::Normal : v.types[size_t(id)]; }
  TokenId lookup(std::string_view s) const {
    auto it = text_to_id.find(s);
    return it == text_to_id.end() ? kNoToken : it->second;
  }

  Status build(std::string_view src);
  void partition(std::string_view text, bool parse_special,
                 std::vector<std::pair<TokenId, std::string_view>>& out) const;
  void encode_bpe(std::string_view text, std::vector<TokenId>& out,
                  WordCache& cache) const;
  void bpe_word(std::string_view word, std::vector<TokenId>& out) const;
  void encode_spm(std::string_view text, std::vector<TokenId>& out) const;
  std::string make_piece(TokenId id) const;
};

namespace {
bool parse_byte_token(std::string_view s, uint8_t& b) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return false;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int h = hex(s[3]), l = hex(s[4]);
  if (h < 0 || l < 0) return false;
  b = uint8_t(h * 16 + l);
  return true;
}
}  // namespace

Status Tokenizer::Impl::build(std::string_view src) {
  const size_t n = v.tokens.size();
  if (n == 0) return err("{}: tokenizer.ggml.tokens is empty", src);
  if (n > size_t(INT32_MAX)) return err("{}: tokenizer.ggml.tokens has {} entries (too many)", src, n);
  if (!v.types.empty() && v.types.size() != n)
    return err("{}: tokenizer.ggml.token_type has {} entries, tokenizer.ggml.tokens has {}", src, v.types.size(), n);
  if (!v.scores.empty() && v.scores.size() != n)
    return err("{}: tokenizer.ggml.scores has {} entries, tokenizer.ggml.tokens has {}", src, v.scores.size(), n);
  for (size_t i = 0; i < v.types.size(); ++i) {
    int t = int(v.types[i]);
    if (t < 0 || t > 6) return err("{}: tokenizer.ggml.token_type[{}] = {} is not a token type (0..6)", src, i, t);
  }

  text_to_id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    if (v.tokens[i].empty()) v.tokens[i] = fmt::format("[EMPTY_{}]", i);
    auto [it, inserted] = text_to_id.emplace(v.tokens[i], TokenId(i));
    if (!inserted)
      return err("{}: tokenizer.ggml.tokens: duplicate token '{}' at ids {} and {}", src, v.tokens[i], it->second, i);
  }

  // special ids: out of range → warning and disabled (llama.cpp does the same)
  auto check_id = [&](TokenId& id, const char* what) {
    if (id != kNoToken && (id < 0 || size_t(id) >= n)) {
      KILN_LOG_WARN("{}: {} = {} is outside the vocabulary ({} tokens); ignored", src, what, id, n);
      id = kNoToken;
    }
  };
  check_id(v.bos, "tokenizer.ggml.bos_token_id");
  check_id(v.eos, "tokenizer.ggml.eos_token_id");
  check_id(v.eot, "tokenizer.ggml.eot_token_id");
  check_id(v.eom, "tokenizer.ggml.eom_token_id");
  check_id(v.unk, "tokenizer.ggml.unknown_token_id");
  check_id(v.sep, "tokenizer.ggml.seperator_token_id");
  check_id(v.pad, "tokenizer.ggml.padding_token_id");
  check_id(v.mask, "tokenizer.ggml.mask_token_id");
  check_id(v.fim_pre, "tokenizer.ggml.fim_pre_token_id");
  check_id(v.fim_suf, "tokenizer.ggml.fim_suf_token_id");
  check_id(v.fim_mid, "tokenizer.ggml.fim_mid_token_id");
  check_id(v.fim_pad, "tokenizer.ggml.fim_pad_token_id");
  check_id(v.fim_rep, "tokenizer.ggml.fim_rep_token_id");
  check_id(v.fim_sep, "tokenizer.ggml.fim_sep_token_id");
  if (v.add_bos && v.bos == kNoToken)
    return err("{}: tokenizer.ggml.add_bos_token is true but there is no valid tokenizer.ggml.bos_token_id", src);
  if (v.add_eos && v.eos == kNoToken)
    return err("{}: tokenizer.ggml.add_eos_token is true but there is no valid tokenizer.ggml.eos_token_id", src);

  // byte tokens must be well formed: "<0xXX>"
  byte_tok.fill(kNoToken);
  for (size_t i = 0; i < v.types.size(); ++i) {
    if (v.types[i] != TokenType::Byte) continue;
    uint8_t b = 0;
    if (!parse_byte_token(v.tokens[i], b))
      return err("{}: tokenizer.ggml.tokens[{}] = '{}' has type BYTE but is not of the form <0xXX>", src, i, v.tokens[i]);
  }

  if (v.types.empty()) v.types.assign(n, TokenType::Normal);

  // end-of-generation / FIM tokens, as llama.cpp derives them: ids from metadata, else found by
  // their well-known texts; such tokens are treated as CONTROL (so they are matched as specials)
  auto make_control = [&](TokenId id) {
    if (v.types[size_t(id)] != TokenType::Control) {
      KILN_LOG_DEBUG("{}: token {} '{}' looks like a control token; treating it as CONTROL", src, id, v.tokens[size_t(id)]);
      v.types[size_t(id)] = TokenType::Control;
    }
  };
  auto detect = [&](TokenId& slot, std::initializer_list<const char*> texts) {
    if (slot != kNoToken) return;
    for (const char* t : texts) {
      TokenId id = lookup(t);
      if (id != kNoToken) {
        slot = id;
        make_control(id);
        return;
      }
    }
  };
  detect(v.eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
                 "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"});
  detect(v.eom, {"<|eom_id|>"});
  detect(v.fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                     "<|code_prefix|>", "<|prefix|>"});
  detect(v.fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                     "<|code_suffix|>", "<|suffix|>"});
  detect(v.fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                     "<|code_middle|>", "<|middle|>"});
  detect(v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect(v.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect(v.fim_sep, {"<|file_sep|>"});
  auto add_eog = [&](TokenId id) {
    if (id != kNoToken && eog_set.insert(id).second) eog.push_back(id);
  };
  for (TokenId id : {v.fim_pad, v.fim_rep, v.fim_sep}) add_eog(id);
  for (const char* t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                        "<｜end▁of▁sentence｜>", "[e~["}) {
    TokenId id = lookup(t);
    if (id != kNoToken) {
      add_eog(id);
      make_control(id);
    }
  }
  for (TokenId id : {v.eos, v.eot, v.eom}) add_eog(id);
  // harmony-style vocabularies: "<|end|>" is not end-of-generation when "<|return|>"+"<|call|>" exist
  for (const char* t : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    TokenId id = lookup(t);
    if (id != kNoToken) v.types[size_t(id)] = TokenType::UserDefined;
  }
  {
    // An eog token (found, so never kNoToken) that is not end-of-generation after all.
    auto drop_eog = [&](TokenId id, TokenType t) {
      eog_set.erase(id);
      eog.erase(std::remove(eog.begin(), eog.end(), id), eog.end());
      v.types[size_t(id)] = t;
    };
    TokenId end = lookup("<|end|>");
    bool ret = eog_set.count(lookup("<|return|>")), call = eog_set.count(lookup("<|call|>")) || eog_set.count(lookup("<|calls|>")),
         flush = eog_set.count(lookup("<|flush|>"));
    if (end != kNoToken && eog_set.count(end) && ((ret && call) || (call && flush))) drop_eog(end, TokenType::UserDefined);
    TokenId s_end = lookup("</s>");
    if (s_end != kNoToken && eog_set.count(lookup("<|tool_response>")) && eog_set.count(s_end)) drop_eog(s_end, TokenType::Normal);
  }
  std::sort(eog.begin(), eog.end());

  // special-token trie (longest text first; ties by id)
  std::vector<TokenId> specials;
  for (size_t i = 0; i < n; ++i)
    if (is_special_type(TokenId(i))) specials.push_back(TokenId(i));
  std::sort(specials.begin(), specials.end(), [&](TokenId a, TokenId b) {
    size_t la = v.tokens[size_t(a)].size(), lb = v.tokens[size_t(b)].size();
    return la != lb ? la > lb : a < b;
  });
  special_priority.assign(n, -1);
  trie_value.assign(1, kNoToken);
  trie_first.fill(false);
  for (size_t p = 0; p < specials.size(); ++p) {
    TokenId id = specials[p];
    special_priority[size_t(id)] = int32_t(p);
    const std::string& s = v.tokens[size_t(id)];
    int32_t node = 0;
    trie_first[uint8_t(s[0])] = true;
    for (unsigned char c : s) {
      uint64_t key = (uint64_t(node) << 8) | c;
      auto it = trie_edges.find(key);
      if (it == trie_edges.end()) {
        int32_t child = int32_t(trie_value.size());
        trie_value.push_back(kNoToken);
        trie_edges.emplace(key, child);
        node = child;
      } else {
        node = it->second;
      }
    }
    trie_value[size_t(node)] = id;
  }

  if (v.kind == ModelKind::Bpe) {
    std::string pre = v.pre;
    if (pre.empty()) {
      KILN_LOG_WARN("{}: tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer (quality may suffer)", src);
      pre = "default";
    }
    const PreSpec* spec = find_pre(pre);
    if (!spec)
      return err("{}: tokenizer.ggml.pre = '{}' is not a supported pre-tokenizer (supported: {})", src, pre,
                 fmt::join(supported_pre_tokenizers(), ", "));
    pre_name = pre;
    for (const char* rx : spec->regexes) {
      std::string pat = expand_whitespace(rx);
      int errcode = 0;
      PCRE2_SIZE erroff = 0;
      auto r = std::make_unique<Regex>();
      r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), PCRE2_UTF | PCRE2_UCP, &errcode,
                              &erroff, nullptr);
      KILN_CHECK(r->code, "pre-tokenizer regex failed to compile at {}: {}", erroff, pat);
      pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
      regexes.push_back(std::move(r));
    }
    const auto& bm = byte_map();
    int missing = 0;
    for (int b = 0; b < 256; ++b) {
      byte_tok[size_t(b)] = lookup(bm.byte_to_utf8[size_t(b)]);
      if (byte_tok[size_t(b)] == kNoToken) ++missing;
    }
    if (missing) KILN_LOG_WARN("{}: {} of 256 byte-level tokens are missing; such bytes are dropped", src, missing);

    merges.reserve(v.merges.size() * 2);
    size_t skipped = 0;
    for (size_t r = 0; r < v.merges.size(); ++r) {
      const std::string& m = v.merges[r];
      size_t sp = m.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= m.size())
        return err("{}: tokenizer.ggml.merges[{}] = '{}' is not of the form 'left right'", src, r, m);
      std::string_view l(m.data(), sp), rr(m.data() + sp + 1, m.size() - sp - 1);
      TokenId a = lookup(l), b = lookup(rr), c = lookup(std::string(l) + std::string(rr));
      if (a == kNoToken || b == kNoToken || c == kNoToken) {
        ++skipped;
        continue;
      }
      merges.emplace((uint64_t(uint32_t(a)) << 32) | uint32_t(b), Merge{int32_t(r), c});  // first (lowest) rank wins
    }
    if (skipped)
      KILN_LOG_WARN("{}: {} merges refer to tokens that are not in the vocabulary; ignored", src, skipped);
    if (v.merges.empty()) KILN_LOG_WARN("{}: BPE vocabulary without tokenizer.ggml.merges", src);
  } else {
    pre_name = "spm";
    for (int b = 0; b < 256; ++b) {
      static const char* hexd = "0123456789ABCDEF";
      char buf[7] = {'<', '0', 'x', hexd[b >> 4], hexd[b & 15], '>', 0};
      TokenId id = lookup(buf);
      if (id == kNoToken) id = lookup(std::string(1, char(b)));
      if (id == kNoToken) id = v.unk;
      byte_tok[size_t(b)] = id;
    }
  }

  pieces.resize(n);
  for (size_t i = 0; i < n; ++i) pieces[i] = make_piece(TokenId(i));
  return {};
}

std::string Tokenizer::Impl::make_piece(TokenId id) const {
  const std::string& text = v.tokens[size_t(id)];
  TokenType t = type(id);
  switch (t) {
    case TokenType::Control:
    case TokenType::Unknown:
    case TokenType::UserDefined:
      return text;
    case TokenType::Byte: {
      uint8_t b = 0;
      parse_byte_token(text, b);
      return std::string(1, char(b));
    }
    case TokenType::Normal: {
      if (v.kind == ModelKind::Spm) {
        std::string out;
        for (size_t i = 0; i < text.size(); ++i) {
          if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
            out += ' ';
            i += 2;
          } else {
            out += text[i];
          }
        }
        return out;
      }
      // byte-level BPE: every character stands for one byte
      const auto& bm = byte_map();
      std::string out;
      size_t i = 0;
      while (i < text.size()) {
        size_t start = i;
        uint32_t cpt = utf8_decode_lenient(text, i);
        auto it = bm.cpt_to_byte.find(cpt);
        if (it != bm.cpt_to_byte.end()) out += char(it->second);
        else out.append(text, start, i - start);  // not a byte-level character: keep as is
      }
      return out;
    }
    case TokenType::Unused:
    case TokenType::Undefined:
      return {};
  }
  return {};
}

// Splits text into raw spans and special tokens. Semantics of llama.cpp's partition: special
// tokens are taken in priority order (longest text first); each claims its non-overlapping
// occurrences, left to right, in the text not yet claimed by a higher-priority token.
void Tokenizer::Impl::partition(std::string_view text, bool parse_special,
                                std::vector<std::pair<TokenId, std::string_view>>& out) const {
  struct Hit {
    int32_t prio;
    uint32_t pos;
    TokenId id;
  };
  std::vector<Hit> hits;
  for (size_t p = 0; p < text.size(); ++p) {
    if (!trie_first[uint8_t(text[p])]) continue;
    int32_t node = 0;
    for (size_t q = p; q < text.size(); ++q) {
      auto it = trie_edges.find((uint64_t(node) << 8) | uint8_t(text[q]));
      if (it == trie_edges.end()) break;
      node = it->second;
      TokenId id = trie_value[size_t(node)];
      if (id == kNoToken) continue;
      TokenType t = type(id);
      if (!parse_special && (t == TokenType::Control || t == TokenType::Unknown)) continue;
      hits.push_back({special_priority[size_t(id)], uint32_t(p), id});
    }
  }
  if (hits.empty()) {
    if (!text.empty()) out.emplace_back(kNoToken, text);
    return;
  }
  std::sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) { return a.prio != b.prio ? a.prio < b.prio : a.pos < b.pos; });
  std::vector<uint8_t> claimed(text.size(), 0);
  std::vector<std::pair<uint32_t, TokenId>> taken;
  for (const Hit& h : hits) {
    size_t len = v.tokens[size_t(h.id)].size();
    bool free = true;
    for (size_t k = h.pos; k < h.pos + len; ++k)
      if (claimed[k]) { free = false; break; }
    if (!free) continue;
    std::fill(claimed.begin() + h.pos, claimed.begin() + h.pos + len, 1);
    taken.emplace_back(h.pos, h.id);
  }
  std::sort(taken.begin(), taken.end());
  size_t cur = 0;
  for (auto [pos, id] : taken) {
    if (pos > cur) out.emplace_back(kNoToken, text.substr(cur, pos - cur));
    out.emplace_back(id, std::string_view{});
    cur = pos + v.tokens[size_t(id)].size();
  }
  if (cur < text.size()) out.emplace_back(kNoToken, text.substr(cur));
}

// ---------------------------------------------------------------------------------------------
// BPE: merge adjacent symbols by lowest merge rank (ties: leftmost), on token ids.
void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<TokenId>& out) const {
  if (v.ignore_merges) {
    const auto& bm = byte_map();
    std::string enc;
    for (unsigned char c : word) enc += bm.byte_to_utf8[c];
    TokenId id = lookup(enc);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
  }
  const int n = int(word.size());
  if (n == 1) {
    TokenId id = byte_tok[uint8_t(word[0])];
    if (id != kNoToken) out.push_back(id);
    return;
  }
  struct Sym {
    TokenId id;
    int prev, next;
  };
  std::vector<Sym> sym(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) sym[size_t(i)] = {byte_tok[uint8_t(word[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1};
  struct Pair {
    int32_t rank;
    int left, right;
    TokenId lid, rid, result;
  };
  auto cmp = [](const Pair& a, const Pair& b) { return a.rank != b.rank ? a.rank > b.rank : a.left > b.left; };
  std::priority_queue<Pair, std::vector<Pair>, decltype(cmp)> q(cmp);
  auto try_pair = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    TokenId a = sym[size_t(l)].id, b = sym[size_t(r)].id;
    if (a < 0 || b < 0) return;
    auto it = merges.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
    if (it == merges.end()) return;
    q.push({it->second.rank, l, r, a, b, it->second.result});
  };
  for (int i = 0; i + 1 < n; ++i) try_pair(i, i + 1);
  while (!q.empty()) {
    Pair p = q.top();
    q.pop();
    Sym& L = sym[size_t(p.left)];
    Sym& R = sym[size_t(p.right)];
    if (L.id != p.lid || R.id != p.rid || L.next != p.right) continue;  // stale
    L.id = p.result;
    L.next = R.next;
    if (R.next >= 0) sym[size_t(R.next)].prev = p.left;
    R.id = -2;  // dead
    try_pair(L.prev, p.left);
    try_pair(p.left, L.next);
  }
  for (int i = 0; i >= 0; i = sym[size_t(i)].next)
    if (sym[size_t(i)].id >= 0) out.push_back(sym[size_t(i)].id);
}

void Tokenizer::Impl::encode_bpe(std::string_view raw, std::vector<TokenId>& out,
                                 WordCache& cache) const {
  std::string text = utf8_sanitize(raw);
  // sequential regex splitting: each regex splits every current segment into matches and gaps
  std::vector<std::pair<size_t, size_t>> segs{{0, text.size()}}, next;
  pcre2_match_data* md = nullptr;
  for (const auto& rx : regexes) {
    if (!md) md = pcre2_match_data_create(4, nullptr);
    next.clear();
    for (auto [s0, len] : segs) {
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data() + s0);
      size_t pos = 0, gap = 0;
      while (pos < len) {
        int rc = pcre2_match(rx->code, subj, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) break;
        PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {  // empty match: step one character
          pos = ms + 1;
          while (pos < len && (uint8_t(text[s0 + pos]) & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (ms > gap) next.emplace_back(s0 + gap, ms - gap);
        next.emplace_back(s0 + ms, me - ms);
        pos = gap = me;
      }
      if (gap < len) next.emplace_back(s0 + gap, len - gap);
    }
    segs.swap(next);
  }
  if (md) pcre2_match_data_free(md);
  for (auto [s0, len] : segs) {
    std::string_view word(text.data() + s0, len);
    if (len <= 64) {
      auto it = cache.find(word);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
      std::vector<TokenId> ids;
      bpe_word(word, ids);
      out.insert(out.end(), ids.begin(), ids.end());
      if (cache.size() < 200000) cache.emplace(std::string(word), std::move(ids));
    } else {
      bpe_word(word, out);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// SPM (llama.cpp "llama" vocab): start from UTF-8 characters, repeatedly merge the adjacent pair
// whose concatenation is the highest-scoring token (ties: leftmost); leftovers → byte tokens.
void Tokenizer::Impl::encode_spm(std::string_view text, std::vector<TokenId>& out) const {
  struct Sym {
    uint32_t off, len;
    int prev, next;
  };
  std::vector<Sym> sym;
  sym.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    size_t l = std::min(utf8_seq_len(uint8_t(text[off])), text.size() - off);
    int idx = int(sym.size());
    sym.push_back({uint32_t(off), uint32_t(l), idx - 1, -1});
    if (idx > 0) sym[size_t(idx - 1)].next = idx;
    off += l;
  }
  struct Pair {
    float score;
    int left, right;
    uint32_t size;
  };
  auto cmp = [](const Pair& a, const Pair& b) { return a.score != b.score ? a.score < b.score : a.left > b.left; };
  std::priority_queue<Pair, std::vector<Pair>, decltype(cmp)> q(cmp);
  auto try_pair = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    std::string_view s = text.substr(sym[size_t(l)].off, sym[size_t(l)].len + sym[size_t(r)].len);
    TokenId id = lookup(s);
    if (id == kNoToken) return;
    float score = v.scores.empty() ? 0.0f : v.scores[size_t(id)];
    q.push({score, l, r, uint32_t(s.size())});
  };
  for (int i = 0; i + 1 < int(sym.size()); ++i) try_pair(i, i + 1);
  while (!q.empty()) {
    Pair p = q.top();
    q.pop();
    Sym& L = sym[size_t(p.left)];
    Sym& R = sym[size_t(p.right)];
    if (L.len == 0 || R.len == 0 || L.len + R.len != p.size || L.next != p.right) continue;
    L.len += R.len;
    R.len = 0;
    L.next = R.next;
    if (R.next >= 0) sym[size_t(R.next)].prev = p.left;
    try_pair(L.prev, p.left);
    try_pair(p.left, L.next);
  }
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[size_t(i)].next) {
    const Sym& s = sym[size_t(i)];
    if (s.len == 0) continue;
    std::string_view piece = text.substr(s.off, s.len);
    TokenId id = lookup(piece);
    if (id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : piece) {
      TokenId b = byte_tok[c];
      if (b != kNoToken) out.push_back(b);
    }
  }
}

// =============================================================================================
Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::create(Vocab vocab) {
  auto impl = std::make_unique<Impl>();
  std::string src = vocab.source.empty() ? std::string("vocab") : vocab.source;
  impl->v = std::move(vocab);
  auto st = impl->build(src);
  if (!st.ok()) return st.error();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  const Impl& m = *impl_;
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (opt.add_special && m.v.add_bos) out.push_back(m.v.bos);
  std::vector<std::pair<TokenId, std::string_view>> frags;
  m.partition(text, opt.parse_special, frags);
  if (m.v.kind == ModelKind::Bpe) {
    WordCache cache;
    for (auto& [id, s] : frags) {
      if (id != kNoToken) out.push_back(id);
      else m.encode_bpe(s, out, cache);
    }
  } else {
    bool prev_special = true;  // the text start counts as "after a special token"
    std::string buf;
    for (auto& [id, s] : frags) {
      if (id != kNoToken) {
        out.push_back(id);
        prev_special = true;
        continue;
      }
      buf.clear();
      if (m.v.add_space_prefix && prev_special) buf += "\xE2\x96\x81";
      for (char c : s) {
        if (c == ' ') buf += "\xE2\x96\x81";
        else buf += c;
      }
      m.encode_spm(buf, out);
      prev_special = false;
    }
  }
  if (opt.add_special && m.v.add_eos) out.push_back(m.v.eos);
  return out;
}

std::string Tokenizer::token_to_piece(TokenId id, bool special) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= n_tokens()) return {};
  TokenType t = m.type(id);
  if (!special && (t == TokenType::Control || t == TokenType::Unknown)) return {};
  return m.pieces[size_t(id)];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool remove_special, bool special) const {
  const Impl& m = *impl_;
  bool remove_space = m.v.add_space_prefix;
  if (remove_special && m.v.add_bos && !ids.empty() && ids.front() == m.v.bos) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (remove_special && m.v.add_eos && !ids.empty() && ids.back() == m.v.eos) ids = ids.first(ids.size() - 1);
  std::string text;
  for (TokenId id : ids) {
    std::string p = token_to_piece(id, special);
    if (remove_space && !p.empty() && p[0] == ' ') p.erase(0, 1);
    remove_space = false;
    text += p;
  }
  if (m.v.clean_spaces && !text.empty()) {
    // 1: " ?" " !" " ." " ," → drop the space
    std::string a;
    for (size_t i = 0; i < text.size(); ++i) {
      char x = text[i];
      if (i > 0 && text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',') && !a.empty() && a.back() == ' ')
        a.pop_back();
      a += x;
    }
    // 2: " ' " → "'"
    std::string b;
    for (size_t i = 0; i < a.size(); ++i) {
      char x = a[i];
      if (x == '\'' && i > 0 && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
        if (!b.empty() && b.back() == ' ') b.pop_back();
        b += x;
        ++i;  // skip the following space
        continue;
      }
      b += x;
    }
    // 3: contractions " 's" " 'm" " 're" " 've" → drop the space
    std::string c;
    for (size_t i = 0; i < b.size(); ++i) {
      char x = b[i];
      if (x == '\'' && i > 0 && b[i - 1] == ' ' && i + 1 < b.size()) {
        char x1 = b[i + 1];
        bool drop = x1 == 's' || x1 == 'm' ||
                    (i + 2 < b.size() && ((x1 == 'r' && b[i + 2] == 'e') || (x1 == 'v' && b[i + 2] == 'e')));
        if (drop && !c.empty() && c.back() == ' ') c.pop_back();
      }
      c += x;
    }
    text.swap(c);
  }
  return text;
}

const Vocab& Tokenizer::vocab() const { return impl_->v; }
int32_t Tokenizer::n_tokens() const { return int32_t(impl_->v.tokens.size()); }
TokenId Tokenizer::find(std::string_view t) const { return impl_->lookup(t); }
bool Tokenizer::is_eog(TokenId id) const { return id != kNoToken && impl_->eog_set.count(id) > 0; }
bool Tokenizer::is_control(TokenId id) const {
  return id >= 0 && id < n_tokens() && impl_->type(id) == TokenType::Control;
}
const std::vector<TokenId>& Tokenizer::eog_ids() const { return impl_->eog; }
std::string_view Tokenizer::pre_tokenizer() const { return impl_->pre_name; }

std::optional<PreDefaults> bpe_pre_defaults(std::string_view pre) {
  if (pre.empty()) pre = "default";
  const PreSpec* s = find_pre(pre);
  if (!s) return std::nullopt;
  return s->defaults;
}

std::vector<std::string> supported_pre_tokenizers() {
  std::vector<std::string> r;
  for (const auto& p : pre_table()) r.emplace_back(p.name);
  return r;
}

// =============================================================================================
size_t utf8_complete_prefix(std::string_view s) {
  // scan back over at most 3 trailing bytes for an unfinished (but valid so far) sequence
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    uint8_t c = uint8_t(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = utf8_seq_len(c);
    if (c >= 0xC0 && need > back && need <= 4) return n - back;  // lead byte waiting for more
    return n;
  }
  return n;
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool special, std::vector<TokenId> preserved)
    : tok_(&tok), special_(special), preserved_(std::move(preserved)) {
  std::sort(preserved_.begin(), preserved_.end());
}

std::string StreamDecoder::push(TokenId id) {
  std::string p = tok_->token_to_piece(id, special_ || std::binary_search(preserved_.begin(), preserved_.end(), id));
  if (first_) {
    first_ = false;
    if (tok_->vocab().add_space_prefix && !p.empty() && p[0] == ' ') p.erase(0, 1);
  }
  pending_ += p;
  size_t k = utf8_complete_prefix(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, k));
  pending_.erase(0, k);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

void StreamDecoder::reset() {
  pending_.clear();
  first_ = true;
}

}  // namespace kiln::tokenizer
