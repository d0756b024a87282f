// server/native.cpp — llama-server's native /completion request fields and answers (see native.h).
#include "server/native.h"

#include <fmt/format.h>

namespace kiln::server {

namespace {

// A token id at `field`, appended to `ids`.
std::optional<ApiError> take_id(const json& v, const std::string& field, int64_t n_vocab, std::vector<int32_t>& ids) {
  if (!v.is_number_integer()) return bad_request(field, fmt::format("expected a token id (integer), got {}", v.dump()));
  int64_t id = v.get<int64_t>();
  if (id < 0 || id >= n_vocab) return bad_request(field, fmt::format("token id {} is outside the vocabulary [0, {})", id, n_vocab));
  ids.push_back(int32_t(id));
  return std::nullopt;
}

// One prompt: a string, or an array of ids and strings (llama-server's "mixed" prompt).
std::optional<ApiError> parse_one_prompt(const json& p, const std::string& field, int64_t n_vocab, std::vector<PromptPart>& out) {
  if (p.is_string()) {
    if (p.get<std::string>().empty()) return bad_request(field, "must not be empty");
    out.push_back(PromptPart{true, p.get<std::string>(), {}});
    return std::nullopt;
  }
  if (!p.is_array()) return bad_request(field, fmt::format("expected a string or an array of token ids, got {}", json_kind(p)));
  if (p.empty()) return bad_request(field, "must not be empty");
  for (size_t k = 0; k < p.size(); ++k) {
    const auto& v = p[k];
    std::string f = fmt::format("{}[{}]", field, k);
    if (v.is_string()) {
      if (v.get<std::string>().empty()) return bad_request(f, "must not be empty");
      out.push_back(PromptPart{true, v.get<std::string>(), {}});
      continue;
    }
    if (out.empty() || out.back().is_text) out.push_back(PromptPart{});
    if (auto e = take_id(v, f, n_vocab, out.back().ids)) return e;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_native_params(const json& b, int64_t n_vocab, int n_slots, NativeParams& out) {
  auto it = b.find("prompt");
  if (it == b.end() || it->is_null()) return bad_request("prompt", "is required");
  const json& p = *it;
  // An array is one mixed prompt when it holds a number (llama-server's rule); an array of only
  // strings / arrays is a list of prompts, of which one is supported.
  bool mixed = false;
  if (p.is_array())
    for (const auto& v : p) mixed |= v.is_number();
  if (p.is_array() && !mixed && !p.empty()) {
    if (p.size() != 1) return bad_request("prompt", fmt::format("only one prompt per request is supported, got {}", p.size()));
    if (auto e = parse_one_prompt(p[0], "prompt[0]", n_vocab, out.prompt)) return e;
  } else if (auto e = parse_one_prompt(p, "prompt", n_vocab, out.prompt)) {
    return e;
  }

  if (auto f = b.find("return_tokens"); f != b.end() && !f->is_null()) {
    if (!f->is_boolean()) return bad_request("return_tokens", fmt::format("expected a boolean, got {}", json_kind(*f)));
    out.return_tokens = f->get<bool>();
  }
  if (auto f = b.find("post_sampling_probs"); f != b.end() && !f->is_null()) {
    if (!f->is_boolean()) return bad_request("post_sampling_probs", fmt::format("expected a boolean, got {}", json_kind(*f)));
    if (f->get<bool>()) return bad_request("post_sampling_probs", "post-sampling probabilities are not supported (n_probs gives the model's logprobs)");
  }
  if (auto f = b.find("id_slot"); f != b.end() && !f->is_null()) {
    if (!f->is_number_integer()) return bad_request("id_slot", fmt::format("expected an integer, got {}", f->dump()));
    int64_t s = f->get<int64_t>();
    if (s < -1 || s >= n_slots) return bad_request("id_slot", fmt::format("{} is not a slot id (-1 or [0, {}))", s, n_slots));
    out.id_slot = int(s);
  }
  return std::nullopt;
}

std::vector<int32_t> native_prompt_ids(const NativeParams& np, const tokenizer::Tokenizer& tok,
                                       const std::function<std::vector<int32_t>(const std::string&)>& tokenize_first) {
  std::vector<int32_t> out;
  tokenizer::EncodeOptions eo;
  eo.add_special = false;
  eo.parse_special = true;
  for (size_t k = 0; k < np.prompt.size(); ++k) {
    const auto& part = np.prompt[k];
    std::vector<int32_t> ids = !part.is_text ? part.ids : k == 0 ? tokenize_first(part.text) : tok.encode(part.text, eo);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

const char* native_stop_type(engine::FinishReason r, const std::string& stop_word) {
  switch (r) {
    case engine::FinishReason::Stop: return stop_word.empty() ? "eos" : "word";
    case engine::FinishReason::Length: return "limit";
    default: return "none";
  }
}

json native_probs(const std::vector<engine::TokenOut>& toks, const tokenizer::Tokenizer& tok, int top_n) {
  json a = json::array();
  for (const auto& t : toks) {
    json top = json::array();
    for (int k = 0; k < top_n && k < int(t.top.size()); ++k) {
      std::string p = tok.token_to_piece(t.top[k].id, false);
      top.push_back({{"id", t.top[k].id}, {"token", valid_utf8(p)}, {"bytes", bytes_array(p)}, {"logprob", t.top[k].logprob}});
    }
    a.push_back({{"id", t.id},
                 {"token", valid_utf8(t.piece)},
                 {"bytes", bytes_array(t.piece)},
                 {"logprob", t.logprob.logprob},
                 {"top_logprobs", top}});
  }
  return a;
}

json native_settings(const GenParams& gp, const std::string& model_id) {
  const auto& r = gp.req;
  const auto& s = r.sampling;
  json bias = json::array();
  for (const auto& [id, v] : s.logit_bias) bias.push_back(json::array({id, v}));
  return json{{"n_predict", r.max_tokens},
              {"seed", s.seed},
              {"temperature", s.temperature},
              {"top_k", s.top_k},
              {"top_p", s.top_p},
              {"min_p", s.min_p},
              {"repeat_last_n", s.penalty_last_n},
              {"repeat_penalty", s.repeat_penalty},
              {"presence_penalty", s.presence_penalty},
              {"frequency_penalty", s.frequency_penalty},
              {"stop", r.stop},
              {"max_tokens", r.max_tokens},
              {"ignore_eos", r.ignore_eos},
              {"stream", gp.stream},
              {"logit_bias", bias},
              {"n_probs", r.n_probs > 0 ? r.n_probs : 0},
              {"post_sampling_probs", false},
              {"cache_prompt", r.cache_prompt},
              {"samplers", json::array({"penalties", "top_k", "top_p", "min_p", "temperature"})},
              {"model", model_id}};
}

json native_partial(const GenParams& gp, const std::string& text, const std::vector<engine::TokenOut>& toks,
                    const tokenizer::Tokenizer& tok, int id_slot, int64_t n_prompt, int64_t n_decoded) {
  json ids = json::array();
  for (const auto& t : toks) ids.push_back(t.id);
  json c = {{"index", 0},
            {"content", valid_utf8(text)},
            {"tokens", ids},
            {"stop", false},
            {"id_slot", id_slot},
            {"tokens_predicted", n_decoded},
            {"tokens_evaluated", n_prompt}};
  if (gp.req.n_probs != 0) c["completion_probabilities"] = native_probs(toks, tok, gp.top_logprobs);
  return c;
}

json native_final(const GenParams& gp, const NativeParams& np, const NativeFinal& f, const tokenizer::Tokenizer& tok,
                  const std::string& model_id) {
  json ids = json::array();
  if (np.return_tokens && !gp.stream)
    for (const auto& t : f.tokens) ids.push_back(t.id);
  const std::string content = gp.stream ? std::string() : valid_utf8(f.content);
  json out = {{"index", 0},
              {"content", content},
              {"tokens", ids},
              {"id_slot", f.id_slot},
              {"stop", true},
              {"model", model_id},
              {"tokens_predicted", f.timings.predicted_n},
              {"tokens_evaluated", f.n_prompt},
              {"generation_settings", native_settings(gp, model_id)},
              {"prompt", valid_utf8(f.prompt_text)},
              {"has_new_line", f.content.find('\n') != std::string::npos},
              {"truncated", false},  // prompts longer than a slot are refused, never truncated
              {"stop_type", native_stop_type(f.finish, f.stop_word)},
              {"stopping_word", f.stop_word},
              {"tokens_cached", f.n_prompt + f.timings.predicted_n},
              {"timings", timings_json(f.timings)}};
  if (!gp.stream && gp.req.n_probs != 0) out["completion_probabilities"] = native_probs(f.tokens, tok, gp.top_logprobs);
  return out;
}

}  // namespace kiln::server
