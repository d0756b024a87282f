#include "model/staged_upload.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/check.h"

namespace kiln::model {

StagedUpload::StagedUpload(backend::Device& dev, size_t stage_bytes) : dev_(dev), stage_bytes_(stage_bytes) {
  KILN_CHECK(stage_bytes_ >= (size_t(1) << 20), "StagedUpload: stage of {} bytes", stage_bytes_);
  const char* env = std::getenv("KILN_STAGED_UPLOAD");
  direct_ = env && std::strcmp(env, "0") == 0;
  if (direct_) {
    stages_[0].st = dev_.create_stream();
    return;
  }
  for (Stage& s : stages_) {
    s.buf = dev_.alloc_host(stage_bytes_);
    s.st = dev_.create_stream();
  }
  pool_ = std::make_unique<ThreadPool>(int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
}

StagedUpload::~StagedUpload() = default;

void StagedUpload::send(Stage& s) {
  auto* base = static_cast<const uint8_t*>(s.buf->host_ptr());
  for (const Stage::Piece& p : s.pieces) s.st->upload(p.dst, base + p.off, p.n);
  s.pieces.clear();
}

void StagedUpload::add(const backend::Tensor& dst, const void* src, size_t n) {
  KILN_CHECK(dst.is_contiguous() && n <= dst.n_bytes(), "StagedUpload: {} bytes into a {}-byte tensor", n,
             dst.n_bytes());
  if (direct_) {
    stages_[0].st->upload(dst, src, n);
    return;
  }
  const auto* from = static_cast<const uint8_t*>(src);
  for (size_t done = 0; done < n;) {
    Stage* s = &stages_[cur_];
    if (s->used == stage_bytes_) {  // full: on its way; the other stage is reused once its bytes arrived
      send(*s);
      cur_ ^= 1;
      s = &stages_[cur_];
      s->st->synchronize();
      s->used = 0;
    }
    const size_t take = std::min(n - done, stage_bytes_ - s->used);
    uint8_t* to = static_cast<uint8_t*>(s->buf->host_ptr()) + s->used;
    // The copy in 1 MiB pieces over the pool (reading the mapping faults its pages in in parallel).
    const int64_t parts = int64_t((take + (size_t(1) << 20) - 1) >> 20);
    pool_->parallel_for(parts, [&](int64_t b, int64_t e, int) {
      const size_t lo = size_t(b) << 20, hi = std::min(take, size_t(e) << 20);
      std::memcpy(to + lo, from + done + lo, hi - lo);
    });
    const backend::Tensor piece =
        backend::Tensor::make(dst.buf, dst.offset + done, gguf::GgmlType::I8, {int64_t(take), 1, 1, 1});
    s->pieces.push_back({piece, s->used, take});
    s->used += take;
    done += take;
  }
}

void StagedUpload::finish() {
  if (!direct_) send(stages_[cur_]);
  for (Stage& s : stages_) {
    if (s.st) s.st->synchronize();
    s.used = 0;
  }
  cur_ = 0;
}

}  // namespace kiln::model
