// libFuzzer target for the GGUF reader: any byte string must either parse into a File whose
// every tensor lies inside the buffer, or return an Error naming the file. ASan + UBSan (see
// CMakeLists.txt) turn any out-of-bounds read, overflow or abort into a reported crash.
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "gguf/reader.h"

using namespace kiln::gguf;

namespace {
void exercise_accessors(const File& f) {
  for (const auto& kv : f.metadata()) {
    const std::string& k = kv.key;
    KILN_CHECK(f.find(k) == &kv.value, "find('{}') does not return the parsed value", k);
    (void)f.get_string(k);
    (void)f.get_int(k);
    (void)f.get_uint(k);
    (void)f.get_float(k);
    (void)f.get_bool(k);
    (void)f.get_string_array(k);
    (void)f.get_int_array(k);
    (void)f.get_float_array(k);
    (void)f.get_int_or(k, 0);
  }
  auto missing = f.get_string("fuzz.missing.key");
  KILN_CHECK(!f.has("fuzz.missing.key") ? !missing.ok() : true, "missing key returned a value");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Limits lim;
  lim.max_metadata_bytes = 64u << 20;  // keep the fuzzer's RSS small; the parser enforces it
  auto r = File::parse(std::span<const uint8_t>(data, size), "fuzz.gguf", lim);
  if (!r.ok()) {
    KILN_CHECK(r.error().message.rfind("fuzz.gguf: ", 0) == 0, "error does not name the file: {}", r.error().message);
    return 0;
  }
  const File& f = *r.value();
  KILN_CHECK(f.version() == 2 || f.version() == 3, "version {}", f.version());
  KILN_CHECK(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0, "alignment {}", f.alignment());
  KILN_CHECK(f.data_offset() % f.alignment() == 0, "data offset {}", f.data_offset());
  exercise_accessors(f);
  volatile uint8_t sink = 0;
  for (const auto& t : f.tensors()) {
    KILN_CHECK(f.find_tensor(t.name) == &t, "find_tensor('{}')", t.name);
    KILN_CHECK(t.n_dims >= 1 && t.n_dims <= 4 && t.n_bytes > 0, "tensor '{}' shape", t.name);
    KILN_CHECK(f.data_offset() + t.offset + t.n_bytes <= size, "tensor '{}' outside the buffer", t.name);
    // ASan reports these if the reader's bounds were wrong: libFuzzer's buffer is exactly `size`.
    const uint8_t* p = f.tensor_data(t);
    sink = sink + p[0] + p[t.n_bytes - 1];
  }
  (void)sink;
  return 0;
}
