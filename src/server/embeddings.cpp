// server/embeddings.cpp — see embeddings.h.
#include "server/embeddings.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::server {

namespace {

std::optional<ApiError> ids_of(const json& arr, const std::string& where, int64_t n_vocab, std::vector<int32_t>& out) {
  for (size_t k = 0; k < arr.size(); ++k) {
    const auto& v = arr[k];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_vocab)
      return bad_request(fmt::format("{}[{}]", where, k), fmt::format("expected a token id in [0, {})", n_vocab));
    out.push_back(int32_t(v.get<int64_t>()));
  }
  return std::nullopt;
}

std::string base64_of(const void* data, size_t n) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string s;
  s.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t b = uint32_t(p[i]) << 16 | (i + 1 < n ? uint32_t(p[i + 1]) << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    s += kAlphabet[(b >> 18) & 63];
    s += kAlphabet[(b >> 12) & 63];
    s += i + 1 < n ? kAlphabet[(b >> 6) & 63] : '=';
    s += i + 2 < n ? kAlphabet[b & 63] : '=';
  }
  return s;
}

}  // namespace

std::optional<ApiError> parse_embedding_inputs(const json& body, const std::string& field, int64_t n_vocab,
                                               const std::function<std::vector<int32_t>(const std::string&)>& tokenize,
                                               std::vector<std::vector<int32_t>>& out) {
  out.clear();
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return bad_request(field, "missing: a string, a list of strings or token ids");
  const json& in = *it;
  const auto one = [&](const json& v, const std::string& where) -> std::optional<ApiError> {
    std::vector<int32_t> ids;
    if (v.is_string()) ids = tokenize(v.get<std::string>());
    else if (v.is_array()) {
      if (auto e = ids_of(v, where, n_vocab, ids)) return e;
    } else {
      return bad_request(where, "expected a string or a list of token ids");
    }
    if (ids.empty()) return bad_request(where, "the input is empty");
    out.push_back(std::move(ids));
    return std::nullopt;
  };
  if (in.is_string()) return one(in, field);
  if (!in.is_array()) return bad_request(field, "expected a string, a list of strings or token ids");
  if (in.empty()) return bad_request(field, "the list is empty");
  // A list of token ids is one input; otherwise each element is one.
  if (std::all_of(in.begin(), in.end(), [](const json& v) { return v.is_number(); })) return one(in, field);
  for (size_t k = 0; k < in.size(); ++k)
    if (auto e = one(in[k], fmt::format("{}[{}]", field, k))) return e;
  return std::nullopt;
}

std::optional<ApiError> parse_embd_normalize(const json& body, int& out) {
  out = 2;
  auto it = body.find("embd_normalize");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() || it->get<int64_t>() < -1 || it->get<int64_t>() > 64)
    return bad_request("embd_normalize", "expected an integer in [-1, 64]");
  out = int(it->get<int64_t>());
  return std::nullopt;
}

void normalize_embedding(std::vector<float>& v, int64_t n, int mode) {
  if (mode < 0 || n <= 0) return;
  for (size_t r = 0; r + size_t(n) <= v.size(); r += size_t(n)) {
    float* x = v.data() + r;
    double sum = 0;
    if (mode == 0) {  // max absolute value scaled to the int16 range
      for (int64_t i = 0; i < n; ++i) sum = std::max(sum, std::fabs(double(x[i])));
      sum /= 32760.0;
    } else if (mode == 1) {
      for (int64_t i = 0; i < n; ++i) sum += std::fabs(double(x[i]));
    } else if (mode == 2) {
      for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
      sum = std::sqrt(sum);
    } else {
      for (int64_t i = 0; i < n; ++i) sum += std::pow(std::fabs(double(x[i])), mode);
      sum = std::pow(sum, 1.0 / mode);
    }
    const double inv = sum > 0 ? 1.0 / sum : 0.0;
    for (int64_t i = 0; i < n; ++i) x[i] = float(x[i] * inv);
  }
}

json oai_embeddings_json(const std::vector<std::vector<float>>& embs, const std::string& model, int64_t prompt_tokens,
                         bool base64) {
  json data = json::array();
  for (size_t i = 0; i < embs.size(); ++i) {
    json e = {{"object", "embedding"}, {"index", i}};
    if (base64) e["embedding"] = base64_of(embs[i].data(), embs[i].size() * sizeof(float));  // little-endian hosts
    else e["embedding"] = embs[i];
    data.push_back(std::move(e));
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

json native_embedding_json(const std::vector<std::vector<float>>& embs, int64_t n_embd) {
  json out = json::array();
  for (size_t i = 0; i < embs.size(); ++i) {
    json rows = json::array();
    for (size_t r = 0; r + size_t(n_embd) <= embs[i].size(); r += size_t(n_embd))
      rows.push_back(std::vector<float>(embs[i].begin() + ptrdiff_t(r), embs[i].begin() + ptrdiff_t(r + size_t(n_embd))));
    out.push_back({{"index", i}, {"embedding", std::move(rows)}});
  }
  return out;
}

}  // namespace kiln::server
