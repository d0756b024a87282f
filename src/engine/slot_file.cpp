// engine/slot_file.cpp — see slot_file.h.
#include "engine/slot_file.h"

#include <cstdio>
#include <cstring>
#include <memory>

namespace kiln::engine {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'S', 'L', 'O', 'T'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kMaxTokens = uint64_t(1) << 26;  // sanity bound on a header's counts

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
};

struct Out {
  std::FILE* f;
  Fnv fnv;
  uint64_t n = 0;
  bool ok = true;
  void put(const void* p, size_t k) {
    if (k == 0) return;
    ok = ok && std::fwrite(p, 1, k, f) == k;
    fnv.add(p, k);
    n += k;
  }
  template <class T>
  void pod(T v) { put(&v, sizeof v); }
};

struct In {
  std::FILE* f;
  Fnv fnv;
  uint64_t n = 0;
  bool get(void* p, size_t k) {
    if (k == 0) return true;
    if (std::fread(p, 1, k, f) != k) return false;
    fnv.add(p, k);
    n += k;
    return true;
  }
  template <class T>
  bool pod(T& v) { return get(&v, sizeof v); }
};

struct FileCloser {
  void operator()(std::FILE* f) const { if (f) std::fclose(f); }
};

}  // namespace

Result<uint64_t> write_slot_file(const std::string& path, const SlotFile& f) {
  const std::string tmp = path + ".tmp";
  std::unique_ptr<std::FILE, FileCloser> fp(std::fopen(tmp.c_str(), "wb"));
  if (!fp) return err("{}: cannot create: {}", tmp, std::strerror(errno));
  Out o{fp.get()};
  o.put(kMagic, sizeof kMagic);
  o.pod(kVersion);
  o.pod(uint32_t(f.fp.arch.size()));
  o.put(f.fp.arch.data(), f.fp.arch.size());
  o.pod(f.fp.n_vocab), o.pod(f.fp.n_embd), o.pod(f.fp.n_layer), o.pod(f.fp.n_params_bytes);
  o.pod(f.fp.kv_bytes_per_pos), o.pod(f.fp.rec_floats);
  o.pod(int64_t(f.tokens.size()));
  o.put(f.tokens.data(), f.tokens.size() * sizeof(int32_t));
  o.put(f.kv.data(), f.kv.size());
  o.put(f.rec.data(), f.rec.size() * sizeof(float));
  const uint64_t sum = o.fnv.h;
  o.pod(sum);
  if (!o.ok || std::fflush(fp.get()) != 0) return err("{}: write failed: {}", tmp, std::strerror(errno));
  fp.reset();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return err("{}: cannot rename into place: {}", path, std::strerror(errno));
  return o.n;
}

Result<SlotFile> read_slot_file(const std::string& path, uint64_t* bytes_read) {
  std::unique_ptr<std::FILE, FileCloser> fp(std::fopen(path.c_str(), "rb"));
  if (!fp) return err("{}: cannot open: {}", path, std::strerror(errno));
  In in{fp.get()};
  char magic[8];
  uint32_t version = 0, arch_len = 0;
  if (!in.get(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof kMagic) != 0)
    return err("{}: not a kiln slot file", path);
  if (!in.pod(version) || version != kVersion) return err("{}: slot file version {} (expected {})", path, version, kVersion);
  SlotFile f;
  if (!in.pod(arch_len) || arch_len > 256) return err("{}: truncated or corrupt header", path);
  f.fp.arch.resize(arch_len);
  int64_t n_tok = 0;
  if (!in.get(f.fp.arch.data(), arch_len) || !in.pod(f.fp.n_vocab) || !in.pod(f.fp.n_embd) || !in.pod(f.fp.n_layer) ||
      !in.pod(f.fp.n_params_bytes) || !in.pod(f.fp.kv_bytes_per_pos) || !in.pod(f.fp.rec_floats) || !in.pod(n_tok))
    return err("{}: truncated header", path);
  if (n_tok < 0 || uint64_t(n_tok) > kMaxTokens || f.fp.kv_bytes_per_pos > (uint64_t(1) << 30) ||
      f.fp.rec_floats > (uint64_t(1) << 34))
    return err("{}: corrupt header (n_tokens {}, kv bytes per position {}, recurrent floats {})", path, n_tok,
               f.fp.kv_bytes_per_pos, f.fp.rec_floats);
  f.tokens.resize(size_t(n_tok));
  f.kv.resize(size_t(n_tok) * size_t(f.fp.kv_bytes_per_pos));
  f.rec.resize(size_t(f.fp.rec_floats));
  if (!in.get(f.tokens.data(), f.tokens.size() * sizeof(int32_t)) || !in.get(f.kv.data(), f.kv.size()) ||
      !in.get(f.rec.data(), f.rec.size() * sizeof(float)))
    return err("{}: truncated ({} bytes read)", path, in.n);
  const uint64_t want = in.fnv.h;
  uint64_t sum = 0;
  if (std::fread(&sum, 1, sizeof sum, fp.get()) != sizeof sum) return err("{}: truncated (no checksum)", path);
  if (sum != want) return err("{}: checksum mismatch (the file is corrupt)", path);
  if (std::fgetc(fp.get()) != EOF) return err("{}: trailing bytes after the checksum", path);
  if (bytes_read) *bytes_read = in.n + sizeof sum;
  for (int32_t t : f.tokens)
    if (t < 0 || t >= f.fp.n_vocab) return err("{}: token id {} outside the vocabulary of {}", path, t, f.fp.n_vocab);
  return f;
}

std::string fingerprint_mismatch(const SlotFingerprint& have, const SlotFingerprint& want) {
  if (have.arch != want.arch) return fmt::format("architecture {} (this server: {})", have.arch, want.arch);
  const std::pair<const char*, std::pair<uint64_t, uint64_t>> fields[] = {
      {"n_vocab", {uint64_t(have.n_vocab), uint64_t(want.n_vocab)}},
      {"n_embd", {uint64_t(have.n_embd), uint64_t(want.n_embd)}},
      {"n_layer", {uint64_t(have.n_layer), uint64_t(want.n_layer)}},
      {"weight bytes", {uint64_t(have.n_params_bytes), uint64_t(want.n_params_bytes)}},
      {"KV bytes per position (cache types)", {have.kv_bytes_per_pos, want.kv_bytes_per_pos}},
      {"recurrent state size", {have.rec_floats, want.rec_floats}},
  };
  for (const auto& [name, v] : fields)
    if (v.first != v.second) return fmt::format("{} {} (this server: {})", name, v.first, v.second);
  return "";
}

}  // namespace kiln::engine
