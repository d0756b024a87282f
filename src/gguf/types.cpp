#include "gguf/types.h"

#include <array>
#include <cctype>

#include "core/check.h"

namespace kiln::gguf {
namespace {
// Block geometry from ggml-common.h (facts of the format).
constexpr std::array<TypeInfo, 33> kTypes = {{
    {GgmlType::F32, "F32", 1, 4},         {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 18},     {GgmlType::Q4_1, "Q4_1", 32, 20},
    {GgmlType::Q5_0, "Q5_0", 32, 22},     {GgmlType::Q5_1, "Q5_1", 32, 24},
    {GgmlType::Q8_0, "Q8_0", 32, 34},     {GgmlType::Q8_1, "Q8_1", 32, 36},
    {GgmlType::Q2_K, "Q2_K", 256, 84},    {GgmlType::Q3_K, "Q3_K", 256, 110},
    {GgmlType::Q4_K, "Q4_K", 256, 144},   {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210},   {GgmlType::Q8_K, "Q8_K", 256, 292},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66}, {GgmlType::IQ2_XS, "IQ2_XS", 256, 74},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98}, {GgmlType::IQ1_S, "IQ1_S", 256, 50},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18}, {GgmlType::IQ3_S, "IQ3_S", 256, 110},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82},  {GgmlType::IQ4_XS, "IQ4_XS", 256, 136},
    {GgmlType::I8, "I8", 1, 1},           {GgmlType::I16, "I16", 1, 2},
    {GgmlType::I32, "I32", 1, 4},         {GgmlType::I64, "I64", 1, 8},
    {GgmlType::F64, "F64", 1, 8},         {GgmlType::IQ1_M, "IQ1_M", 256, 56},
    {GgmlType::BF16, "BF16", 1, 2},       {GgmlType::TQ1_0, "TQ1_0", 256, 54},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66},  {GgmlType::MXFP4, "MXFP4", 32, 17},
    {GgmlType::F32, "", 0, 0},  // sentinel, never matched (block_size 0)
}};
}  // namespace

std::string_view value_type_name(ValueType t) {
  static constexpr std::string_view names[] = {"u8",  "i8",   "u16",   "i16", "u32", "i32", "f32",
                                               "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i < kValueTypeCount ? names[i] : "unknown";
}

std::optional<TypeInfo> type_info(uint32_t id) {
  for (const auto& t : kTypes)
    if (t.block_size != 0 && static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const TypeInfo& type_info(GgmlType t) {
  for (const auto& ti : kTypes)
    if (ti.block_size != 0 && ti.type == t) return ti;
  KILN_CHECK(false, "unknown GgmlType {}", static_cast<uint32_t>(t));
  __builtin_unreachable();
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const auto& t : kTypes) {
    if (t.block_size == 0 || t.name.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < name.size() && eq; ++i)
      eq = std::toupper(static_cast<unsigned char>(name[i])) == std::toupper(static_cast<unsigned char>(t.name[i]));
    if (eq) return t.type;
  }
  return std::nullopt;
}

}  // namespace kiln::gguf
