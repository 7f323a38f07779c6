// A buffer reserved whole in the address space but backed by memory only
// where it is in use: how a worker that streams its weights
// (cluster.stream_weights) holds the flat parameter space, so that every
// offset keeps its meaning while its memory follows a window of layers.
//
// Pages are backed on first write. Release(range) hands the range's whole
// pages back to the kernel and zeroes its bytes in the pages it shares with
// its neighbours, so a released range reads zero when it is used again. A
// guarded buffer also makes released whole pages inaccessible until Admit:
// a read of weights outside the window faults at once instead of reading
// zeros. Pages straddling a range's ends stay accessible and resident (at
// most one page per end).
//
// An unguarded buffer may keep a pool of pages (KeepPool): Release hands
// the pool's pages back to it rather than to the kernel, and Recycle backs
// a range about to be written with them, mapped and zeroed. Released
// memory is then used again without a fault per page (in a VM, a fresh
// page's fault costs about 10x its memset), as a caching allocator reuses
// its blocks. The pool's pages are the buffer's memory whether a range
// holds them or not; they count in the process's resident size only while
// mapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace herd {

class PagedBuffer {
 public:
  PagedBuffer() = default;
  ~PagedBuffer();
  PagedBuffer(PagedBuffer&& other) noexcept;
  PagedBuffer& operator=(PagedBuffer&& other) noexcept;
  PagedBuffer(const PagedBuffer&) = delete;
  PagedBuffer& operator=(const PagedBuffer&) = delete;

  // `bytes` of address space, none of it backed; `guarded`: inaccessible
  // until admitted, else readable and writable from the start.
  static StatusOr<PagedBuffer> Reserve(size_t bytes, bool guarded);

  char* data() const { return base_; }
  size_t size() const { return size_; }
  bool guarded() const { return guarded_; }

  // Makes [offset, offset + bytes) accessible (a guarded buffer's pages
  // touching it); a no-op otherwise.
  void Admit(size_t offset, size_t bytes);
  // Gives [offset, offset + bytes) back: whole pages to the kernel (and,
  // guarded, out of reach), the bytes in partial pages zeroed.
  void Release(size_t offset, size_t bytes);
  // Sets aside `bytes` (whole pages, rounded up) of memory for Recycle: a
  // memfd, whose pages are allocated as Recycle first uses them.
  // Unguarded buffers only; once.
  Status KeepPool(size_t bytes);
  // Zeroes [offset, offset + bytes), which is about to be written: its
  // whole pages are backed at once by pages of the pool while the pool has
  // any (pages the pool backs already are zeroed in place), and the rest
  // are given back to be backed on first write as ever. What the range
  // held is lost.
  void Recycle(size_t offset, size_t bytes);
  size_t pool_pages() const { return pool_size_; }
  size_t free_pool_pages() const { return free_pool_.size(); }

  // Every byte zero, the backed pages kept: those in memory or swapped out
  // (the kernel's page map) are zeroed in place, the rest read zero
  // already. Cheaper than releasing pages that are about to be written
  // again (in a VM, a fresh page's fault costs about 10x its memset).
  void ZeroBacked();

 private:
  // Gives whole pages [first, last) (page indices) back: the pool's to the
  // pool (the range mapped anonymous again), the rest to the kernel.
  void ReleasePages(size_t first, size_t last);
  // Maps pool page `pool` and the ones after it over `pages` pages from
  // page `first`.
  void MapPool(size_t first, size_t pages, int32_t pool);
  // Whether page `page` (an index) is backed by the pool.
  bool Pooled(size_t page) const { return !pool_of_.empty() && pool_of_[page] >= 0; }
  void Unmap();

  char* base_ = nullptr;
  size_t size_ = 0;
  bool guarded_ = false;
  // The pool (KeepPool): its memfd, its size in pages, the pool page that
  // backs each page of the buffer (-1: none), and the pool's free pages.
  int pool_fd_ = -1;
  size_t pool_size_ = 0;
  std::vector<int32_t> pool_of_;
  std::vector<int32_t> free_pool_;
};

}  // namespace herd
