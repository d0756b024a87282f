// engine/slot_file.h — the file format of a saved slot (llama-server's POST /slots/{id}?action=save /
//   restore): the slot's tokens, the KV rows of its attention layers and, for hybrid models, the
//   recurrent state at its end, with a header describing the model and memory layout it belongs to.
// Owns: writing and reading (validating) such files. Layout (little-endian): "KILNSLOT", u32
//   version, the Fingerprint fields, i64 n_tokens, i32 tokens[n], u8 kv[n * kv_bytes_per_pos],
//   f32 rec[rec_floats], u64 FNV-1a of every byte before it.
// Must not: touch the runner or the engine's state (the engine reads / writes those and passes the
//   bytes here).
// Threading: plain functions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"

namespace kiln::engine {

// What a saved slot must match to be restored: the model and the memory layout.
struct SlotFingerprint {
  std::string arch;
  int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_params_bytes = 0;
  uint64_t kv_bytes_per_pos = 0, rec_floats = 0;
};

struct SlotFile {
  SlotFingerprint fp;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> kv;   // tokens.size() * fp.kv_bytes_per_pos bytes
  std::vector<float> rec;    // fp.rec_floats
};

// Writes f to path (via a temporary file renamed into place); returns the bytes written.
Result<uint64_t> write_slot_file(const std::string& path, const SlotFile& f);
// Reads path; errors name the file and what is wrong (not a slot file, version, truncated, checksum,
// sizes inconsistent with the header). Does not compare against a model (see fingerprint_mismatch).
Result<SlotFile> read_slot_file(const std::string& path, uint64_t* bytes_read = nullptr);
// "" when `have` can be restored into a server whose memory is `want`, else which field differs.
std::string fingerprint_mismatch(const SlotFingerprint& have, const SlotFingerprint& want);

}  // namespace kiln::engine
