// The emulated device: a fiber per CUDA thread, and the CUDA runtime calls
// herd makes, over host memory. See device_emulation.h for what it models.
#include "model/cuda/emulation/device_emulation.h"

#include <glog/logging.h>

#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"

namespace herd_emu {

thread_local ThreadCoordinates coords;

namespace {

namespace ctx = boost::context;

constexpr size_t kStackBytes = 128 << 10;

// Fiber stacks, reused across blocks and launches (a launch makes a fiber
// per thread of each block).
class StackPool {
 public:
  ctx::stack_context allocate() {
    void* base;
    if (!free_.empty()) {
      base = free_.back();
      free_.pop_back();
    } else {
      base = std::malloc(kStackBytes);
      CHECK(base != nullptr) << "emulated device: out of memory for a thread stack";
    }
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(base) + kStackBytes;
    return sc;
  }
  void deallocate(ctx::stack_context& sc) { free_.push_back(static_cast<char*>(sc.sp) - sc.size); }
  ~StackPool() {
    for (void* p : free_) std::free(p);
  }

 private:
  std::vector<void*> free_;
};

// A reference to the pool, copyable as boost.context wants its allocators.
struct PooledStack {
  StackPool* pool;
  ctx::stack_context allocate() { return pool->allocate(); }
  void deallocate(ctx::stack_context& sc) { pool->deallocate(sc); }
};

enum class State { kRunnable, kBlockBarrier, kWarpBarrier, kDone };

struct EmuThread {
  uint3 idx;
  int warp = 0, lane = 0;
  uint64_t gathers = 0;  // WarpAllGather calls so far
  State state = State::kRunnable;
  ctx::fiber self;       // this thread, while it is suspended
  ctx::fiber scheduler;  // the block's scheduler, while this thread runs
};

// One block in flight on this host thread.
struct BlockRun {
  std::vector<EmuThread> threads;
  std::vector<uint64_t> warp_slots;  // [warps][32] shuffle mailboxes
  std::vector<unsigned char> warp_bytes;  // [warps][2][32 * kGatherBytes] gather mailboxes
  std::vector<unsigned char> dynamic_shared;
  EmuThread* current = nullptr;
};

thread_local BlockRun* block_run = nullptr;
thread_local StackPool stack_pool;

void Suspend(State why) {
  EmuThread* t = block_run->current;
  t->state = why;
  t->scheduler = std::move(t->scheduler).resume();
}

// Wakes the threads whose barrier is complete; false if none could be.
bool ReleaseBarriers(BlockRun& run, int warps) {
  bool released = false;
  for (int w = 0; w < warps; ++w) {
    bool all_waiting = true, any_waiting = false;
    for (int lane = 0; lane < 32; ++lane) {
      const size_t i = static_cast<size_t>(w) * 32 + lane;
      if (i >= run.threads.size()) break;
      const State s = run.threads[i].state;
      if (s == State::kWarpBarrier)
        any_waiting = true;
      else if (s != State::kDone)
        all_waiting = false;
    }
    if (any_waiting && all_waiting) {
      for (EmuThread& t : run.threads)
        if (t.warp == w && t.state == State::kWarpBarrier) t.state = State::kRunnable;
      released = true;
    }
  }
  if (released) return true;
  bool all_at_block_barrier = true, any = false;
  for (const EmuThread& t : run.threads) {
    if (t.state == State::kDone) continue;
    any = true;
    if (t.state != State::kBlockBarrier) all_at_block_barrier = false;
  }
  if (!any || !all_at_block_barrier) return false;
  for (EmuThread& t : run.threads)
    if (t.state == State::kBlockBarrier) t.state = State::kRunnable;
  return true;
}

void RunBlock(BlockRun& run, const std::function<void()>& body) {
  const dim3 bd = coords.block_dim;
  const int n = static_cast<int>(bd.x * bd.y * bd.z);
  const int warps = (n + 31) / 32;
  run.threads.clear();
  run.threads.resize(n);
  run.warp_slots.assign(static_cast<size_t>(warps) * 32, 0);
  run.warp_bytes.assign(static_cast<size_t>(warps) * 2 * 32 * kGatherBytes, 0);
  std::fill(run.dynamic_shared.begin(), run.dynamic_shared.end(), 0xff);
  for (int i = 0; i < n; ++i) {
    EmuThread& t = run.threads[i];
    t.idx = uint3{static_cast<unsigned>(i % bd.x), static_cast<unsigned>((i / bd.x) % bd.y),
                  static_cast<unsigned>(i / (bd.x * bd.y))};
    t.warp = i / 32;
    t.lane = i % 32;
    t.self = ctx::fiber(std::allocator_arg, PooledStack{&stack_pool}, [&t, &body](ctx::fiber&& scheduler) {
      t.scheduler = std::move(scheduler);
      body();
      return std::move(t.scheduler);
    });
  }
  int done = 0;
  while (done < n) {
    bool ran = false;
    for (EmuThread& t : run.threads) {
      if (t.state != State::kRunnable) continue;
      run.current = &t;
      coords.thread_idx = t.idx;
      t.self = std::move(t.self).resume();
      ran = true;
      if (!t.self) {
        t.state = State::kDone;
        ++done;
      }
    }
    if (done == n || ran) continue;
    CHECK(ReleaseBarriers(run, warps)) << "emulated kernel deadlock in block (" << coords.block_idx.x << ","
                                       << coords.block_idx.y << "," << coords.block_idx.z
                                       << "): threads wait at barriers that cannot complete (a __syncthreads or warp "
                                       << "shuffle not reached by every live thread)";
  }
  run.current = nullptr;
}

}  // namespace

void LaunchKernel(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body) {
  CHECK(block_run == nullptr) << "emulated device: a kernel launched from inside a kernel";
  CHECK(block.x * block.y * block.z >= 1 && block.x * block.y * block.z <= 1024)
      << "emulated device: block of " << block.x * block.y * block.z << " threads (1..1024 allowed)";
  CHECK(dynamic_shared_bytes <= 227u << 10)
      << "emulated device: " << dynamic_shared_bytes << " bytes of dynamic shared memory (at most 227 KiB on sm_90)";
  BlockRun run;
  run.dynamic_shared.resize(dynamic_shared_bytes);
  block_run = &run;
  coords.block_dim = block;
  coords.grid_dim = grid;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        coords.block_idx = uint3{x, y, z};
        RunBlock(run, body);
      }
  block_run = nullptr;
}

void SyncThreads() { Suspend(State::kBlockBarrier); }
void SyncWarp() { Suspend(State::kWarpBarrier); }

uint64_t WarpExchange(uint64_t v, int src_lane) {
  EmuThread* t = block_run->current;
  uint64_t* slots = block_run->warp_slots.data() + static_cast<size_t>(t->warp) * 32;
  slots[t->lane] = v;
  SyncWarp();
  const uint64_t out = slots[src_lane];
  SyncWarp();  // nobody overwrites a mailbox before every lane has read
  return out;
}

void WarpAllGather(const void* mine, size_t bytes, void* all) {
  CHECK(bytes <= kGatherBytes) << "emulated device: a warp gather of " << bytes << " bytes a lane";
  EmuThread* t = block_run->current;
  // Two mailboxes a warp, used in turn: a lane that has read this one can
  // only write the other before every lane has passed the next barrier, by
  // which time all have read this one. So one barrier a gather.
  const size_t box = static_cast<size_t>(t->warp) * 2 + t->gathers % 2;
  unsigned char* slots = block_run->warp_bytes.data() + box * 32 * kGatherBytes;
  ++t->gathers;
  std::memcpy(slots + t->lane * bytes, mine, bytes);
  SyncWarp();
  std::memcpy(all, slots, 32 * bytes);
}

void* DynamicShared() { return block_run->dynamic_shared.data(); }

}  // namespace herd_emu

// ---- The CUDA runtime calls herd makes, over host memory. Every call
// completes before it returns, so streams and events need no state.
namespace {

constexpr size_t kEmulatedDeviceBytes = size_t{16} << 30;

// Device allocations, so that cudaMemGetInfo reports what is in use (the
// memory-plan tests compare it with the plan).
// Stream-ordered pools' blocks are mapped pages of their own, unmapped when
// freed, so a kernel that reads a freed unit faults at once.
struct EmulatedPool {
  size_t used = 0, high = 0;  // under Heap().mu
};
struct DeviceHeap {
  herd::Mutex mu;
  std::unordered_map<void*, size_t> sizes GUARDED_BY(mu);
  std::unordered_map<void*, std::pair<EmulatedPool*, size_t>> pooled GUARDED_BY(mu);
  size_t in_use GUARDED_BY(mu) = 0;
};
DeviceHeap& Heap() {
  static DeviceHeap heap;
  return heap;
}

cudaError_t AllocatePoisoned(void** ptr, size_t size, bool device) {
  // 256-byte aligned like cudaMalloc; 0xff bytes read as NaN floats.
  const size_t rounded = (std::max<size_t>(size, 1) + 255) / 256 * 256;
  *ptr = std::aligned_alloc(256, rounded);
  if (*ptr == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*ptr, 0xff, rounded);
  if (device) {
    DeviceHeap& heap = Heap();
    herd::MutexLock lock(&heap.mu);
    heap.sizes[*ptr] = rounded;
    heap.in_use += rounded;
  }
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t cudaMalloc(void** devPtr, size_t size) { return AllocatePoisoned(devPtr, size, /*device=*/true); }
cudaError_t cudaFree(void* devPtr) {
  if (devPtr == nullptr) return cudaSuccess;
  {
    DeviceHeap& heap = Heap();
    herd::MutexLock lock(&heap.mu);
    auto it = heap.sizes.find(devPtr);
    if (it == heap.sizes.end()) return cudaErrorInvalidValue;
    heap.in_use -= it->second;
    heap.sizes.erase(it);
  }
  std::free(devPtr);
  return cudaSuccess;
}
cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const struct cudaMemPoolProps*) {
  *memPool = reinterpret_cast<cudaMemPool_t>(new EmulatedPool);
  return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
  delete reinterpret_cast<EmulatedPool*>(memPool);
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void*) {
  auto* pool = reinterpret_cast<EmulatedPool*>(memPool);
  herd::MutexLock lock(&Heap().mu);
  if (attr == cudaMemPoolAttrUsedMemHigh || attr == cudaMemPoolAttrReservedMemHigh) {
    pool->high = pool->used;  // CUDA takes only 0 here: a reset to the current use
  }
  return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
  auto* pool = reinterpret_cast<EmulatedPool*>(memPool);
  herd::MutexLock lock(&Heap().mu);
  switch (attr) {
    case cudaMemPoolAttrUsedMemCurrent:
    case cudaMemPoolAttrReservedMemCurrent:
      *static_cast<uint64_t*>(value) = pool->used;
      return cudaSuccess;
    case cudaMemPoolAttrUsedMemHigh:
    case cudaMemPoolAttrReservedMemHigh:
      *static_cast<uint64_t*>(value) = pool->high;
      return cudaSuccess;
    default:
      return cudaErrorInvalidValue;
  }
}
cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t rounded = (std::max<size_t>(size, 1) + page - 1) / page * page;
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
  std::memset(p, 0xff, rounded);
  auto* pool = reinterpret_cast<EmulatedPool*>(memPool);
  DeviceHeap& heap = Heap();
  herd::MutexLock lock(&heap.mu);
  heap.pooled[p] = {pool, rounded};
  heap.in_use += rounded;
  pool->used += rounded;
  pool->high = std::max(pool->high, pool->used);
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t) {
  if (devPtr == nullptr) return cudaSuccess;
  size_t bytes = 0;
  {
    DeviceHeap& heap = Heap();
    herd::MutexLock lock(&heap.mu);
    auto it = heap.pooled.find(devPtr);
    if (it == heap.pooled.end()) return cudaErrorInvalidValue;
    bytes = it->second.second;
    it->second.first->used -= bytes;
    heap.in_use -= bytes;
    heap.pooled.erase(it);
  }
  munmap(devPtr, bytes);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t size) { return AllocatePoisoned(ptr, size, /*device=*/false); }
cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind) {
  if (count > 0) std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, count, kind);
}
cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  if (count > 0) std::memset(devPtr, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t) {
  return cudaMemset(devPtr, value, count);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int) {
  *pStream = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<char*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t error) { return error == cudaSuccess ? "cudaSuccess" : "cudaErrorUnknown"; }
const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : "error in the emulated device";
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  DeviceHeap& heap = Heap();
  herd::MutexLock lock(&heap.mu);
  *total = kEmulatedDeviceBytes;
  *free = kEmulatedDeviceBytes - std::min(heap.in_use, kEmulatedDeviceBytes);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void*, size_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaHostUnregister(void*) { return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "emulated device", sizeof(prop->name) - 1);
  prop->multiProcessorCount = 1;
  prop->major = 9;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *value = attr == cudaDevAttrMemoryPoolsSupported ? 1 : 0;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, enum cudaFuncAttribute, int) { return cudaSuccess; }

}  // extern "C"
