#include "model/vocab_loader.h"

#include "core/log.h"
#include "tokenizer/tokenizer.h"

namespace kiln::model {

using kiln::tokenizer::kNoToken;
using kiln::tokenizer::ModelKind;
using kiln::tokenizer::TokenId;
using kiln::tokenizer::TokenType;
using kiln::tokenizer::Vocab;

Result<Vocab> load_vocab(const kiln::gguf::File& f) {
  const std::string& src = f.path();
  Vocab v;
  v.source = src;

  auto model = f.get_string("tokenizer.ggml.model");
  if (!model) return model.error();
  v.model_name = *model;
  if (f.has("tokenizer.ggml.pre")) {
    auto pre = f.get_string("tokenizer.ggml.pre");
    if (!pre) return pre.error();
    v.pre = *pre;
  }

  if (v.model_name == "gpt2") {
    v.kind = ModelKind::Bpe;
    auto d = kiln::tokenizer::bpe_pre_defaults(v.pre);
    if (!d)
      return err("{}: tokenizer.ggml.pre = '{}' is not a supported pre-tokenizer (supported: {})", src, v.pre,
                 fmt::join(kiln::tokenizer::supported_pre_tokenizers(), ", "));
    v.add_bos = d->add_bos;
    v.ignore_merges = d->ignore_merges;
    v.clean_spaces = d->clean_spaces;
  } else if (v.model_name == "llama") {
    v.kind = ModelKind::Spm;
    v.bos = 1;
    v.eos = 2;
    v.unk = 0;
    v.add_bos = true;
    v.add_space_prefix = true;
  } else {
    return err("{}: tokenizer.ggml.model = '{}' is not supported (supported: gpt2, llama)", src, v.model_name);
  }

  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) return tokens.error();
  v.tokens = std::move(*tokens);
  const size_t n = v.tokens.size();

  if (f.has("tokenizer.ggml.scores")) {
    auto s = f.get_float_array("tokenizer.ggml.scores");
    if (!s) return s.error();
    if (s->size() < n)
      return err("{}: tokenizer.ggml.scores has {} entries, tokenizer.ggml.tokens has {}", src, s->size(), n);
    v.scores.assign(s->begin(), s->begin() + ptrdiff_t(n));
  }
  if (f.has("tokenizer.ggml.token_type")) {
    auto t = f.get_int_array("tokenizer.ggml.token_type");
    if (!t) return t.error();
    if (t->size() < n)
      return err("{}: tokenizer.ggml.token_type has {} entries, tokenizer.ggml.tokens has {}", src, t->size(), n);
    v.types.resize(n);
    for (size_t i = 0; i < n; ++i) {
      int64_t x = (*t)[i];
      if (x < 0 || x > 6) return err("{}: tokenizer.ggml.token_type[{}] = {} is not a token type (0..6)", src, i, x);
      v.types[i] = TokenType(x);
    }
  }
  if (v.kind == ModelKind::Bpe) {
    if (!f.has("tokenizer.ggml.merges")) return err("{}: key 'tokenizer.ggml.merges' missing (BPE vocabulary)", src);
    auto m = f.get_string_array("tokenizer.ggml.merges");
    if (!m) return m.error();
    v.merges = std::move(*m);
  }

  struct IdKey {
    const char* key;
    TokenId* dst;
  };
  const IdKey ids[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},        {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},        {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},    {"tokenizer.ggml.seperator_token_id", &v.sep},
      {"tokenizer.ggml.padding_token_id", &v.pad},    {"tokenizer.ggml.mask_token_id", &v.mask},
      {"tokenizer.ggml.fim_pre_token_id", &v.fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &v.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &v.fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &v.fim_pre},  {"tokenizer.ggml.suffix_token_id", &v.fim_suf},
      {"tokenizer.ggml.middle_token_id", &v.fim_mid},
  };
  for (const auto& k : ids) {
    if (!f.has(k.key)) continue;
    auto x = f.get_int(k.key);
    if (!x) return x.error();
    if (*x < 0 || size_t(*x) >= n) {
      // llama.cpp keeps its default in this case; so do we (Tokenizer::create re-checks the range)
      KILN_LOG_WARN("{}: {} = {} is outside the vocabulary ({} tokens); ignored", src, k.key, *x, n);
      continue;
    }
    *k.dst = TokenId(*x);
  }
  // defaults that fall outside a small vocabulary are disabled
  for (TokenId* d : {&v.bos, &v.eos, &v.unk})
    if (*d != kNoToken && size_t(*d) >= n) *d = kNoToken;

  auto ab = f.get_bool_or("tokenizer.ggml.add_bos_token", v.add_bos);
  if (!ab) return ab.error();
  v.add_bos = *ab;
  auto ae = f.get_bool_or("tokenizer.ggml.add_eos_token", v.add_eos);
  if (!ae) return ae.error();
  v.add_eos = *ae;
  if (v.kind == ModelKind::Spm) {
    auto sp = f.get_bool_or("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
    if (!sp) return sp.error();
    v.add_space_prefix = *sp;
  }
  return v;
}

Result<std::unique_ptr<kiln::tokenizer::Tokenizer>> load_tokenizer(const kiln::gguf::File& f) {
  auto v = load_vocab(f);
  KILN_TRY(v);
  return kiln::tokenizer::Tokenizer::create(std::move(*v));
}

}  // namespace kiln::model
