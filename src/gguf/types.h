// gguf/types.h — format facts shared by the GGUF reader and writer: metadata value
// types and the ggml tensor type ids with their block geometry.
// Owns: GgmlType ids exactly as GGUF stores them, names as llama.cpp spells them.
// Must not: know about models or how to compute with a type (that is tensor/ and kernels/).
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
inline constexpr uint32_t kDefaultAlignment = 32;

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
inline constexpr uint32_t kValueTypeCount = 13;
std::string_view value_type_name(ValueType t);

// ggml tensor type ids (ggml.h). Gaps are ids retired upstream; readers reject them.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct TypeInfo {
  GgmlType type;
  std::string_view name;    // as llama.cpp prints it: "Q4_K", "IQ4_XS", "BF16"
  uint32_t block_size;      // elements per block (1 for plain types)
  uint32_t type_size;       // bytes per block
};

// nullopt for an id that is not a known ggml type.
std::optional<TypeInfo> type_info(uint32_t id);
const TypeInfo& type_info(GgmlType t);  // t must be a known type
std::optional<GgmlType> type_from_name(std::string_view name);  // case-insensitive
inline std::string_view type_name(GgmlType t) { return type_info(t).name; }

}  // namespace kiln::gguf
