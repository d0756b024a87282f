// `kiln gguf info FILE [--json] [--full]` — print a GGUF file's header, metadata, tensor table
// and per-type totals. Reads only the header (the tensor data is mapped, never touched), so a
// multi-gigabyte model prints in milliseconds. Errors name the file and exit with code 1.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "gguf/reader.h"
#include "gguf_cmds.h"

namespace kiln::tools {
namespace {

using gguf::File;
using gguf::TensorInfo;
using gguf::Value;
using gguf::ValueType;
using ojson = nlohmann::ordered_json;

constexpr size_t kTextArrayHead = 6;     // array elements shown in text mode
constexpr size_t kTextStringMax = 80;    // string bytes shown in text mode
constexpr size_t kJsonArrayHead = 16;    // array elements in JSON mode (without --full)

std::string type_desc(const Value& v) {
  if (v.type == ValueType::ARRAY) return fmt::format("array[{}]", gguf::value_type_name(v.elem_type));
  return std::string(gguf::value_type_name(v.type));
}

// Quoted, escaped, optionally truncated string for the text output.
std::string quote(const std::string& s, bool full) {
  std::string out = "\"";
  const size_t n = full ? s.size() : std::min(s.size(), kTextStringMax);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
  if (n < s.size()) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

std::string scalar_text(const Value& v, bool full) {
  switch (v.type) {
    case ValueType::UINT8: case ValueType::UINT16: case ValueType::UINT32: case ValueType::UINT64:
      return std::to_string(v.u);
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      return std::to_string(v.i);
    case ValueType::FLOAT32: return fmt::format("{}", static_cast<float>(v.f));
    case ValueType::FLOAT64: return fmt::format("{}", v.f);
    case ValueType::BOOL: return v.b ? "true" : "false";
    case ValueType::STRING: return quote(v.str, full);
    case ValueType::ARRAY: break;
  }
  return "?";
}

std::string value_text(const Value& v, bool full) {
  if (v.type != ValueType::ARRAY) return scalar_text(v, full);
  const size_t n = full ? v.arr.size() : std::min(v.arr.size(), kTextArrayHead);
  std::string out = fmt::format("[{}] [", v.arr.size());
  for (size_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    out += v.arr[i].type == ValueType::ARRAY ? value_text(v.arr[i], full) : scalar_text(v.arr[i], full);
  }
  if (n < v.arr.size()) out += ", ...";
  return out + "]";
}

ojson value_json(const Value& v, bool full) {
  switch (v.type) {
    case ValueType::UINT8: case ValueType::UINT16: case ValueType::UINT32: case ValueType::UINT64: return v.u;
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64: return v.i;
    case ValueType::FLOAT32: {  // shortest text that round-trips the f32 (1e-06, not 9.99999997e-07)
      const std::string t = fmt::format("{}", static_cast<float>(v.f));
      return std::isfinite(v.f) ? ojson(std::strtod(t.c_str(), nullptr)) : ojson(nullptr);
    }
    case ValueType::FLOAT64: return v.f;
    case ValueType::BOOL: return v.b;
    case ValueType::STRING: return v.str;
    case ValueType::ARRAY: {
      ojson a = ojson::array();
      const size_t n = full ? v.arr.size() : std::min(v.arr.size(), kJsonArrayHead);
      for (size_t i = 0; i < n; ++i) a.push_back(value_json(v.arr[i], full));
      return a;
    }
  }
  return nullptr;
}

std::string shape_text(const TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

std::string human_count(uint64_t n) {
  if (n >= 1000000000ull) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1000000ull) return fmt::format("{:.2f} M", n / 1e6);
  if (n >= 1000ull) return fmt::format("{:.2f} K", n / 1e3);
  return std::to_string(n);
}

std::string human_bytes(uint64_t n) {
  if (n >= (1ull << 30)) return fmt::format("{:.2f} GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return fmt::format("{:.2f} MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return fmt::format("{:.2f} KiB", n / double(1ull << 10));
  return fmt::format("{} B", n);
}

struct Totals {
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // name -> (count, bytes)
  uint64_t params = 0, bytes = 0;
};

Totals totals(const File& f) {
  Totals t;
  for (const auto& ti : f.tensors()) {
    auto& e = t.by_type[std::string(gguf::type_name(ti.type))];
    e.first += 1;
    e.second += ti.n_bytes;
    t.params += static_cast<uint64_t>(ti.n_elements());
    t.bytes += ti.n_bytes;
  }
  return t;
}

void print_text(const File& f, bool full) {
  const Totals tot = totals(f);
  std::printf("file         %s\n", f.path().c_str());
  std::printf("version      %u\n", f.version());
  std::printf("alignment    %llu\n", static_cast<unsigned long long>(f.alignment()));
  std::printf("file size    %llu bytes (%s)\n", static_cast<unsigned long long>(f.file_size()),
              human_bytes(f.file_size()).c_str());
  std::printf("data offset  %llu\n", static_cast<unsigned long long>(f.data_offset()));

  size_t kw = 3;
  for (const auto& kv : f.metadata()) kw = std::max(kw, kv.key.size());
  kw = std::min<size_t>(kw, 60);
  std::printf("\nmetadata (%zu keys)\n", f.metadata().size());
  for (const auto& kv : f.metadata())
    std::printf("  %-*s  %-14s %s\n", int(kw), kv.key.c_str(), type_desc(kv.value).c_str(),
                value_text(kv.value, full).c_str());

  size_t nw = 4;
  for (const auto& t : f.tensors()) nw = std::max(nw, t.name.size());
  std::printf("\ntensors (%zu)\n", f.tensors().size());
  if (!f.tensors().empty()) {
    std::printf("  %-*s  %-8s %-28s %14s %14s\n", int(nw), "NAME", "TYPE", "SHAPE", "BYTES", "OFFSET");
    for (const auto& t : f.tensors())
      std::printf("  %-*s  %-8s %-28s %14llu %14llu\n", int(nw), t.name.c_str(),
                  std::string(gguf::type_name(t.type)).c_str(), shape_text(t).c_str(),
                  static_cast<unsigned long long>(t.n_bytes), static_cast<unsigned long long>(t.offset));
    std::printf("\ntotals by type\n  %-8s %8s %14s\n", "TYPE", "COUNT", "BYTES");
    for (const auto& [name, cb] : tot.by_type)
      std::printf("  %-8s %8llu %14llu  (%s)\n", name.c_str(), static_cast<unsigned long long>(cb.first),
                  static_cast<unsigned long long>(cb.second), human_bytes(cb.second).c_str());
  }
  std::printf("\nparameters   %llu (%s)\n", static_cast<unsigned long long>(tot.params), human_count(tot.params).c_str());
  std::printf("tensor data  %llu bytes (%s)\n", static_cast<unsigned long long>(tot.bytes), human_bytes(tot.bytes).c_str());
}

void print_json(const File& f, bool full) {
  const Totals tot = totals(f);
  ojson j;
  j["file"] = f.path();
  j["version"] = f.version();
  j["alignment"] = f.alignment();
  j["file_size"] = f.file_size();
  j["data_offset"] = f.data_offset();
  ojson md = ojson::object();
  for (const auto& kv : f.metadata()) {
    ojson e;
    e["type"] = gguf::value_type_name(kv.value.type);
    if (kv.value.type == ValueType::ARRAY) {
      e["elem_type"] = gguf::value_type_name(kv.value.elem_type);
      e["length"] = kv.value.arr.size();
      e["truncated"] = !full && kv.value.arr.size() > kJsonArrayHead;
    }
    e["value"] = value_json(kv.value, full);
    md[kv.key] = std::move(e);
  }
  j["metadata"] = std::move(md);
  ojson ts = ojson::array();
  for (const auto& t : f.tensors()) {
    ojson e;
    e["name"] = t.name;
    e["type"] = gguf::type_name(t.type);
    ojson shape = ojson::array();
    for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
    e["shape"] = std::move(shape);
    e["n_elements"] = t.n_elements();
    e["n_bytes"] = t.n_bytes;
    e["offset"] = t.offset;
    ts.push_back(std::move(e));
  }
  j["tensors"] = std::move(ts);
  ojson by = ojson::object();
  for (const auto& [name, cb] : tot.by_type) by[name] = {{"count", cb.first}, {"bytes", cb.second}};
  j["totals_by_type"] = std::move(by);
  j["n_tensors"] = f.tensors().size();
  j["n_parameters"] = tot.params;
  j["tensor_bytes"] = tot.bytes;
  // Token strings need not be valid UTF-8: replace bad bytes rather than throw.
  const std::string s = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace

int gguf_info_main(int argc, char** argv) {
  CLI::App app{
      "Print a GGUF file's header, metadata (long arrays and strings shortened), tensor table\n"
      "(name, type, shape, bytes, offset), totals per tensor type, parameter count and size.\n"
      "Only the header is read. Exit code 0 on success, 1 if the file is unreadable or invalid.",
      "kiln gguf info"};
  std::string path;
  bool json = false, full = false;
  app.add_option("FILE", path, "GGUF file to inspect")->required();
  app.add_flag("--json", json, "print one JSON document instead of text (arrays: first 16 elements)");
  app.add_flag("--full", full, "do not shorten arrays or strings");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  auto f = File::open(path);
  if (!f.ok()) {
    std::fprintf(stderr, "kiln gguf info: error: %s\n", f.error().message.c_str());
    return 1;
  }
  if (json) print_json(*f.value(), full);
  else print_text(*f.value(), full);
  return 0;
}

}  // namespace kiln::tools
