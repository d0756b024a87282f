// media/image.cpp — sniffing, decoding (stb_image, libwebp), EXIF orientation (libexif), limits,
// base64 and data: URLs, the content hash. See image.h.
#include "media/image.h"

#include <libexif/exif-data.h>
#include <stb/stb_image.h>
#include <webp/decode.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <memory>

namespace kiln::media {

std::string_view sniff_format(std::span<const uint8_t> b) {
  auto starts = [&](std::initializer_list<uint8_t> m, size_t off = 0) {
    if (b.size() < off + m.size()) return false;
    size_t i = off;
    for (uint8_t c : m)
      if (b[i++] != c) return false;
    return true;
  };
  if (starts({0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'})) return "png";
  if (starts({0xff, 0xd8, 0xff})) return "jpeg";
  if (starts({'R', 'I', 'F', 'F'}) && starts({'W', 'E', 'B', 'P'}, 8)) return "webp";
  if (starts({'G', 'I', 'F', '8', '7', 'a'}) || starts({'G', 'I', 'F', '8', '9', 'a'})) return "gif";
  if (starts({'B', 'M'}) && b.size() >= 26) return "bmp";
  return "";
}

namespace {

Status check_dims(int w, int h, const Limits& lim) {
  if (w <= 0 || h <= 0) return err("the image has no pixels ({}x{})", w, h);
  if (w > lim.max_side || h > lim.max_side)
    return err("{}x{} pixels: a side exceeds the limit of {}", w, h, lim.max_side);
  if (int64_t(w) * int64_t(h) > lim.max_pixels)
    return err("{}x{} pixels exceed the limit of {} pixels", w, h, lim.max_pixels);
  return {};
}

// EXIF orientation (1..8) of a JPEG; 1 when absent.
int exif_orientation(std::span<const uint8_t> b) {
  ExifData* ed = exif_data_new_from_data(b.data(), unsigned(b.size()));
  if (!ed) return 1;
  int o = 1;
  if (ExifEntry* e = exif_data_get_entry(ed, EXIF_TAG_ORIENTATION); e && e->format == EXIF_FORMAT_SHORT && e->size >= 2)
    o = exif_get_short(e->data, exif_data_get_byte_order(ed));
  exif_data_unref(ed);
  return o >= 1 && o <= 8 ? o : 1;
}

// Applies EXIF orientation o to img (the transform that makes the picture upright).
Image orient(const Image& s, int o) {
  if (o == 1) return s;
  const int W = s.w, H = s.h;
  const bool swap = o >= 5;
  Image d;
  d.w = swap ? H : W;
  d.h = swap ? W : H;
  d.rgb.resize(s.rgb.size());
  for (int y = 0; y < d.h; ++y)
    for (int x = 0; x < d.w; ++x) {
      int sx = x, sy = y;
      switch (o) {
        case 2: sx = W - 1 - x; break;
        case 3: sx = W - 1 - x, sy = H - 1 - y; break;
        case 4: sy = H - 1 - y; break;
        case 5: sx = y, sy = x; break;
        case 6: sx = y, sy = H - 1 - x; break;
        case 7: sx = W - 1 - y, sy = H - 1 - x; break;
        case 8: sx = W - 1 - y, sy = x; break;
      }
      std::memcpy(&d.rgb[(size_t(y) * d.w + x) * 3], &s.rgb[(size_t(sy) * W + sx) * 3], 3);
    }
  return d;
}

}  // namespace

Result<Image> decode_image(std::span<const uint8_t> b, const Limits& lim) {
  if (b.empty()) return err("the image is empty");
  if (b.size() > lim.max_bytes) return err("{} bytes exceed the image size limit of {} bytes", b.size(), lim.max_bytes);
  const std::string_view fmt = sniff_format(b);
  if (fmt.empty()) return err("not a PNG, JPEG, WebP, GIF or BMP image");
  Image img;
  if (fmt == "webp") {
    int w = 0, h = 0;
    if (!WebPGetInfo(b.data(), b.size(), &w, &h)) return err("truncated or corrupt WebP image");
    KILN_TRY(check_dims(w, h, lim));
    uint8_t* px = WebPDecodeRGB(b.data(), b.size(), &w, &h);
    if (!px) return err("truncated or corrupt WebP image");
    img.w = w, img.h = h;
    img.rgb.assign(px, px + size_t(w) * size_t(h) * 3);
    WebPFree(px);
    return img;
  }
  if (b.size() > size_t(INT32_MAX)) return err("the image is too large");
  // Sizes from the headers of PNG / GIF / BMP first: stb_image refuses some huge ones with a
  // generic error, and the limit should be what the client hears.
  auto be32 = [&](size_t o) { return int64_t(b[o]) << 24 | int64_t(b[o + 1]) << 16 | int64_t(b[o + 2]) << 8 | b[o + 3]; };
  auto le16 = [&](size_t o) { return int64_t(b[o]) | int64_t(b[o + 1]) << 8; };
  auto le32 = [&](size_t o) { return int32_t(uint32_t(b[o]) | uint32_t(b[o + 1]) << 8 | uint32_t(b[o + 2]) << 16 | uint32_t(b[o + 3]) << 24); };
  int64_t hw = 0, hh = 0;
  if (fmt == "png" && b.size() >= 24) hw = be32(16), hh = be32(20);
  if (fmt == "gif" && b.size() >= 10) hw = le16(6), hh = le16(8);
  if (fmt == "bmp" && b.size() >= 26) hw = std::abs(int64_t(le32(18))), hh = std::abs(int64_t(le32(22)));
  if (hw > 0 && hh > 0 && (hw > lim.max_side || hh > lim.max_side || hw * hh > lim.max_pixels))
    return err("{}x{} pixels exceed the limit of {} pixels ({} per side)", hw, hh, lim.max_pixels, lim.max_side);
  int w = 0, h = 0, comp = 0;
  if (!stbi_info_from_memory(b.data(), int(b.size()), &w, &h, &comp))
    return err("truncated or corrupt {} image ({})", fmt, stbi_failure_reason() ? stbi_failure_reason() : "unreadable header");
  KILN_TRY(check_dims(w, h, lim));
  std::unique_ptr<uint8_t, void (*)(void*)> px(stbi_load_from_memory(b.data(), int(b.size()), &w, &h, &comp, 3),
                                               stbi_image_free);
  if (!px) return err("truncated or corrupt {} image ({})", fmt, stbi_failure_reason() ? stbi_failure_reason() : "decode failed");
  KILN_TRY(check_dims(w, h, lim));
  img.w = w, img.h = h;
  img.rgb.assign(px.get(), px.get() + size_t(w) * size_t(h) * 3);
  if (fmt == "jpeg") img = orient(img, exif_orientation(b));
  return img;
}

Result<std::vector<uint8_t>> base64_decode(std::string_view s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  while (!s.empty() && s.back() == '=') s.remove_suffix(1);
  if (s.size() % 4 == 1) return err("invalid base64: {} characters", s.size());
  std::vector<uint8_t> out;
  out.reserve(s.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const int v = val(s[i]);
    if (v < 0) return err("invalid base64 character at offset {}", i);
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
    }
  }
  return out;
}

Result<std::vector<uint8_t>> decode_data_url(std::string_view url, const Limits& lim) {
  if (url.substr(0, 5) != "data:") return err("not a data: URL");
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) return err("data: URL without ',' before the payload");
  std::string_view head = url.substr(5, comma - 5);
  const size_t semi = head.find(';');
  const std::string_view mime = head.substr(0, semi);
  if (semi == std::string_view::npos || head.substr(semi + 1) != "base64")
    return err("data: URL must be base64 (data:<mime>;base64,...)");
  std::string_view want;
  if (mime == "image/png") want = "png";
  else if (mime == "image/jpeg" || mime == "image/jpg") want = "jpeg";
  else if (mime == "image/webp") want = "webp";
  else if (mime == "image/gif") want = "gif";
  else if (mime == "image/bmp" || mime == "image/x-ms-bmp") want = "bmp";
  else return err("unsupported MIME type '{}' (image/png, image/jpeg, image/webp, image/gif, image/bmp)", mime);
  const std::string_view payload = url.substr(comma + 1);
  if (payload.size() / 4 * 3 > lim.max_bytes + 3)
    return err("the image ({} base64 characters) exceeds the size limit of {} bytes", payload.size(), lim.max_bytes);
  auto bytes = base64_decode(payload);
  KILN_TRY(bytes);
  const std::string_view got = sniff_format(*bytes);
  if (got != want)
    return err("declared {} but the data is {}", mime, got.empty() ? "not a supported image" : std::string(got));
  return bytes;
}

uint64_t image_hash(const Image& img) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const int32_t dims[2] = {img.w, img.h};
  XXH3_64bits_update(st, dims, sizeof dims);
  XXH3_64bits_update(st, img.rgb.data(), img.rgb.size());
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace kiln::media
