#include "common/paged_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
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

PagedBuffer::~PagedBuffer() { Unmap(); }

void PagedBuffer::Unmap() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (pool_fd_ >= 0) ::close(pool_fd_);
  base_ = nullptr;
  size_ = 0;
  pool_fd_ = -1;
  pool_size_ = 0;
  pool_of_.clear();
  free_pool_.clear();
}

PagedBuffer::PagedBuffer(PagedBuffer&& other) noexcept { *this = std::move(other); }

PagedBuffer& PagedBuffer::operator=(PagedBuffer&& other) noexcept {
  if (this != &other) {
    Unmap();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    guarded_ = other.guarded_;
    pool_fd_ = std::exchange(other.pool_fd_, -1);
    pool_size_ = std::exchange(other.pool_size_, 0);
    pool_of_ = std::exchange(other.pool_of_, {});
    free_pool_ = std::exchange(other.free_pool_, {});
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

Status PagedBuffer::KeepPool(size_t bytes) {
  CHECK(!guarded_ && pool_fd_ < 0) << "a page pool is for an unguarded buffer, once";
  const size_t page = PageSize(), pages = (bytes + page - 1) / page;
  if (pages == 0) return Status::OK();
  const int fd = ::memfd_create("herd-page-pool", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(pages * page)) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return Status::Unavailable("a pool of " + std::to_string(pages * page) + " bytes of pages: " + why);
  }
  pool_fd_ = fd;
  pool_size_ = pages;
  pool_of_.assign(size_ / page, -1);
  // Sorted descending, taken from the back.
  for (size_t p = pages; p-- > 0;) free_pool_.push_back(static_cast<int32_t>(p));
  return Status::OK();
}

void PagedBuffer::MapPool(size_t first, size_t pages, int32_t pool) {
  const size_t page = PageSize();
  void* at = base_ + first * page;
  // MAP_POPULATE: the page table is filled in one call, not a fault a page.
  void* p = ::mmap(at, pages * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, pool_fd_,
                   static_cast<off_t>(pool) * static_cast<off_t>(page));
  PCHECK(p == at) << "mapping " << pages << " pages of the page pool";
  for (size_t i = 0; i < pages; ++i) pool_of_[first + i] = pool + static_cast<int32_t>(i);
}

void PagedBuffer::Recycle(size_t offset, size_t bytes) {
  if (bytes == 0) return;
  CHECK_LE(offset + bytes, size_);
  const size_t page = PageSize();
  const size_t first = (offset + page - 1) / page;  // whole pages inside
  const size_t last = (offset + bytes) / page;
  if (first >= last) {
    std::memset(base_ + offset, 0, bytes);
    return;
  }
  std::memset(base_ + offset, 0, first * page - offset);
  std::memset(base_ + last * page, 0, offset + bytes - last * page);
  for (size_t p = first; p < last;) {
    size_t q = p;
    if (Pooled(p)) {
      while (q < last && Pooled(q)) ++q;
      std::memset(base_ + p * page, 0, (q - p) * page);
      p = q;
      continue;
    }
    while (q < last && !Pooled(q)) ++q;
    const size_t take = std::min(q - p, free_pool_.size());
    if (take > 0) {
      // The lowest free pages, ascending.
      std::vector<int32_t> got(free_pool_.rbegin(), free_pool_.rbegin() + static_cast<std::ptrdiff_t>(take));
      free_pool_.resize(free_pool_.size() - take);
      for (size_t i = 0; i < take;) {
        size_t j = i + 1;
        while (j < take && got[j] == got[j - 1] + 1) ++j;
        MapPool(p + i, j - i, got[i]);
        i = j;
      }
      std::memset(base_ + p * page, 0, take * page);  // what the pool's pages held last
    }
    if (p + take < q) PCHECK(::madvise(base_ + (p + take) * page, (q - p - take) * page, MADV_DONTNEED) == 0);
    p = q;
  }
}

void PagedBuffer::ReleasePages(size_t first, size_t last) {
  const size_t page = PageSize();
  for (size_t p = first; p < last;) {
    size_t q = p;
    char* at = base_ + p * page;
    if (Pooled(p)) {
      // The free pages stay sorted, the lowest last, so that what Recycle
      // takes maps in few contiguous runs.
      const size_t had = free_pool_.size();
      for (; q < last && Pooled(q); ++q) free_pool_.push_back(std::exchange(pool_of_[q], -1));
      std::sort(free_pool_.begin() + static_cast<std::ptrdiff_t>(had), free_pool_.end(), std::greater<>());
      std::inplace_merge(free_pool_.begin(), free_pool_.begin() + static_cast<std::ptrdiff_t>(had), free_pool_.end(),
                         std::greater<>());
      void* r = ::mmap(at, (q - p) * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                       -1, 0);
      PCHECK(r == at) << "giving " << (q - p) << " pages back to the page pool";
    } else {
      while (q < last && !Pooled(q)) ++q;
      PCHECK(::madvise(at, (q - p) * page, MADV_DONTNEED) == 0) << "madvise";
      if (guarded_) PCHECK(::mprotect(at, (q - p) * page, PROT_NONE) == 0) << "mprotect";
    }
    p = q;
  }
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
  ReleasePages(first / page, last / page);
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
