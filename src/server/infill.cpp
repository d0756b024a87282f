// server/infill.cpp — POST /infill: fields, FIM support check, the FIM prompt (see infill.h), and
//   the handler, which runs the ids as llama-server's native /completion (same answer and stream).
// Threading: the handler runs on the HTTP worker thread serving the request.
#include "server/infill.h"

#include <fmt/format.h>

#include <algorithm>

#include "server/client_socket.h"
#include "server/impl.h"

namespace kiln::server {

namespace {

// input_prefix / input_suffix: a string (may be empty) or an array of token ids and strings.
std::optional<ApiError> parse_mixed(const json& b, const char* field, int64_t n_vocab, std::vector<PromptPart>& out) {
  auto it = b.find(field);
  if (it == b.end() || it->is_null()) return bad_request(field, "is required (a string, possibly empty)");
  if (it->is_string()) {
    out.push_back(PromptPart{true, it->get<std::string>(), {}});
    return std::nullopt;
  }
  if (!it->is_array())
    return bad_request(field, fmt::format("expected a string or an array of token ids and strings, got {}", json_kind(*it)));
  for (size_t k = 0; k < it->size(); ++k) {
    const json& v = (*it)[k];
    const std::string f = fmt::format("{}[{}]", field, k);
    if (v.is_string()) {
      out.push_back(PromptPart{true, v.get<std::string>(), {}});
    } else if (v.is_number_integer()) {
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= n_vocab) return bad_request(f, fmt::format("token id {} is outside the vocabulary [0, {})", id, n_vocab));
      if (out.empty() || out.back().is_text) out.push_back(PromptPart{});
      out.back().ids.push_back(int32_t(id));
    } else {
      return bad_request(f, fmt::format("expected a token id or a string, got {}", json_kind(v)));
    }
  }
  return std::nullopt;
}

std::vector<int32_t> encode(const tokenizer::Tokenizer& tok, const std::string& text, bool parse_special) {
  tokenizer::EncodeOptions eo;
  eo.add_special = false;
  eo.parse_special = parse_special;
  return tok.encode(text, eo);
}

// Text parts without special-token parsing (llama-server's tokenize_mixed for these fields).
std::vector<int32_t> mixed_ids(const std::vector<PromptPart>& parts, const tokenizer::Tokenizer& tok) {
  std::vector<int32_t> out;
  for (const auto& p : parts) {
    std::vector<int32_t> ids = p.is_text ? encode(tok, p.text, false) : p.ids;
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

}  // namespace

std::optional<ApiError> parse_infill_params(const json& b, int64_t n_vocab, InfillParams& out) {
  if (auto e = parse_mixed(b, "input_prefix", n_vocab, out.input_prefix)) return e;
  if (auto e = parse_mixed(b, "input_suffix", n_vocab, out.input_suffix)) return e;
  if (auto it = b.find("input_extra"); it != b.end() && !it->is_null()) {
    if (!it->is_array())
      return bad_request("input_extra", fmt::format("expected an array of {{\"filename\": string, \"text\": string}}, got {}", json_kind(*it)));
    for (size_t k = 0; k < it->size(); ++k) {
      const json& c = (*it)[k];
      const std::string f = fmt::format("input_extra[{}]", k);
      if (!c.is_object()) return bad_request(f, fmt::format("expected an object {{\"filename\", \"text\"}}, got {}", json_kind(c)));
      auto t = c.find("text");
      if (t == c.end() || !t->is_string()) return bad_request(f + ".text", "is required (a string)");
      InfillChunk chunk;
      chunk.text = t->get<std::string>();
      if (auto fn = c.find("filename"); fn != c.end() && !fn->is_null()) {
        if (!fn->is_string()) return bad_request(f + ".filename", fmt::format("expected a string, got {}", json_kind(*fn)));
        chunk.filename = fn->get<std::string>();
      }
      out.input_extra.push_back(std::move(chunk));
    }
  }
  if (auto it = b.find("prompt"); it != b.end() && !it->is_null()) {
    if (!it->is_string()) return bad_request("prompt", fmt::format("expected a string, got {}", json_kind(*it)));
    out.prompt = it->get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> infill_support_error(const tokenizer::Vocab& v) {
  std::string missing;
  auto need = [&](tokenizer::TokenId id, const char* what, const char* key) {
    if (id == tokenizer::kNoToken) missing += fmt::format("{}{} token ({})", missing.empty() ? "" : ", ", what, key);
  };
  need(v.fim_pre, "prefix", "tokenizer.ggml.fim_pre_token_id");
  need(v.fim_suf, "suffix", "tokenizer.ggml.fim_suf_token_id");
  need(v.fim_mid, "middle", "tokenizer.ggml.fim_mid_token_id");
  if (missing.empty()) return std::nullopt;
  ApiError e;
  e.status = 501;
  e.type = "not_supported_error";
  e.message = fmt::format("infill is not supported by this model: its vocabulary has no FIM {} (neither the key nor a "
                          "known token text such as <|fim_prefix|>, <fim_prefix>, <PRE>)",
                          missing);
  return e;
}

std::vector<int32_t> infill_prompt_ids(const InfillParams& p, const tokenizer::Tokenizer& tok, const InfillLimits& lim) {
  const tokenizer::Vocab& v = tok.vocab();
  // The project context: repository name, then each extra file under its name (or a snippet
  // separator when the vocabulary has no file-separator token), then the current file's header.
  std::vector<int32_t> extra;
  auto put = [&](std::vector<int32_t>& dst, const std::vector<int32_t>& ids) { dst.insert(dst.end(), ids.begin(), ids.end()); };
  if (v.fim_rep != tokenizer::kNoToken) {
    extra.push_back(v.fim_rep);
    put(extra, encode(tok, "myproject\n", false));
  }
  for (const auto& c : p.input_extra) {
    if (v.fim_sep != tokenizer::kNoToken) {
      extra.push_back(v.fim_sep);
      put(extra, encode(tok, c.filename + "\n", false));
    } else {
      put(extra, encode(tok, "\n\n--- snippet ---\n\n", false));
    }
    put(extra, encode(tok, c.text, false));
  }
  if (v.fim_sep != tokenizer::kNoToken) {
    extra.push_back(v.fim_sep);
    put(extra, encode(tok, "filename\n", false));
  }

  std::vector<int32_t> prefix = mixed_ids(p.input_prefix, tok);
  std::vector<int32_t> suffix = mixed_ids(p.input_suffix, tok);
  const std::vector<int32_t> prompt = encode(tok, p.prompt, true);

  // Fit prefix and suffix into one batch, 3:1: the prefix keeps its end, the suffix its start.
  const int64_t quarter = lim.n_batch / 4;
  const size_t n_prefix = size_t(std::min<int64_t>(int64_t(prefix.size()), 3 * quarter));
  const size_t n_suffix =
      size_t(std::min<int64_t>(int64_t(suffix.size()), std::max<int64_t>(0, quarter - (2 + int64_t(prompt.size())))));
  // The rest of the context (less room for the answer) holds the end of the extra context.
  const size_t n_extra = size_t(std::min<int64_t>(std::max<int64_t>(0, lim.n_ctx - lim.n_batch - 2 * lim.n_predict),
                                                  int64_t(extra.size())));
  prefix.erase(prefix.begin(), prefix.end() - n_prefix);
  suffix.resize(n_suffix);

  std::vector<int32_t> pre_part = {v.fim_pre};
  put(pre_part, prefix);
  put(pre_part, prompt);
  std::vector<int32_t> suf_part = {v.fim_suf};
  put(suf_part, suffix);

  std::vector<int32_t> out(extra.end() - n_extra, extra.end());
  if (v.add_bos && v.bos != tokenizer::kNoToken) out.push_back(v.bos);
  put(out, lim.spm ? suf_part : pre_part);
  put(out, lim.spm ? pre_part : suf_part);
  out.push_back(v.fim_mid);
  return out;
}

void Server::Impl::h_infill(const httplib::Request& req, httplib::Response& res) {
  if (auto e = infill_support_error(tok().vocab())) return send_error(res, *e);
  json body;
  if (!parse_body(req, res, body)) return;
  auto g = native_gen(body, res);
  if (!g) return;
  if (g->gp.n > 1) return send_error(res, bad_request("n", "n > 1 is answered only by /v1/chat/completions and /v1/completions"));
  InfillParams ip;
  if (auto e = parse_infill_params(body, info().n_vocab, ip)) return send_error(res, *e);
  // id_slot / return_tokens as on /completion (the prompt is the FIM layout, not a "prompt" form).
  json native_fields = {{"prompt", json::array({0})}};
  for (const char* k : {"id_slot", "return_tokens", "post_sampling_probs"})
    if (auto it = body.find(k); it != body.end()) native_fields[k] = *it;
  if (auto e = parse_native_params(native_fields, info().n_vocab, eng->options().n_parallel, g->np)) return send_error(res, *e);
  InfillLimits lim;
  lim.n_batch = eng->options().n_batch;
  lim.n_ctx = info().n_ctx_slot;
  lim.n_predict = g->gp.req.max_tokens;
  lim.spm = opt.spm_infill;
  g->prompt = infill_prompt_ids(ip, tok(), lim);
  g->np.prompt = {PromptPart{false, {}, g->prompt}};
  g->prompt_text = tok().decode(g->prompt);
  if (auto e = check_context(g->prompt.size())) return send_error(res, *e);
  if (!g->gp.stream) g->client_fd = find_client_socket(req);
  start(g, res);
}

}  // namespace kiln::server
