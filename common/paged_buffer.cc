#include "common/paged_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <glog/logging.h>

namespace herd {
namespace {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

PagedBuffer::~PagedBuffer() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

PagedBuffer::PagedBuffer(PagedBuffer&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)), guarded_(other.guarded_) {}

PagedBuffer& PagedBuffer::operator=(PagedBuffer&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) ::munmap(base_, size_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    guarded_ = other.guarded_;
  }
  return *this;
}

StatusOr<PagedBuffer> PagedBuffer::Reserve(size_t bytes, bool guarded) {
  PagedBuffer b;
  if (bytes == 0) return b;
  const size_t page = PageSize();
  const size_t rounded = (bytes + page - 1) / page * page;
  void* p = ::mmap(nullptr, rounded, guarded ? PROT_NONE : PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Status::Unavailable("reserving " + std::to_string(bytes) + " bytes of address space: " +
                                     std::strerror(errno));
  }
  b.base_ = static_cast<char*>(p);
  b.size_ = rounded;
  b.guarded_ = guarded;
  return b;
}

void PagedBuffer::Admit(size_t offset, size_t bytes) {
  if (!guarded_ || bytes == 0) return;
  CHECK_LE(offset + bytes, size_);
  const size_t page = PageSize();
  const size_t first = offset / page * page;
  const size_t last = (offset + bytes + page - 1) / page * page;
  PCHECK(::mprotect(base_ + first, last - first, PROT_READ | PROT_WRITE) == 0) << "mprotect";
}

void PagedBuffer::Release(size_t offset, size_t bytes) {
  if (bytes == 0) return;
  CHECK_LE(offset + bytes, size_);
  const size_t page = PageSize();
  const size_t first = (offset + page - 1) / page * page;  // whole pages inside
  const size_t last = (offset + bytes) / page * page;
  if (first >= last) {  // within one or two pages: only partial ones
    std::memset(base_ + offset, 0, bytes);
    return;
  }
  std::memset(base_ + offset, 0, first - offset);
  std::memset(base_ + last, 0, offset + bytes - last);
  PCHECK(::madvise(base_ + first, last - first, MADV_DONTNEED) == 0) << "madvise";
  if (guarded_) PCHECK(::mprotect(base_ + first, last - first, PROT_NONE) == 0) << "mprotect";
}

void PagedBuffer::ZeroBacked() {
  if (size_ == 0) return;
  const size_t page = PageSize(), pages = size_ / page;
  // One 64-bit entry per page: bit 63 present, bit 62 swapped.
  std::vector<uint64_t> entries(pages);
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  PCHECK(fd >= 0) << "/proc/self/pagemap";
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(base_) / page * sizeof(uint64_t));
  const ssize_t want = static_cast<ssize_t>(pages * sizeof(uint64_t));
  const ssize_t got = ::pread(fd, entries.data(), want, at);
  ::close(fd);
  if (got != want) {  // no page map: zero it all
    std::memset(base_, 0, size_);
    return;
  }
  constexpr uint64_t kBacked = (uint64_t{1} << 63) | (uint64_t{1} << 62);
  for (size_t i = 0; i < pages;) {
    if ((entries[i] & kBacked) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < pages && (entries[j] & kBacked) != 0) ++j;
    std::memset(base_ + i * page, 0, (j - i) * page);
    i = j;
  }
}

}  // namespace herd
