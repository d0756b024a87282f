#include "core/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace kiln {

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path, LoadMode mode) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return err("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return err("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return err("{}: not a regular file", path);
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ == 0) {
    ::close(fd);
    static const uint8_t empty = 0;
    f->data_ = &empty;
    return f;
  }
  if (mode == LoadMode::Read) {
    f->owned_.reset(new (std::nothrow) uint8_t[f->size_]);
    if (!f->owned_) {
      ::close(fd);
      return err("{}: out of memory reading {} bytes", path, f->size_);
    }
    size_t done = 0;
    while (done < f->size_) {
      ssize_t n = ::read(fd, f->owned_.get() + done, f->size_ - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int e = errno;
        ::close(fd);
        return err("{}: read failed at byte {}: {}", path, done, n == 0 ? "unexpected end of file" : std::strerror(e));
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    f->data_ = f->owned_.get();
    return f;
  }
  void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return err("{}: mmap failed: {}", path, std::strerror(e));
  f->data_ = static_cast<const uint8_t*>(p);
  f->mapped_ = true;
  if (mode == LoadMode::Mlock) {
    if (::mlock(p, f->size_) == 0) {
      f->locked_ = true;
    } else {
      KILN_LOG_WARN("{}: mlock of {} bytes failed ({}); continuing unlocked (raise RLIMIT_MEMLOCK)", path,
                    f->size_, std::strerror(errno));
    }
  }
  return f;
}

MappedFile::~MappedFile() {
  if (mapped_) {
    if (locked_) ::munlock(const_cast<uint8_t*>(data_), size_);
    ::munmap(const_cast<uint8_t*>(data_), size_);
  }
}

}  // namespace kiln
