#include <cstring>

#include "backend/backend.h"
#include "tensor/quant.h"

namespace kiln::backend {

using tensor::row_size;

Tensor Tensor::make(Buffer* buf, size_t offset, GgmlType type, std::array<int64_t, 4> ne) {
  Tensor t;
  t.buf = buf;
  t.offset = offset;
  t.type = type;
  t.ne = ne;
  t.nb[0] = gguf::type_info(type).type_size;
  t.nb[1] = row_size(type, ne[0]);
  t.nb[2] = t.nb[1] * size_t(ne[1]);
  t.nb[3] = t.nb[2] * size_t(ne[2]);
  if (buf) KILN_CHECK(offset + t.n_bytes() <= buf->size(), "tensor [{} {} {} {}] at {} overflows buffer of {}", ne[0], ne[1],
                      ne[2], ne[3], offset, buf->size());
  return t;
}

size_t Tensor::row_bytes() const { return row_size(type, ne[0]); }

size_t Tensor::n_bytes() const {
  if (n_elements() == 0) return 0;
  size_t last = row_bytes();
  for (int d = 1; d < 4; ++d) last += size_t(ne[d] - 1) * nb[d];
  return last;
}

bool Tensor::is_contiguous() const {
  return nb[1] == row_bytes() && nb[2] == nb[1] * size_t(ne[1]) && nb[3] == nb[2] * size_t(ne[2]);
}

Tensor Tensor::slice(int dim, int64_t start, int64_t n) const {
  KILN_CHECK(dim >= 1 && dim <= 3 && start >= 0 && n >= 0 && start + n <= ne[size_t(dim)], "slice dim {} [{}, +{}) of {}",
             dim, start, n, ne[size_t(dim)]);
  Tensor t = *this;
  t.offset += size_t(start) * nb[size_t(dim)];
  t.ne[size_t(dim)] = n;
  return t;
}

Tensor Tensor::reshape(std::array<int64_t, 4> new_ne) const {
  KILN_CHECK(is_contiguous(), "reshape of a non-contiguous tensor");
  KILN_CHECK(new_ne[0] * new_ne[1] * new_ne[2] * new_ne[3] == n_elements(), "reshape changes the element count");
  return make(buf, offset, type, new_ne);
}

void* Tensor::host() const {
  KILN_CHECK(buf != nullptr, "tensor has no buffer");
  void* p = buf->host_ptr();
  KILN_CHECK(p != nullptr, "tensor memory is not host-addressable");
  return static_cast<char*>(p) + offset;
}

size_t Arena::reserve(size_t bytes, size_t align) {
  KILN_CHECK(align > 0 && (align & (align - 1)) == 0, "arena alignment {} not a power of two", align);
  const size_t off = (size_ + align - 1) & ~(align - 1);
  size_ = off + bytes;
  return off;
}

size_t Arena::reserve_tensor(GgmlType type, std::array<int64_t, 4> ne) {
  return reserve(Tensor::make(nullptr, 0, type, ne).n_bytes());
}

void Arena::allocate(Device& dev) {
  if (!buf_ || buf_->size() < size_ || &buf_->device() != &dev) buf_ = dev.alloc(std::max<size_t>(size_, 64));
}

void Arena::reset() { size_ = 0; }

Tensor Arena::tensor(size_t offset, GgmlType type, std::array<int64_t, 4> ne) const {
  KILN_CHECK(buf_ != nullptr, "arena not allocated");
  return Tensor::make(buf_.get(), offset, type, ne);
}

}  // namespace kiln::backend

namespace kiln::backend {

// ---- Stream's default fused ops: exactly the unfused calls their comments name ----
void Stream::delta_prep(const Tensor& mixed, int64_t S, int64_t Hk, const Tensor& conv_w, const Tensor& seq,
                        const Tensor& conv_state, const Tensor& beta, const Tensor& g, const Tensor& dt_bias,
                        const Tensor& a, float eps, const Tensor& keep) {
  KILN_CHECK(mixed.type == GgmlType::F32 && mixed.ne[2] == 1 && mixed.ne[3] == 1 && mixed.ne[0] >= 2 * Hk * S,
             "delta_prep: mixed must be F32 [C >= 2*Hk*S, T]");
  delta_gates(beta, g, dt_bias, a);
  conv1d_silu(mixed, conv_w, seq, conv_state, mixed, keep);
  for (int64_t part = 0; part < 2; ++part) {  // q heads, then k heads: rows [S, Hk, T] of mixed
    Tensor h = mixed;
    h.offset += size_t(part * Hk * S) * 4;
    h.ne = {S, Hk, mixed.ne[1], 1};
    h.nb = {4, size_t(S) * 4, mixed.nb[1], mixed.nb[1] * size_t(mixed.ne[1])};
    l2_norm(h, h, eps);
  }
}

void Stream::gated_delta_norm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                              const Tensor& seq, const Tensor& state, const Tensor& out, int chunk,
                              const Tensor& norm_w, const Tensor& z, float eps, const Tensor& keep) {
  gated_delta(q, k, v, g, beta, seq, state, out, chunk, keep);
  rms_norm_gated(out, norm_w, z, eps);
}

}  // namespace kiln::backend
