#include "transport/nccl_collectives.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "common/mutex.h"
#include "transport/exchanges.h"
#include "transport/wire.h"

namespace herd::transport {
namespace {

std::string CudaError(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }
std::string NcclError(ncclResult_t r) { return ncclGetErrorString(r); }

}  // namespace

class NcclCollectives::Impl {
 public:
  Impl(int rank, int size) : rank_(rank), size_(size) {}
  ~Impl() {
    for (auto& [h, e] : events_) cudaEventDestroy(e);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init(const ncclUniqueId& id) {
    cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e != cudaSuccess) return Status::Unavailable("NCCL: cudaStreamCreate: " + CudaError(e));
    ncclResult_t r = ncclCommInitRank(&comm_, size_, id, rank_);
    if (r != ncclSuccess) return Status::Unavailable("NCCL: ncclCommInitRank: " + NcclError(r));
    return Status::OK();
  }

  // Records an event after what was just enqueued; the handle names it.
  Handle Record(ncclResult_t enqueued, const char* what) {
    MutexLock lock(&mu_);
    const Handle h = next_++;
    if (enqueued != ncclSuccess && failed_.ok())
      failed_ = Status::Unavailable(std::string("NCCL: ") + what + ": " + NcclError(enqueued));
    cudaEvent_t ev = nullptr;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess) {
      cudaEventRecord(ev, stream_);
      events_[h] = ev;
    }
    return h;
  }

  Status Wait(Handle h) {
    cudaEvent_t ev = nullptr;
    {
      MutexLock lock(&mu_);
      auto it = events_.find(h);
      if (it == events_.end()) return failed_.ok() ? Status::Internal("NCCL: unknown handle") : failed_;
      ev = it->second;
      events_.erase(it);
    }
    // Poll rather than block: a peer's death leaves the kernel waiting
    // forever, and only the communicator's async error (or our abort) says so.
    for (;;) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        cudaEventDestroy(ev);
        return Status::Unavailable("NCCL: " + CudaError(q));
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        cudaEventDestroy(ev);
        return Status::Unavailable("NCCL: " + NcclError(async));
      }
      {
        MutexLock lock(&mu_);
        if (!failed_.ok()) {
          ncclCommAbort(comm_);
          comm_ = nullptr;
          cudaEventDestroy(ev);
          return failed_;
        }
      }
    }
    cudaEventDestroy(ev);
    MutexLock lock(&mu_);
    return failed_;
  }

  void Fail(const Status& st) {
    MutexLock lock(&mu_);
    if (failed_.ok()) failed_ = st;
  }

  // An operation that cannot be issued: it (and every later one) fails.
  Handle Refuse(const char* what, const std::string& why) {
    Fail(Status::InvalidArgument(std::string("collective: ") + what + ": " + why));
    return Record(ncclSuccess, what);
  }

  // Constant after construction.
  const int rank_, size_;

  // The issuing thread's (the one that enqueues collectives and waits for
  // them; Init sets them): Fail, from any thread, touches only failed_.
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;

  Mutex mu_;
  std::map<Handle, cudaEvent_t> events_ GUARDED_BY(mu_);
  Handle next_ GUARDED_BY(mu_) = 1;
  Status failed_ GUARDED_BY(mu_);
};

int NcclCollectives::DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::Create(CoordinatorClient& client,
                                                                   const std::vector<int>& members,
                                                                   const std::string& group) {
  std::vector<int> ranks = members;
  if (ranks.empty()) {
    for (int r = 0; r < client.num_workers(); ++r) ranks.push_back(r);
  }
  const auto me = std::find(ranks.begin(), ranks.end(), client.rank());
  if (me == ranks.end() || !std::is_sorted(ranks.begin(), ranks.end()) || ranks.back() >= client.num_workers()) {
    return Status::InvalidArgument("NCCL: group " + group + " does not hold worker " + std::to_string(client.rank()));
  }
  if (DeviceCount() == 0) return Status::Unavailable("NCCL: no CUDA device is visible");
  std::string why;
  if (!NcclAvailable(&why)) return Status::Unavailable(why);
  const bool first = client.rank() == ranks.front();
  ncclUniqueId id{};
  if (first) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return Status::Unavailable("NCCL: ncclGetUniqueId: " + NcclError(r));
  }
  wire::NcclId mine;
  if (first) mine.set_id(std::string(reinterpret_cast<const char*>(&id), sizeof id));
  HERD_ASSIGN_OR_RETURN(std::vector<wire::NcclId> all, Gather(client, NcclIdExchange(group), mine));
  if (static_cast<int>(all.size()) != client.num_workers()) {
    return Status::Corruption("NCCL: the unique ids of group " + group + " came from " + std::to_string(all.size()) +
                              " workers, not " + std::to_string(client.num_workers()));
  }
  const std::string& root = all[ranks.front()].id();
  if (root.size() != sizeof id) {
    return Status::Corruption("NCCL: worker " + std::to_string(ranks.front()) + " sent a malformed unique id");
  }
  std::memcpy(&id, root.data(), sizeof id);
  auto impl = std::make_unique<Impl>(static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()));
  HERD_RETURN_IF_ERROR(impl->Init(id));
  return std::unique_ptr<NcclCollectives>(new NcclCollectives(std::move(impl)));
}

NcclCollectives::NcclCollectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCollectives::~NcclCollectives() = default;
int NcclCollectives::rank() const { return impl_->rank_; }
int NcclCollectives::size() const { return impl_->size_; }
cudaStream_t NcclCollectives::stream() const { return impl_->stream_; }

Collectives::Handle NcclCollectives::AllReduce(void* data, int64_t n, DType dtype, Wire wire) {
  if (wire != Wire::kFloat32) return impl_->Refuse("all-reduce", "NCCL sums in the buffer's dtype: no bf16 wire");
  const ncclDataType_t t = dtype == DType::kFloat64 ? ncclFloat64 : ncclFloat32;
  return impl_->Record(ncclAllReduce(data, data, n, t, ncclSum, impl_->comm_, impl_->stream_), "all-reduce");
}

Collectives::Handle NcclCollectives::AllReduceBf16(void* data, int64_t n) {
  return impl_->Record(ncclAllReduce(data, data, n, ncclBfloat16, ncclSum, impl_->comm_, impl_->stream_), "all-reduce");
}

// One NCCL call per non-empty part, rooted at the part's rank, as a group.
template <typename PerPart>
Collectives::Handle NcclCollectives::Grouped(const Partition& parts, const char* what, PerPart per_part) {
  if (static_cast<int>(parts.size()) != size()) return impl_->Refuse(what, "a partition needs one part per rank");
  ncclResult_t r = ncclGroupStart();
  int64_t at = 0;
  for (int p = 0; p < size() && r == ncclSuccess; ++p) {
    if (parts[p] > 0) r = per_part(at, parts[p], p);
    at += parts[p];
  }
  const ncclResult_t end = ncclGroupEnd();
  return impl_->Record(r != ncclSuccess ? r : end, what);
}

Collectives::Handle NcclCollectives::ReduceScatter(float* data, const Partition& parts, Wire wire) {
  if (wire != Wire::kFloat32) return impl_->Refuse("reduce-scatter", "NCCL sums in the buffer's dtype: no bf16 wire");
  return Grouped(parts, "reduce-scatter", [&](int64_t at, int64_t n, int root) {
    return ncclReduce(data + at, data + at, n, ncclFloat32, ncclSum, root, impl_->comm_, impl_->stream_);
  });
}

Collectives::Handle NcclCollectives::ReduceScatterBf16(void* data, const Partition& parts) {
  char* bytes = static_cast<char*>(data);
  return Grouped(parts, "reduce-scatter", [&](int64_t at, int64_t n, int root) {
    return ncclReduce(bytes + at * 2, bytes + at * 2, n, ncclBfloat16, ncclSum, root, impl_->comm_, impl_->stream_);
  });
}

Collectives::Handle NcclCollectives::AllGather(float* data, const Partition& parts) {
  return Grouped(parts, "all-gather", [&](int64_t at, int64_t n, int root) {
    return ncclBroadcast(data + at, data + at, n, ncclFloat32, root, impl_->comm_, impl_->stream_);
  });
}

Collectives::Handle NcclCollectives::AllGather(void* data, const Partition& parts, int element_bytes) {
  char* bytes = static_cast<char*>(data);
  return Grouped(parts, "all-gather", [&](int64_t at, int64_t n, int root) {
    return ncclBroadcast(bytes + at * element_bytes, bytes + at * element_bytes, n * element_bytes, ncclUint8, root,
                         impl_->comm_, impl_->stream_);
  });
}

Collectives::Handle NcclCollectives::Broadcast(float* data, int64_t n, int root) {
  return impl_->Record(ncclBroadcast(data, data, n, ncclFloat32, root, impl_->comm_, impl_->stream_), "broadcast");
}

Status NcclCollectives::Wait(Handle handle) { return impl_->Wait(handle); }
void NcclCollectives::Fail(const Status& status) { impl_->Fail(status); }

}  // namespace herd::transport
