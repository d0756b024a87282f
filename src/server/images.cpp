// server/images.cpp — the images of a chat request (issue #17): each image part's URL fetched
//   (`data:` URLs decoded here; `http(s)://` fetched with cpp-httplib's client: a size limit, a
//   timeout, no redirects at all), decoded and preprocessed (media/), and the prompt tokenized
//   around llama.cpp's media markers: text, <|vision_start|>, the image's nx * ny tokens (ids naming
//   its content: engine::image_token_id), <|vision_end|>, text, ...
// Must not: touch tensors or run the encoder (the engine does, on its thread).
// Threading: runs on the HTTP worker thread serving the request.
#include "core/log.h"
#include "media/image.h"
#include "server/impl.h"

namespace kiln::server {

namespace {

// The bytes behind an image URL. Errors say what failed (never a bare "bad image").
Result<std::vector<uint8_t>> fetch_image(const std::string& url, const media::Limits& lim, int timeout_ms) {
  if (url.rfind("data:", 0) == 0) return media::decode_data_url(url, lim);
  const bool https = url.rfind("https://", 0) == 0;
  if (!https && url.rfind("http://", 0) != 0)
    return err("unsupported URL scheme (data:, http:// and https:// are accepted)");
  const size_t host0 = url.find("://") + 3;
  const size_t path0 = url.find('/', host0);
  const std::string origin = url.substr(0, path0), path = path0 == std::string::npos ? "/" : url.substr(path0);
  if (origin.size() <= host0) return err("the URL has no host");
  httplib::Client cli(origin);
  if (!cli.is_valid()) return err("the URL '{}' is not valid", origin);
  cli.set_follow_location(false);  // a redirect (to any scheme) is an error, not followed
  cli.set_connection_timeout(std::chrono::milliseconds(timeout_ms));
  cli.set_read_timeout(std::chrono::milliseconds(timeout_ms));
  cli.set_write_timeout(std::chrono::milliseconds(timeout_ms));
  std::vector<uint8_t> body;
  bool too_big = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool late = false;
  auto res = cli.Get(path, httplib::Headers{}, [&](const char* data, size_t n) {
    if (body.size() + n > lim.max_bytes) return !(too_big = true);
    if (std::chrono::steady_clock::now() > deadline) return !(late = true);
    body.insert(body.end(), reinterpret_cast<const uint8_t*>(data), reinterpret_cast<const uint8_t*>(data) + n);
    return true;
  });
  if (too_big) return err("the image is larger than the limit of {} bytes", lim.max_bytes);
  if (late) return err("fetching the image took longer than {} ms", timeout_ms);
  if (!res) return err("fetching the image failed: {}", httplib::to_string(res.error()));
  if (res->status >= 300 && res->status < 400) return err("the image URL redirects (HTTP {}); redirects are not followed", res->status);
  if (res->status != 200) return err("fetching the image gave HTTP {}", res->status);
  return body;
}

}  // namespace

std::optional<ApiError> Server::Impl::image_prompt(const chat::Prompt& prompt, Gen& g) {
  const auto& mi = info();
  if (!mi.vision) return bad_request("messages", "image input needs a vision projector: start the server with --mmproj");
  media::Limits lim;
  lim.max_bytes = opt.image_max_bytes;
  media::PreprocessParams pp;
  pp.patch = mi.vision_patch;
  pp.merge = mi.vision_merge;
  pp.min_tokens = std::min(opt.image_min_tokens, opt.image_max_tokens);
  pp.max_tokens = opt.image_max_tokens;
  for (int i = 0; i < 3; ++i) pp.mean[i] = mi.vision_mean[i], pp.std[i] = mi.vision_std[i];
  // Tokens: the text between markers (the first piece with the tokenizer's BOS rule), and per image
  // <|vision_start|> + its tokens + <|vision_end|>.
  tokenizer::EncodeOptions eo;
  eo.add_special = false;
  eo.parse_special = true;
  const std::vector<int32_t> vs = tok().encode("<|vision_start|>", eo), ve = tok().encode("<|vision_end|>", eo);
  const std::string_view text = prompt.text, marker = chat::kMediaMarker;
  std::vector<int32_t>& ids = g.prompt;
  ids.clear();
  size_t at = 0;
  for (size_t k = 0; k <= prompt.image_urls.size(); ++k) {
    const size_t next = k < prompt.image_urls.size() ? text.find(marker, at) : std::string_view::npos;
    const std::string piece(text.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
    const auto pt = k == 0 ? tokenize_prompt(piece) : tok().encode(piece, eo);
    ids.insert(ids.end(), pt.begin(), pt.end());
    if (k == prompt.image_urls.size()) break;
    if (next == std::string_view::npos) return bad_request("messages", "the chat template dropped an image");
    at = next + marker.size();
    const std::string field = "messages (image " + std::to_string(k) + ")";
    auto bytes = fetch_image(prompt.image_urls[k], lim, opt.image_fetch_timeout_ms);
    if (!bytes.ok()) return bad_request(field, bytes.error().message);
    auto img = media::decode_image(*bytes, lim);
    if (!img.ok()) return bad_request(field, img.error().message);
    media::Pixels px = media::preprocess(*img, pp);
    engine::ImageInput in;
    in.w = px.w;
    in.h = px.h;
    in.nx = px.w / (pp.patch * pp.merge);
    in.ny = px.h / (pp.patch * pp.merge);
    in.hash = media::image_hash(*img) ^ (uint64_t(px.w) << 32 | uint64_t(px.h));
    in.chw = std::make_shared<const std::vector<float>>(std::move(px.chw));
    ids.insert(ids.end(), vs.begin(), vs.end());
    in.pos = int64_t(ids.size());
    for (int64_t i = 0; i < int64_t(in.nx) * in.ny; ++i) ids.push_back(engine::image_token_id(in.hash, i));
    ids.insert(ids.end(), ve.begin(), ve.end());
    g.gp.req.images.push_back(std::move(in));
  }
  return std::nullopt;
}

}  // namespace kiln::server
