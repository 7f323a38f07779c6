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
#pragma once

#include <cstddef>
#include <cstdint>

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
  // Every byte zero, the backed pages kept: those in memory or swapped out
  // (the kernel's page map) are zeroed in place, the rest read zero
  // already. Cheaper than releasing pages that are about to be written
  // again (in a VM, a fresh page's fault costs about 10x its memset).
  void ZeroBacked();

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
  bool guarded_ = false;
};

}  // namespace herd
