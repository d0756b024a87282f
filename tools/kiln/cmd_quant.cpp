// `kiln quant …` — list the tensor types kiln can (de)quantize, and convert raw data between
// little-endian f32 and any supported block type with the reference code in tensor/quant.h.
// Used by users to inspect formats and by tests/py/test_dequant_oracle.py.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/result.h"
#include "gguf/types.h"
#include "subcommand.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

namespace {
using kiln::Result;
using kiln::Status;
using kiln::tensor::DTypeTraits;

Result<std::vector<char>> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return kiln::err("{}: cannot open for reading", path);
  std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return kiln::err("{}: read error", path);
  return data;
}

Status write_all(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return kiln::err("{}: cannot open for writing", path);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!f) return kiln::err("{}: write error", path);
  return {};
}

Result<const DTypeTraits*> lookup(const std::string& name) {
  auto t = kiln::gguf::type_from_name(name);
  if (!t) return kiln::err("--type {}: not a ggml tensor type (see `kiln quant types`)", name);
  const DTypeTraits* tr = kiln::tensor::dtype_traits(*t);
  if (!tr) return kiln::err("--type {}: no reference quantize/dequantize for this type (see `kiln quant types`)", name);
  return tr;
}

Status dequant(const std::string& type, const std::string& in, const std::string& out) {
  auto tr = lookup(type);
  KILN_TRY(tr);
  auto data = read_all(in);
  KILN_TRY(data);
  const DTypeTraits& t = **tr;
  if (data->size() % t.type_size != 0)
    return kiln::err("{}: size {} bytes is not a whole number of {} blocks ({} bytes each)", in, data->size(), t.name,
                     t.type_size);
  const int64_t n = static_cast<int64_t>(data->size() / t.type_size) * t.block_size;
  std::vector<float> y(static_cast<size_t>(n));
  kiln::tensor::dequantize_row(t.type, data->data(), y.data(), n);
  return write_all(out, y.data(), y.size() * sizeof(float));
}

Status quantize(const std::string& type, const std::string& in, const std::string& out) {
  auto tr = lookup(type);
  KILN_TRY(tr);
  auto data = read_all(in);
  KILN_TRY(data);
  const DTypeTraits& t = **tr;
  if (data->size() % (4 * t.block_size) != 0)
    return kiln::err("{}: size {} bytes is not a whole number of {} blocks ({} f32 values each)", in, data->size(),
                     t.name, t.block_size);
  const int64_t n = static_cast<int64_t>(data->size() / 4);
  std::vector<float> x(static_cast<size_t>(n));
  std::memcpy(x.data(), data->data(), data->size());
  if (t.block_size > 1) {  // F32/F16/BF16 carry non-finite values through; block types cannot
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(x[static_cast<size_t>(i)]))
        return kiln::err("{}: value {} (index {}) is not finite; {} cannot represent it", in, x[size_t(i)], i, t.name);
  }
  std::vector<uint8_t> q(kiln::tensor::row_size(t.type, n));
  kiln::tensor::quantize_row(t.type, x.data(), q.data(), n);
  return write_all(out, q.data(), q.size());
}

void print_types(bool json) {
  if (json) std::printf("[");
  bool first = true;
  if (!json) std::printf("%-8s %4s %6s %6s %8s  %s\n", "type", "id", "block", "bytes", "bpw", "vec_dot_type");
  for (const auto& t : kiln::tensor::all_dtype_traits()) {
    const auto vd = kiln::gguf::type_name(t.vec_dot_type);
    if (json) {
      std::printf("%s\n  {\"name\": \"%.*s\", \"id\": %u, \"block_size\": %u, \"type_size\": %u, \"bpw\": %.4f, "
                  "\"vec_dot_type\": \"%.*s\"}",
                  first ? "" : ",", int(t.name.size()), t.name.data(), static_cast<unsigned>(t.type), t.block_size,
                  t.type_size, t.bits_per_weight, int(vd.size()), vd.data());
    } else {
      std::printf("%-8.*s %4u %6u %6u %8.4f  %.*s\n", int(t.name.size()), t.name.data(), static_cast<unsigned>(t.type),
                  t.block_size, t.type_size, t.bits_per_weight, int(vd.size()), vd.data());
    }
    first = false;
  }
  if (json) std::printf("\n]\n");
}

int cmd_quant(int argc, char** argv) {
  CLI::App app{"Reference quantize/dequantize for GGUF tensor types (raw data, no GGUF header).\n"
               "Raw f32 files are little-endian float32; block files are the bytes GGUF stores for a\n"
               "tensor of that type (whole blocks).",
               "kiln quant"};
  app.require_subcommand(1);

  bool json = false;
  auto* types = app.add_subcommand("types", "list the types with reference quantize+dequantize: id, block size, "
                                            "bytes per block, bits per weight, mat-vec activation type");
  types->add_flag("--json", json, "print a JSON array instead of a table");

  std::string type, in, out;
  auto* dq = app.add_subcommand("dequant", "raw blocks of --type -> little-endian f32 (IN size: whole blocks)");
  dq->add_option("--type,-t", type, "tensor type, e.g. Q4_K (case-insensitive)")->required();
  dq->add_option("IN", in, "input file of raw blocks")->required();
  dq->add_option("OUT", out, "output file of f32 values")->required();

  auto* qz = app.add_subcommand("quantize", "little-endian f32 -> raw blocks of --type (IN: whole blocks of values, "
                                            "finite for block types)");
  qz->add_option("--type,-t", type, "tensor type, e.g. Q4_K (case-insensitive)")->required();
  qz->add_option("IN", in, "input file of f32 values")->required();
  qz->add_option("OUT", out, "output file of raw blocks")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;  // usage errors exit 2, like the other subcommands
  }
  Status st;
  if (types->parsed()) {
    print_types(json);
    return 0;
  }
  if (dq->parsed()) st = dequant(type, in, out);
  else if (qz->parsed()) st = quantize(type, in, out);
  if (!st.ok()) {
    std::fprintf(stderr, "kiln quant: %s\n", st.error().message.c_str());
    return 1;
  }
  return 0;
}
}  // namespace

KILN_SUBCOMMAND(quant, "list tensor types; quantize/dequantize raw data (types, quantize, dequant)", cmd_quant);
