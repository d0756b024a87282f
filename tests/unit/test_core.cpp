#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/copy_wide.h"
#include "core/fp16.h"
#include "core/overflow.h"
#include "core/result.h"

using namespace kiln;

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = fp16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_fp16(1.0f + 1.0f / 2048), 0x3c00);        // tie -> even (down)
  EXPECT_EQ(f32_to_fp16(1.0f + 3.0f / 2048), 0x3c02);        // tie -> even (up)
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);                  // overflow -> inf
  EXPECT_EQ(f32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(5.96046448e-08f), 0x0001);           // smallest subnormal
  EXPECT_EQ(f32_to_fp16(2.98023224e-08f), 0x0000);           // half of it: tie -> even (0)
  EXPECT_EQ(f32_to_fp16(-0.0f), 0x8000);
}

TEST(Bf16, RoundTripAndRounding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h);
  }
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000)), 0x3f82);
}

TEST(Overflow, DetectsWrap) {
  uint64_t out;
  EXPECT_FALSE(checked_mul<uint64_t>(1ull << 40, 1ull << 30, &out));
  EXPECT_TRUE(checked_mul<uint64_t>(1ull << 30, 1ull << 30, &out));
  EXPECT_FALSE(checked_add<uint64_t>(~0ull, 1, &out));
  EXPECT_FALSE(checked_align_up(~0ull - 3, 32, &out));
  EXPECT_TRUE(checked_align_up(33, 32, &out));
  EXPECT_EQ(out, 64u);
}

TEST(Result, CarriesValueOrError) {
  Result<int> a = 3;
  Result<int> b = err("file {}: key '{}' missing", "x.gguf", "k");
  EXPECT_TRUE(a.ok());
  EXPECT_EQ(*a, 3);
  EXPECT_FALSE(b.ok());
  EXPECT_EQ(b.error().message, "file x.gguf: key 'k' missing");
  EXPECT_EQ(b.value_or(7), 7);
}

// copy_wide: every byte lands where memcpy would put it, for sizes below, at and above the parallel split
// (odd sizes leave a short last part).
TEST(CopyWide, SameBytesAsMemcpy) {
  for (size_t n : {size_t(0), size_t(1), size_t(4097), (size_t(16) << 20) - 1, (size_t(16) << 20) + 13,
                   size_t(53) * 1000 * 1000 + 7}) {
    std::vector<uint8_t> src(n), dst(n + 1, 0xEE);
    for (size_t i = 0; i < n; ++i) src[i] = uint8_t(i * 131u + (i >> 13));
    copy_wide(dst.data(), src.data(), n);
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << n;
    EXPECT_EQ(dst[n], 0xEE) << n;  // nothing past the end
  }
}
