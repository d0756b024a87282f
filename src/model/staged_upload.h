// model/staged_upload.h — StagedUpload: host bytes (the file mapping, converted vectors) onto a GPU
//   through page-locked staging. Several threads copy into one of two staging buffers while the
//   other's bytes travel to the device on its own stream, so reading the mapping (page faults
//   included) overlaps the transfer. A copy from pageable memory would instead be staged by the
//   driver one buffer at a time on the calling thread.
// Owns: the two staging buffers (Device::alloc_host; pageable when page-locked memory is refused,
//   then correct but without the overlap), their streams and a copy thread pool.
//   KILN_STAGED_UPLOAD=0: each add() is a plain upload from the source (the pageable path, for
//   comparisons).
// Must not: outlive the Device; be used by two threads.
// Threading: one thread calls add() / finish(); the copies into staging use its own pool.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace kiln::model {

class StagedUpload {
 public:
  explicit StagedUpload(backend::Device& dev, size_t stage_bytes = size_t(64) << 20);
  ~StagedUpload();
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // dst (contiguous, on the device) := the n bytes at src. src must stay valid until the call
  // returns (it has been copied by then); dst is written by finish() at the latest.
  void add(const backend::Tensor& dst, const void* src, size_t n);
  // Waits until every added byte is on the device.
  void finish();

 private:
  struct Stage {
    std::unique_ptr<backend::Buffer> buf;
    std::unique_ptr<backend::Stream> st;
    size_t used = 0;
    struct Piece {
      backend::Tensor dst;
      size_t off, n;
    };
    std::vector<Piece> pieces;
  };
  void send(Stage& s);  // enqueue s's pieces on s's stream

  backend::Device& dev_;
  size_t stage_bytes_;
  Stage stages_[2];
  int cur_ = 0;
  std::unique_ptr<ThreadPool> pool_;
  bool direct_ = false;  // KILN_STAGED_UPLOAD=0
};

}  // namespace kiln::model
