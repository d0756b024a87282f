// server/api.cpp — request field validation and response JSON (see api.h).
#include "server/api.h"

#include "server/constraint.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <random>

namespace kiln::server {

json ApiError::to_json() const {
  json e = {{"code", status}, {"message", message}, {"type", type}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  return json{{"error", e}};
}

const char* json_kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

ApiError bad_request(std::string field, std::string message) {
  ApiError e;
  e.status = 400;
  e.type = "invalid_request_error";
  e.message = field.empty() ? message : field + ": " + message;
  e.param = std::move(field);
  return e;
}

namespace {

// Field readers: out = nullopt when absent or null (use the default); an ApiError on a bad value.
std::optional<ApiError> get_number(const json& b, const char* key, double lo, double hi, std::optional<double>& out) {
  out.reset();
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return bad_request(key, fmt::format("expected a number, got {}", json_kind(*it)));
  double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) return bad_request(key, fmt::format("{} is out of range [{}, {}]", it->dump(), lo, hi));
  out = v;
  return std::nullopt;
}

std::optional<ApiError> get_int(const json& b, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  out.reset();
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  int64_t v = 0;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      return bad_request(key, fmt::format("{} is out of range [{}, {}]", it->dump(), lo, hi));
    v = it->get<int64_t>();
  } else if (it->is_number_float()) {
    double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15)
      return bad_request(key, fmt::format("expected an integer, got {}", it->dump()));
    v = int64_t(d);
  } else {
    return bad_request(key, fmt::format("expected an integer, got {}", json_kind(*it)));
  }
  if (v < lo || v > hi) return bad_request(key, fmt::format("{} is out of range [{}, {}]", v, lo, hi));
  out = v;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& b, const char* key, std::optional<bool>& out) {
  out.reset();
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad_request(key, fmt::format("expected a boolean, got {}", json_kind(*it)));
  out = it->get<bool>();
  return std::nullopt;
}

#define KILN_API_TRY(expr)          \
  do {                              \
    if (auto e_ = (expr)) return e_; \
  } while (0)

// Like get_number / get_int / get_bool, but assign a present value to `dst` (converted to its type).
template <class T>
std::optional<ApiError> set_number(const json& b, const char* key, double lo, double hi, T& dst) {
  std::optional<double> v;
  KILN_API_TRY(get_number(b, key, lo, hi, v));
  if (v) dst = T(*v);
  return std::nullopt;
}
template <class T>
std::optional<ApiError> set_int(const json& b, const char* key, int64_t lo, int64_t hi, T& dst) {
  std::optional<int64_t> v;
  KILN_API_TRY(get_int(b, key, lo, hi, v));
  if (v) dst = T(*v);
  return std::nullopt;
}
std::optional<ApiError> set_bool(const json& b, const char* key, bool& dst) {
  std::optional<bool> v;
  KILN_API_TRY(get_bool(b, key, v));
  if (v) dst = *v;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_gen_params(const json& b, Endpoint ep, int64_t n_vocab, GenParams& out) {
  if (!b.is_object()) return bad_request("", "the request body must be a JSON object");
  auto& r = out.req;
  auto& s = r.sampling;

  if (auto it = b.find("model"); it != b.end() && !it->is_null() && !it->is_string())
    return bad_request("model", fmt::format("expected a string, got {}", json_kind(*it)));

  std::optional<int64_t> i;

  KILN_API_TRY(set_number(b, "temperature", 0.0, 100.0, s.temperature));
  KILN_API_TRY(set_number(b, "top_p", 0.0, 1.0, s.top_p));
  KILN_API_TRY(set_number(b, "min_p", 0.0, 1.0, s.min_p));
  KILN_API_TRY(set_int(b, "top_k", -1, 1 << 30, s.top_k));
  KILN_API_TRY(set_number(b, "presence_penalty", -2.0, 2.0, s.presence_penalty));
  KILN_API_TRY(set_number(b, "frequency_penalty", -2.0, 2.0, s.frequency_penalty));
  for (const char* k : {"repeat_penalty", "repetition_penalty"}) KILN_API_TRY(set_number(b, k, 0.0, 100.0, s.repeat_penalty));
  KILN_API_TRY(set_int(b, "repeat_last_n", -1, 1 << 30, s.penalty_last_n));
  KILN_API_TRY(get_int(b, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), i));
  // -1 (llama.cpp) = random; other values are taken modulo 2^32 (0xFFFFFFFF itself is "random").
  if (i) s.seed = *i == -1 ? 0xFFFFFFFFu : (uint64_t(*i) & 0xFFFFFFFFu);

  // Length: max_completion_tokens (newer OpenAI name) > max_tokens > n_predict.
  {
    std::optional<int64_t> mt, mct, np;
    KILN_API_TRY(get_int(b, "max_tokens", 1, 1 << 30, mt));
    KILN_API_TRY(get_int(b, "max_completion_tokens", 1, 1 << 30, mct));
    KILN_API_TRY(get_int(b, "n_predict", -1, 1 << 30, np));
    if (mct) r.max_tokens = int32_t(*mct);
    else if (mt) r.max_tokens = int32_t(*mt);
    else if (np) r.max_tokens = int32_t(*np);
    if (np && *np == 0 && !mct && !mt) r.max_tokens = 0;
  }

  KILN_API_TRY(get_int(b, "n", 1, kMaxChoices, i));
  if (i) out.n = int(*i);
  KILN_API_TRY(get_int(b, "best_of", 1, 1 << 20, i));
  if (i && *i != 1) return bad_request("best_of", fmt::format("only best_of = 1 is supported, got {}", *i));

  KILN_API_TRY(set_bool(b, "stream", out.stream));
  if (auto it = b.find("stream_options"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) return bad_request("stream_options", fmt::format("expected an object, got {}", json_kind(*it)));
    if (auto e = set_bool(*it, "include_usage", out.include_usage)) {
      e->param = "stream_options.include_usage";
      e->message = "stream_options." + e->message;
      return e;
    }
  }
  KILN_API_TRY(set_bool(b, "ignore_eos", r.ignore_eos));
  KILN_API_TRY(set_bool(b, "cache_prompt", r.cache_prompt));

  // stop: a string or an array of non-empty strings.
  if (auto it = b.find("stop"); it != b.end() && !it->is_null()) {
    if (it->is_string()) {
      if (it->get<std::string>().empty()) return bad_request("stop", "must not be an empty string");
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 64) return bad_request("stop", fmt::format("at most 64 stop strings, got {}", it->size()));
      for (size_t k = 0; k < it->size(); ++k) {
        const auto& v = (*it)[k];
        std::string field = fmt::format("stop[{}]", k);
        if (!v.is_string()) return bad_request(field, fmt::format("expected a string, got {}", json_kind(v)));
        if (v.get<std::string>().empty()) return bad_request(field, "must not be an empty string");
        r.stop.push_back(v.get<std::string>());
      }
    } else {
      return bad_request("stop", fmt::format("expected a string or an array of strings, got {}", json_kind(*it)));
    }
  }

  // logit_bias: {"token id": bias} (OpenAI) or [[id, bias|false], …] (llama.cpp).
  if (auto it = b.find("logit_bias"); it != b.end() && !it->is_null()) {
    auto add = [&](const std::string& field, int64_t id, const json& v) -> std::optional<ApiError> {
      if (id < 0 || id >= n_vocab) return bad_request(field, fmt::format("token id {} is outside the vocabulary [0, {})", id, n_vocab));
      float bias;
      if (v.is_boolean() && !v.get<bool>()) bias = -std::numeric_limits<float>::infinity();
      else if (v.is_number() && std::isfinite(v.get<double>()) && std::fabs(v.get<double>()) <= 100.0) bias = float(v.get<double>());
      else return bad_request(field, fmt::format("bias must be a number in [-100, 100] or false, got {}", v.dump()));
      s.logit_bias[int32_t(id)] = bias;
      return std::nullopt;
    };
    if (it->is_object()) {
      for (auto& [k, v] : it->items()) {
        std::string field = "logit_bias." + k;
        int64_t id = 0;
        size_t pos = 0;
        try {
          id = std::stoll(k, &pos);
        } catch (...) {
          pos = 0;
        }
        if (k.empty() || pos != k.size()) return bad_request(field, fmt::format("key '{}' is not a token id", k));
        KILN_API_TRY(add(field, id, v));
      }
    } else if (it->is_array()) {
      for (size_t k = 0; k < it->size(); ++k) {
        const auto& e = (*it)[k];
        std::string field = fmt::format("logit_bias[{}]", k);
        if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer())
          return bad_request(field, "expected [token_id, bias]");
        KILN_API_TRY(add(field, e[0].get<int64_t>(), e[1]));
      }
    } else {
      return bad_request("logit_bias", fmt::format("expected an object, got {}", json_kind(*it)));
    }
  }

  // logprobs
  if (ep == Endpoint::Chat) {
    KILN_API_TRY(set_bool(b, "logprobs", out.logprobs));
    KILN_API_TRY(get_int(b, "top_logprobs", 0, 20, i));
    if (i) {
      if (!out.logprobs) return bad_request("top_logprobs", "requires logprobs: true");
      out.top_logprobs = int(*i);
    }
  } else {
    KILN_API_TRY(get_int(b, "logprobs", 0, 20, i));
    if (i) {
      out.logprobs = true;
      out.top_logprobs = int(*i);
    }
    KILN_API_TRY(set_bool(b, "echo", out.echo));
    if (auto it = b.find("suffix"); it != b.end() && !it->is_null()) {
      if (!it->is_string()) return bad_request("suffix", fmt::format("expected a string, got {}", json_kind(*it)));
      if (!it->get<std::string>().empty()) return bad_request("suffix", "suffix (insertion) is not supported");
    }
  }
  KILN_API_TRY(get_int(b, "n_probs", 0, 20, i));  // llama.cpp native
  if (i && *i > 0) {
    out.logprobs = true;
    out.top_logprobs = int(*i);
  }
  if (out.logprobs) r.n_probs = out.top_logprobs > 0 ? out.top_logprobs : -1;

  // response_format, json_schema, grammar: constrained decoding (server/constraint.h).
  KILN_API_TRY(parse_constraint(b, out));
  if (auto it = b.find("user"); it != b.end() && !it->is_null() && !it->is_string())
    return bad_request("user", fmt::format("expected a string, got {}", json_kind(*it)));
  return std::nullopt;
}

std::optional<ApiError> parse_completion_prompt(const json& b, int64_t n_vocab, std::string& text,
                                                std::vector<int32_t>& tokens, bool& is_tokens) {
  auto it = b.find("prompt");
  if (it == b.end() || it->is_null()) return bad_request("prompt", "is required");
  const json* p = &*it;
  std::string field = "prompt";
  if (p->is_array() && !p->empty() && !(*p)[0].is_number()) {
    if (p->size() != 1) return bad_request("prompt", fmt::format("only one prompt per request is supported, got {}", p->size()));
    p = &(*p)[0];
    field = "prompt[0]";
  }
  if (p->is_string()) {
    is_tokens = false;
    text = p->get<std::string>();
    if (text.empty()) return bad_request(field, "must not be empty");
    return std::nullopt;
  }
  if (p->is_array()) {
    if (p->empty()) return bad_request(field, "must not be empty");
    is_tokens = true;
    for (size_t k = 0; k < p->size(); ++k) {
      const auto& v = (*p)[k];
      if (!v.is_number_integer()) return bad_request(fmt::format("{}[{}]", field, k), "expected a token id (integer)");
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= n_vocab)
        return bad_request(fmt::format("{}[{}]", field, k), fmt::format("token id {} is outside the vocabulary [0, {})", id, n_vocab));
      tokens.push_back(int32_t(id));
    }
    return std::nullopt;
  }
  return bad_request(field, fmt::format("expected a string or an array of token ids, got {}", json_kind(*p)));
}

std::string valid_utf8(const std::string& s) {
  // Replace invalid sequences with U+FFFD.
  std::string out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  auto cont = [&](size_t k) { return k < n && (uint8_t(s[k]) & 0xC0) == 0x80; };
  while (i < n) {
    uint8_t c = uint8_t(s[i]);
    size_t len = 0;
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3;
    else if (c >= 0xF0 && c <= 0xF4) len = 4;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = cont(i + k);
    if (ok && len == 3) {
      uint8_t c1 = uint8_t(s[i + 1]);
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F)) ok = false;
    }
    if (ok && len == 4) {
      uint8_t c1 = uint8_t(s[i + 1]);
      if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) ok = false;
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

json bytes_array(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(int(c));
  return a;
}

json chat_logprob_entry(const engine::TokenOut& t, const tokenizer::Tokenizer& tok, int top_n) {
  json e = {{"id", t.id}, {"token", valid_utf8(t.piece)}, {"logprob", t.logprob.logprob}, {"bytes", bytes_array(t.piece)}};
  json top = json::array();
  for (int k = 0; k < top_n && k < int(t.top.size()); ++k) {
    std::string p = tok.token_to_piece(t.top[k].id, false);
    top.push_back({{"id", t.top[k].id}, {"token", valid_utf8(p)}, {"logprob", t.top[k].logprob}, {"bytes", bytes_array(p)}});
  }
  e["top_logprobs"] = top;
  return e;
}

json completion_logprob_lists(const std::vector<engine::TokenOut>& toks, const tokenizer::Tokenizer& tok, int top_n,
                              size_t text_offset0) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t off = text_offset0;
  for (const auto& t : toks) {
    tokens.push_back(valid_utf8(t.piece));
    lps.push_back(t.logprob.logprob);
    json top = json::object();
    for (int k = 0; k < top_n && k < int(t.top.size()); ++k) top[valid_utf8(tok.token_to_piece(t.top[k].id, false))] = t.top[k].logprob;
    tops.push_back(top_n > 0 ? top : json(nullptr));
    offs.push_back(off);
    off += t.piece.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json timings_json(const engine::Timings& t) {
  auto per_s = [](int64_t n, double ms) { return ms > 0 ? 1e3 * double(n) / ms : 0.0; };
  return json{{"cache_n", t.cache_n},
              {"prompt_n", t.prompt_n},
              {"prompt_ms", t.prompt_ms},
              {"prompt_per_token_ms", t.prompt_n > 0 ? t.prompt_ms / double(t.prompt_n) : 0.0},
              {"prompt_per_second", per_s(t.prompt_n, t.prompt_ms)},
              {"predicted_n", t.predicted_n},
              {"predicted_ms", t.predicted_ms},
              {"predicted_per_token_ms", t.predicted_n > 0 ? t.predicted_ms / double(t.predicted_n) : 0.0},
              {"predicted_per_second", per_s(t.predicted_n, t.predicted_ms)},
              {"draft_n", t.draft_n},
              {"draft_n_accepted", t.draft_n_accepted}};
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return json{{"completion_tokens", completion_tokens},
              {"prompt_tokens", prompt_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

std::string metrics_text(const engine::Metrics& m, uint64_t http_requests, uint64_t http_errors) {
  std::string s;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    s += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  const double pps = m.prompt_seconds > 0 ? double(m.prompt_tokens) / m.prompt_seconds : 0.0;
  const double tps = m.predicted_seconds > 0 ? double(m.predicted_tokens) / m.predicted_seconds : 0.0;
  metric("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.", double(m.prompt_tokens));
  metric("llamacpp:prompt_seconds_total", "counter", "Prompt process time", m.prompt_seconds);
  metric("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.", double(m.predicted_tokens));
  metric("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time", m.predicted_seconds);
  metric("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", double(m.decode_calls));
  metric("llamacpp:n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
         m.decode_calls ? double(m.busy_slot_steps) / double(m.decode_calls) : 0.0);
  metric("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", pps);
  metric("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", tps);
  metric("llamacpp:requests_processing", "gauge", "Number of requests processing.", double(m.busy_slots));
  metric("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", double(m.queue_length));
  metric("llamacpp:n_tokens_max", "gauge", "Largest observed n_tokens.", double(m.max_tokens_seen));
  metric("llamacpp:n_draft_total", "counter", "Speculative decoding: draft tokens verified.", double(m.draft_tokens));
  metric("llamacpp:n_draft_accepted_total", "counter", "Speculative decoding: draft tokens accepted.",
         double(m.draft_tokens_accepted));
  metric("kiln:mtp_deferred_steps_total", "counter", "draft-mtp: decode steps whose MTP catch-up waited for a batched pass.",
         double(m.mtp_deferred_steps));
  metric("kiln:mtp_flushes_total", "counter", "draft-mtp: batched MTP catch-up passes.", double(m.mtp_flushes));
  metric("kiln:requests_submitted_total", "counter", "Generation requests submitted to the engine.", double(m.requests_submitted));
  metric("kiln:requests_finished_total", "counter", "Generation requests finished (any reason).", double(m.requests_finished));
  metric("kiln:requests_cancelled_total", "counter", "Generation requests cancelled (client gone).", double(m.requests_cancelled));
  metric("kiln:requests_failed_total", "counter", "Generation requests that ended in an error.", double(m.requests_failed));
  metric("kiln:prefix_cache_hits_total", "counter", "Requests that reused at least one cached prompt token.", double(m.cache_requests_hit));
  metric("kiln:prefix_cache_tokens_reused_total", "counter", "Prompt tokens reused from the prefix cache (sum of cache_n).",
         double(m.cache_tokens_reused));
  metric("kiln:prefix_cache_evictions_total", "counter", "Prefix-cache entries evicted (LRU).", double(m.cache_evictions));
  metric("kiln:prefix_cache_bytes", "gauge", "Bytes held by the prefix cache.", double(m.cache_bytes));
  metric("kiln:prefix_cache_entries", "gauge", "Prefix-cache entries (blocks and tails).", double(m.cache_entries));
  metric("kiln:prefix_cache_states", "gauge", "Recurrent-state snapshots held by the prefix cache.", double(m.cache_states));
  metric("kiln:http_requests_total", "counter", "HTTP requests answered.", double(http_requests));
  metric("kiln:http_errors_total", "counter", "HTTP requests answered with a 4xx or 5xx status.", double(http_errors));
  return s;
}

std::string random_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string s(24, 'x');
  for (auto& c : s) c = al[rng() % (sizeof(al) - 1)];
  return s;
}

}  // namespace kiln::server
