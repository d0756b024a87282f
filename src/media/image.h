// media/image.h — images in: bytes (a `data:` URL's payload or a fetched body) -> RGB8 pixels, and
//   the preprocessing the Qwen-VL projector expects (Pillow-compatible bicubic resize to a size
//   aligned to patch x merge within a token budget, then per-channel normalisation).
// Owns: format sniffing (PNG, JPEG, WebP, GIF first frame, BMP), decoding with maintained
//   libraries (Debian's stb_image for PNG/JPEG/GIF/BMP, libwebp for WebP), the JPEG EXIF orientation
//   (libexif), size and pixel-count limits checked before any pixel buffer is allocated, base64,
//   `data:` URL parsing, and the content hash the prefix cache keys image tokens by.
// Must not: fetch URLs (the server does), know about models or tensors.
// Threading: pure functions; safe from any thread.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace kiln::media {

struct Limits {
  size_t max_bytes = size_t(20) << 20;  // encoded size
  int64_t max_pixels = int64_t(50) << 20;  // width * height of the decoded image (decompression bombs)
  int max_side = 16384;
};

struct Image {
  int w = 0, h = 0;
  std::vector<uint8_t> rgb;  // h rows of w RGB triplets
};

// "png", "jpeg", "webp", "gif", "bmp", or "" when the bytes are none of these.
std::string_view sniff_format(std::span<const uint8_t> bytes);
// Decodes the first frame, applies the EXIF orientation of JPEGs, checks the limits (from the
// header, before decoding). Errors say what is wrong ("truncated or corrupt PNG", "9000x9000 pixels
// exceed the limit of ...").
Result<Image> decode_image(std::span<const uint8_t> bytes, const Limits& lim = {});

// Standard base64 (padding optional, whitespace not allowed). nullopt-like error on bad input.
Result<std::vector<uint8_t>> base64_decode(std::string_view s);
// A `data:` URL: "data:<mime>;base64,<payload>" with mime image/png|jpeg|jpg|webp|gif|bmp; the
// decoded bytes must be of the declared format. Errors name what is wrong.
Result<std::vector<uint8_t>> decode_data_url(std::string_view url, const Limits& lim = {});

// 64-bit content hash of the decoded pixels and their size (XXH3).
uint64_t image_hash(const Image& img);

// ---- preprocessing (llama.cpp's mtmd dyn_size preprocessor for Qwen-VL projectors) ----
struct PreprocessParams {
  int patch = 16, merge = 2;
  int64_t min_tokens = 8, max_tokens = 4096;  // tokens after the merge (--image-min-tokens / --image-max-tokens)
  float mean[3] = {0.5f, 0.5f, 0.5f}, std[3] = {0.5f, 0.5f, 0.5f};
};
// The resized size ("smart_resize"): each side a multiple of patch * merge, the aspect ratio kept,
// the area within [min_tokens, max_tokens] * (patch * merge)^2.
void target_size(int w, int h, const PreprocessParams& p, int& out_w, int& out_h);
// Pillow-compatible separable bicubic (a = -0.5) resize of RGB8 pixels.
Image resize_bicubic(const Image& src, int w, int h);
// Normalised planar pixels: chw[c * h * w + y * w + x] = (rgb / 255 - mean[c]) / std[c].
struct Pixels {
  int w = 0, h = 0;
  std::vector<float> chw;
};
Pixels preprocess(const Image& img, const PreprocessParams& p);

}  // namespace kiln::media
