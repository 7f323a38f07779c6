// NCCL on the emulated device (model/cuda/emulation), for any number of
// ranks on one machine: "device" memory is host memory there, so the ranks
// of a communicator (processes, or threads of one) meet in a shared-memory
// segment named by the unique id, and every NCCL path herd has (DDP's
// all-reduce, ZeRO's rooted reduces and broadcasts, a stage's sends) runs
// with real peers without a GPU.
//
// What it promises:
//   - A collective completes before its call returns (the emulated streams
//     are synchronous), in chunks through one slot per rank: each rank
//     copies its chunk in, all meet, each takes what it needs, all meet.
//   - A sum adds the ranks' values in rank order 0, 1, ..., so every rank
//     (and every collective: an all-reduce and the rooted reduces of the
//     same values) gets the same bits. Real NCCL sums in its ring's or
//     tree's order instead: equal to rounding, not bitwise.
//   - Sends and receives are queued inside ncclGroupStart/End and
//     progressed together at the group's end, through a mailbox per
//     ordered pair of ranks, so a group that sends and receives both ways
//     cannot deadlock; outside a group each completes before it returns.
//   - A rank that waits notices a peer process that has exited (its pid is
//     in the segment) or a communicator marked broken by another rank, and
//     the call fails with ncclRemoteError rather than waiting forever.
//
// Collectives of a communicator must be issued in the same order by every
// rank, as NCCL requires.
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda_bf16.h>

namespace herd::transport {
bool NcclAvailable(std::string*) { return true; }
}  // namespace herd::transport

namespace {

constexpr int kMaxRanks = 16;
constexpr size_t kSlotBytes = 1 << 20;     // each rank's part of a collective's chunk
constexpr size_t kMailboxBytes = 1 << 18;  // a send's chunk
constexpr char kIdPrefix[] = "/herd-emulated-nccl-";
// How long the ranks of a new communicator wait for each other.
constexpr auto kJoinTimeout = std::chrono::seconds(300);

// The segment: a header, one slot per rank, one mailbox per ordered pair.
// Its bytes start zero (ftruncate), which is every field's initial state.
struct Header {
  std::atomic<int32_t> joined;
  std::atomic<int32_t> broken;
  std::atomic<uint32_t> arrived;     // at the barrier of `generation`
  std::atomic<uint32_t> generation;
  std::atomic<int32_t> pids[kMaxRanks];
};
struct Mailbox {
  std::atomic<uint64_t> written, taken;  // chunks
  uint64_t bytes;                        // of the chunk written last
  char data[kMailboxBytes];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "a segment's atomics must be address-free");

size_t SegmentBytes(int nranks) {
  return sizeof(Header) + static_cast<size_t>(nranks) * kSlotBytes +
         static_cast<size_t>(nranks) * nranks * sizeof(Mailbox);
}

size_t ElementBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

// Whether process `pid` has exited (an unreaped one too: a zombie is gone
// for its peers).
bool Exited(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char line[512] = {};
  const size_t n = std::fread(line, 1, sizeof line - 1, f);
  std::fclose(f);
  // "pid (comm) S ...": the state follows the last ')'.
  const char* close = std::strrchr(line, ')');
  return n > 0 && close != nullptr && (close[2] == 'Z' || close[2] == 'X');
}

struct Comm {
  int rank = 0, nranks = 1;
  char* base = nullptr;
  size_t bytes = 0;
  std::atomic<bool> aborted{false};

  Header& header() const { return *reinterpret_cast<Header*>(base); }
  char* slot(int r) const { return base + sizeof(Header) + static_cast<size_t>(r) * kSlotBytes; }
  Mailbox& mailbox(int from, int to) const {
    return reinterpret_cast<Mailbox*>(slot(nranks))[static_cast<size_t>(from) * nranks + to];
  }

  // Whether the communicator can no longer complete: a peer process gone,
  // a rank that gave up, or our own abort. Marks it broken for the others.
  bool Broken() {
    if (aborted.load() || header().broken.load() != 0) return true;
    for (int r = 0; r < nranks; ++r) {
      const pid_t pid = header().pids[r].load();
      if (pid > 0 && pid != getpid() && Exited(pid)) {
        header().broken.store(1);
        return true;
      }
    }
    return false;
  }

  // Waits until ready() holds; false if the communicator broke first.
  template <typename Ready>
  bool Await(Ready ready) {
    auto checked = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      if (ready()) return true;
      if (spins < 64) continue;
      if (spins < 1024) {
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      const auto now = std::chrono::steady_clock::now();
      if (now - checked > std::chrono::milliseconds(20)) {
        checked = now;
        if (Broken()) return false;
      }
    }
  }

  // Every rank of the communicator arrives before any leaves.
  bool Barrier() {
    Header& h = header();
    const uint32_t gen = h.generation.load();
    if (h.arrived.fetch_add(1) + 1 == static_cast<uint32_t>(nranks)) {
      h.arrived.store(0);
      h.generation.fetch_add(1);
      return true;
    }
    return Await([&] { return h.generation.load() != gen; });
  }
};

// dst = the ranks' chunks of n elements (in `slot(r) + at`) summed in rank order.
template <typename T>
void SumInRankOrder(const Comm& c, size_t at, size_t n, void* dst) {
  T* out = static_cast<T*>(dst);
  std::vector<T> sum(reinterpret_cast<const T*>(c.slot(0) + at), reinterpret_cast<const T*>(c.slot(0) + at) + n);
  for (int r = 1; r < c.nranks; ++r) {
    const T* v = reinterpret_cast<const T*>(c.slot(r) + at);
    for (size_t i = 0; i < n; ++i) sum[i] += v[i];
  }
  std::memcpy(out, sum.data(), n * sizeof(T));
}
void SumBf16InRankOrder(const Comm& c, size_t at, size_t n, void* dst) {
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < c.nranks; ++r) {
    const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(c.slot(r) + at);
    for (size_t i = 0; i < n; ++i) sum[i] = __bfloat162float(__float2bfloat16(sum[i] + __bfloat162float(v[i])));
  }
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = __float2bfloat16(sum[i]);
}
bool Sum(const Comm& c, ncclDataType_t type, size_t at, size_t n, void* dst) {
  switch (type) {
    case ncclFloat32:
      SumInRankOrder<float>(c, at, n, dst);
      return true;
    case ncclFloat64:
      SumInRankOrder<double>(c, at, n, dst);
      return true;
    case ncclInt32:
      SumInRankOrder<int32_t>(c, at, n, dst);
      return true;
    case ncclInt64:
      SumInRankOrder<int64_t>(c, at, n, dst);
      return true;
    case ncclBfloat16:
      SumBf16InRankOrder(c, at, n, dst);
      return true;
    default:
      return false;
  }
}

Comm* CommOf(ncclComm_t comm) { return reinterpret_cast<Comm*>(comm); }

// Runs `per_chunk(offset, count)` over `count` elements in chunks of at
// most `chunk` elements, each between barriers; false if the communicator
// broke.
template <typename PerChunk>
ncclResult_t Chunked(Comm& c, size_t count, size_t chunk, PerChunk per_chunk) {
  if (c.Broken()) return ncclRemoteError;
  for (size_t at = 0; at < count; at += chunk) {
    const size_t n = std::min(chunk, count - at);
    if (!per_chunk(at, n)) return ncclRemoteError;
  }
  return ncclSuccess;
}

// A send or a receive, progressed at its group's end.
struct PointToPoint {
  bool send;
  Comm* comm;
  int peer;
  char* data;
  size_t bytes, done = 0;
  // Moves what the mailbox allows now; true if anything moved.
  bool Progress() {
    Mailbox& m = send ? comm->mailbox(comm->rank, peer) : comm->mailbox(peer, comm->rank);
    const uint64_t written = m.written.load(), taken = m.taken.load();
    if (send && written == taken && done < bytes) {
      const size_t n = std::min(kMailboxBytes, bytes - done);
      std::memcpy(m.data, data + done, n);
      m.bytes = n;
      done += n;
      m.written.store(written + 1);
      return true;
    }
    if (!send && written > taken && done < bytes) {
      const size_t n = m.bytes;
      if (n > bytes - done) {
        comm->header().broken.store(1);  // sizes disagree: the job is wrong
        return false;
      }
      std::memcpy(data + done, m.data, n);
      done += n;
      m.taken.store(taken + 1);
      return true;
    }
    return false;
  }
  // Done once sent data has been taken, too (the buffer is the caller's again).
  bool Finished() const {
    if (done < bytes) return false;
    if (!send) return true;
    Mailbox& m = comm->mailbox(comm->rank, peer);
    return m.taken.load() == m.written.load();
  }
};

thread_local int group_depth = 0;
thread_local std::vector<PointToPoint> group_ops;

ncclResult_t RunPointToPoint(std::vector<PointToPoint>& ops) {
  for (;;) {
    bool all = true, moved = false;
    for (PointToPoint& op : ops) {
      moved |= op.Progress();
      all &= op.Finished();
    }
    if (all) return ncclSuccess;
    if (moved) continue;
    // Nothing can move now: wait until something can (or a send's last
    // chunk has been taken), through the first unfinished op's communicator.
    auto can_move = [&] {
      bool waiting = false;
      for (const PointToPoint& o : ops) {
        if (o.Finished()) continue;
        Mailbox& m = o.send ? o.comm->mailbox(o.comm->rank, o.peer) : o.comm->mailbox(o.peer, o.comm->rank);
        const bool empty = m.written.load() == m.taken.load();
        if (o.send ? empty : !empty) return true;
        waiting = true;
      }
      return !waiting;
    };
    for (PointToPoint& op : ops) {
      if (op.Finished()) continue;
      if (!op.comm->Await(can_move)) return ncclRemoteError;
      break;
    }
  }
}

ncclResult_t PointToPointOp(bool send, const void* data, size_t count, ncclDataType_t type, int peer, ncclComm_t comm) {
  Comm* c = CommOf(comm);
  if (c == nullptr || peer < 0 || peer >= c->nranks || peer == c->rank) return ncclInvalidArgument;
  PointToPoint op{send, c, peer, static_cast<char*>(const_cast<void*>(data)), count * ElementBytes(type)};
  if (group_depth > 0) {
    group_ops.push_back(op);
    return ncclSuccess;
  }
  std::vector<PointToPoint> one{op};
  return RunPointToPoint(one);
}

}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<uint64_t> counter{0};
  std::memset(id, 0, sizeof(*id));
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::snprintf(id->internal, sizeof id->internal, "%s%d-%llu-%llx", kIdPrefix, static_cast<int>(getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)), static_cast<unsigned long long>(now));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  id.internal[sizeof id.internal - 1] = '\0';
  const std::string name = id.internal;
  if (name.rfind(kIdPrefix, 0) != 0) return ncclInvalidArgument;
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return ncclSystemError;
  const size_t bytes = SegmentBytes(nranks);
  struct stat st {};
  if (fstat(fd, &st) != 0 || (static_cast<size_t>(st.st_size) < bytes && ftruncate(fd, bytes) != 0)) {
    close(fd);
    return ncclSystemError;
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return ncclSystemError;
  auto c = new Comm;
  c->rank = rank;
  c->nranks = nranks;
  c->base = static_cast<char*>(base);
  c->bytes = bytes;
  Header& h = c->header();
  h.pids[rank].store(static_cast<int32_t>(getpid()));
  // The last to arrive takes the name away: everyone has it mapped.
  if (h.joined.fetch_add(1) + 1 == nranks) shm_unlink(name.c_str());
  const auto deadline = std::chrono::steady_clock::now() + kJoinTimeout;
  const bool joined = c->Await([&] {
    return h.joined.load() >= nranks || std::chrono::steady_clock::now() > deadline;
  });
  if (!joined || h.joined.load() < nranks) {
    h.broken.store(1);
    munmap(c->base, c->bytes);
    delete c;
    return ncclSystemError;
  }
  *comm = reinterpret_cast<ncclComm_t>(c);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  Comm* c = CommOf(comm);
  if (c == nullptr) return ncclSuccess;
  munmap(c->base, c->bytes);
  delete c;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  Comm* c = CommOf(comm);
  if (c == nullptr) return ncclSuccess;
  c->aborted.store(true);
  c->header().broken.store(1);
  return ncclCommDestroy(comm);
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  Comm* c = CommOf(comm);
  *error = c != nullptr && c->header().broken.load() != 0 ? ncclRemoteError : ncclSuccess;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument (emulated NCCL: a rank, peer, type or unique id it does not take)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (emulated NCCL: a peer is gone)";
    case ncclSystemError:
      return "system call failed (emulated NCCL: the shared segment, or the peers never all joined)";
    default:
      return "error in the emulated NCCL";
  }
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  std::vector<PointToPoint> ops;
  ops.swap(group_ops);
  return ops.empty() ? ncclSuccess : RunPointToPoint(ops);
}

}  // extern "C"

namespace {

// The ranks' sums of `count` elements: into every rank's `recv` (root -1)
// or the root's alone.
ncclResult_t SumTo(int root, const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                   ncclComm_t comm) {
  Comm* c = CommOf(comm);
  if (c == nullptr || op != ncclSum || root < -1 || root >= c->nranks) return ncclInvalidArgument;
  const size_t es = ElementBytes(type);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  return Chunked(*c, count, kSlotBytes / es, [&](size_t at, size_t n) {
    std::memcpy(c->slot(c->rank), in + at * es, n * es);
    if (!c->Barrier()) return false;
    if ((root < 0 || c->rank == root) && !Sum(*c, type, 0, n, out + at * es)) c->header().broken.store(1);
    return c->Barrier();
  });
}

}  // namespace

extern "C" {

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t) {
  return SumTo(-1, send, recv, count, type, op, comm);
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t) {
  if (root < 0) return ncclInvalidArgument;
  return SumTo(root, send, recv, count, type, op, comm);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t) {
  Comm* c = CommOf(comm);
  if (c == nullptr || root < 0 || root >= c->nranks) return ncclInvalidArgument;
  const size_t es = ElementBytes(type);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  return Chunked(*c, count, kSlotBytes / es, [&](size_t at, size_t n) {
    if (c->rank == root) std::memcpy(c->slot(root), in + at * es, n * es);
    if (!c->Barrier()) return false;
    std::memmove(out + at * es, c->slot(root), n * es);
    return c->Barrier();
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t) {
  Comm* c = CommOf(comm);
  if (c == nullptr) return ncclInvalidArgument;
  const size_t es = ElementBytes(type);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  return Chunked(*c, sendcount, kSlotBytes / es, [&](size_t at, size_t n) {
    std::memcpy(c->slot(c->rank), in + at * es, n * es);
    if (!c->Barrier()) return false;
    for (int r = 0; r < c->nranks; ++r) std::memcpy(out + (r * sendcount + at) * es, c->slot(r), n * es);
    return c->Barrier();
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t) {
  Comm* c = CommOf(comm);
  if (c == nullptr || op != ncclSum) return ncclInvalidArgument;
  const size_t es = ElementBytes(type);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  // Each rank's slot holds its chunk of every rank's part, part after part.
  const size_t chunk = kSlotBytes / es / c->nranks;
  return Chunked(*c, recvcount, chunk, [&](size_t at, size_t n) {
    for (int r = 0; r < c->nranks; ++r) std::memcpy(c->slot(c->rank) + r * n * es, in + (r * recvcount + at) * es, n * es);
    if (!c->Barrier()) return false;
    if (!Sum(*c, type, c->rank * n * es, n, out + at * es)) c->header().broken.store(1);
    return c->Barrier();
  });
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t) {
  return PointToPointOp(true, send, count, type, peer, comm);
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t) {
  return PointToPointOp(false, recv, count, type, peer, comm);
}

}  // extern "C"
