#include "model/cuda/streamed_model.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <type_traits>
#include <vector>

#include "model/cuda/check.h"
#include "model/cuda/device_memory.h"
#include "model/cuda/kernels.h"
#include "model/cuda/llama_cuda.h"
#include "model/cuda/staged_model.h"
#include "model/cuda/unit_space.h"
#include "model/peak_flops.h"

namespace herd::cuda {
namespace {

// Page-locked host slots used in turn (and, `landing`, a device slot each);
// a slot is handed out again once the work recorded on it is done.
class StagingRing {
 public:
  struct Slot {
    float* host = nullptr;
    float* landing = nullptr;
    cudaEvent_t done = nullptr;
    bool recorded = false;
  };

  explicit StagingRing(bool landing) {
    for (Slot& s : slots_) {
      HERD_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.host), kStagingSlotFloats * sizeof(float)));
      if (landing) HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.landing), kStagingSlotFloats * sizeof(float)));
      HERD_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    }
  }
  ~StagingRing() {
    for (Slot& s : slots_) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
      cudaFreeHost(s.host);
      cudaFree(s.landing);
    }
  }
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // The next slot in turn, once its last work is done.
  Slot& Next() {
    Slot& s = slots_[next_++ % kStagingSlots];
    if (s.recorded) HERD_CUDA_CHECK(cudaEventSynchronize(s.done));
    return s;
  }
  void Recorded(Slot& s, cudaStream_t stream) {
    HERD_CUDA_CHECK(cudaEventRecord(s.done, stream));
    s.recorded = true;
  }

 private:
  std::array<Slot, kStagingSlots> slots_;
  int64_t next_ = 0;
};

template <typename T>
class StreamedCudaModel final : public CudaModelBase {
 public:
  StreamedCudaModel(const LlamaShape& shape, int max_batch, int max_seq_len, int device, std::string name,
                    Recompute recompute)
      : max_batch_(max_batch),
        max_seq_len_(max_seq_len),
        name_(std::move(name)),
        units_(ParamLayout(shape).UnitBoundaries()),
        tied_(shape.tie_word_embeddings) {
    HERD_CUDA_CHECK(cudaSetDevice(device));
    for (cudaStream_t* s : {&compute_, &up_, &down_}) HERD_CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    // A pool of our own: freed units are reused as soon as their frees are
    // done (never by making one stream wait for another), and kept by the
    // pool rather than given back to the driver at each synchronization.
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    HERD_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    uint64_t keep = UINT64_MAX;
    HERD_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    int no = 0;
    HERD_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolReuseAllowInternalDependencies, &no));
    HERD_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
    HERD_CUDA_CHECK(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming));
    model_ = std::make_unique<CudaLlamaModel<T>>(shape, max_batch, max_seq_len, compute_, recompute);
    weights_.begins.assign(units_.begin(), units_.end() - 1);
    weights_.bases.assign(num_units(), nullptr);
    grads_.begins = weights_.begins;
    grads_.bases.assign(num_units(), nullptr);
  }

  ~StreamedCudaModel() override {
    for (cudaStream_t s : {compute_, up_, down_}) cudaStreamSynchronize(s);
    model_.reset();
    for (T* p : weights_.bases)
      if (p != nullptr) cudaFreeAsync(p, compute_);
    for (float* p : grads_.bases)
      if (p != nullptr) cudaFreeAsync(p, compute_);
    cudaStreamSynchronize(compute_);
    for (cudaEvent_t e : retired_) cudaEventDestroy(e);
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
    cudaEventDestroy(uploaded_);
    cudaEventDestroy(computed_);
    cudaMemPoolDestroy(pool_);
    for (cudaStream_t s : {compute_, up_, down_}) cudaStreamDestroy(s);
  }

  const ParamLayout& layout() const override { return model_->layout(); }
  int max_batch() const override { return max_batch_; }
  int max_seq_len() const override { return max_seq_len_; }
  std::string Describe() const override { return name_ + ", streamed"; }
  double PeakTflops() const override { return DatasheetPeakTflops(name_, !std::is_same_v<T, float>); }
  // The buffers made with the model, and the units' pool at its fullest.
  int64_t DevicePeakBytes() const override {
    uint64_t high = 0;
    HERD_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &high));
    return allocated_ + static_cast<int64_t>(high);
  }
  void set_allocated(int64_t bytes) { allocated_ = bytes; }

  double Forward(const float* params, const int32_t* tokens, const int32_t* targets, int B, int T_,
                 const NeedUpTo& need) override {
    // A pass takes every unit from the host again: the weights may be a
    // new version.
    for (int u = 0; u < num_units(); ++u) LetGo(u);
    host_params_ = params;
    int next = 0;          // the next unit to upload
    int64_t past_end = 0;  // every unit below this had its kernels enqueued
    auto arrive = [&](int64_t end) {
      if (need) need(end);
      for (int u = 0; u < num_units() && units_[u + 1] <= past_end; ++u) {
        if (!(tied_ && u == 0)) LetGo(u);  // the tied embedding is the head too
      }
      while (next < num_units() && units_[next] < end) Upload(next++);
      past_end = end;
    };
    return model_->Forward(UnitSpace<const T>(&weights_), tokens, targets, B, T_, arrive);
  }

  void Backward(const float* params, float* grads, double loss_scale, const FinalFrom& final_from,
                bool last_micro_batch, const NeedFrom& need_from) override {
    host_params_ = params;
    host_grads_ = grads;
    final_from_ = &final_from;
    const int head = num_units() - 1;
    auto arrive = [&](int64_t x) {
      const int u = weights_.Unit(x);
      if (need_from) need_from(x);
      if (weights_.bases[u] == nullptr) Upload(u);
      HoldGradients(u);
      if (tied_ && u == head) HoldGradients(0);  // the head writes the embedding's gradients
    };
    auto computed = [&](int64_t x) {  // unit u's kernels are enqueued
      const int u = weights_.Unit(x);
      LetGo(u);
      if (last_micro_batch) {
        ShipOut(u);
      } else if (final_from) {
        final_from(x);  // the sum stays on the device; the host's weights are no longer read
      }
      if (u > 0) HoldGradients(u - 1);  // the embedding's backward has no need_from
    };
    model_->Backward(UnitSpace<const T>(&weights_), UnitSpace<float>(&grads_), loss_scale, computed, arrive);
    if (last_micro_batch) FinishShipment();
    final_from_ = nullptr;
  }

  const float* logits() override {
    model_->LogitsToHost(&host_logits_);
    return host_logits_.data();
  }

  void SetGradientReducer(GradientReducer reducer) override { reducer_ = std::move(reducer); }

 private:
  int num_units() const { return static_cast<int>(units_.size()) - 1; }
  int64_t unit_size(int u) const { return units_[u + 1] - units_[u]; }

  // Unit u's weights from the caller's buffer to the device, through the
  // upload ring; the compute stream waits for them.
  void Upload(int u) {
    // At most two units' kernels outstanding: what went before them is
    // done, and its memory free for this unit.
    while (retired_.size() > 1) {
      HERD_CUDA_CHECK(cudaEventSynchronize(retired_.front()));
      spare_events_.push_back(retired_.front());
      retired_.pop_front();
    }
    const int64_t begin = units_[u], n = unit_size(u);
    T* unit = nullptr;
    HERD_CUDA_CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&unit), n * sizeof(T), pool_, up_));
    for (int64_t off = 0; off < n; off += kStagingSlotFloats) {
      const int64_t c = std::min(kStagingSlotFloats, n - off);
      StagingRing::Slot& s = up_ring_.Next();
      std::memcpy(s.host, host_params_ + begin + off, c * sizeof(float));
      if constexpr (std::is_same_v<T, float>) {
        HERD_CUDA_CHECK(cudaMemcpyAsync(unit + off, s.host, c * sizeof(float), cudaMemcpyHostToDevice, up_));
      } else {
        HERD_CUDA_CHECK(cudaMemcpyAsync(s.landing, s.host, c * sizeof(float), cudaMemcpyHostToDevice, up_));
        Convert(unit + off, s.landing, c, up_);
      }
      up_ring_.Recorded(s, up_);
    }
    HERD_CUDA_CHECK(cudaEventRecord(uploaded_, up_));
    HERD_CUDA_CHECK(cudaStreamWaitEvent(compute_, uploaded_, 0));
    weights_.bases[u] = unit;
  }

  // Unit u's weights go once the kernels enqueued so far are done.
  void LetGo(int u) {
    if (weights_.bases[u] == nullptr) return;
    HERD_CUDA_CHECK(cudaFreeAsync(weights_.bases[u], compute_));
    weights_.bases[u] = nullptr;
    cudaEvent_t e;
    if (spare_events_.empty()) {
      HERD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = spare_events_.back();
      spare_events_.pop_back();
    }
    HERD_CUDA_CHECK(cudaEventRecord(e, compute_));
    retired_.push_back(e);
  }

  // Unit u's gradients on the device, zero when new.
  void HoldGradients(int u) {
    if (grads_.bases[u] != nullptr) return;
    float* g = nullptr;
    HERD_CUDA_CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&g), unit_size(u) * sizeof(float), pool_, compute_));
    HERD_CUDA_CHECK(cudaMemsetAsync(g, 0, unit_size(u) * sizeof(float), compute_));
    grads_.bases[u] = g;
  }

  // The last micro-batch's unit u is enqueued: the unit before it is
  // shipped whole (final_from), and u's first copies start once its
  // kernels are done.
  void ShipOut(int u) {
    FinishShipment();
    shipping_ = u;
    shipped_ = 0;
    HERD_CUDA_CHECK(cudaEventRecord(computed_, compute_));
    cudaEvent_t ready = computed_;
    // Reduced across the workers on the device first (the reducer's flat
    // space begins where the unit's offsets would).
    if (reducer_) ready = reducer_(grads_.bases[u] - units_[u], units_[u], units_[u + 1], computed_);
    HERD_CUDA_CHECK(cudaStreamWaitEvent(down_, ready, 0));
    while (in_flight_.size() < static_cast<size_t>(kStagingSlots) && shipped_ < unit_size(u)) CopyOutChunk();
  }
  void FinishShipment() {
    if (shipping_ < 0) return;
    const int u = shipping_;
    while (shipped_ < unit_size(u)) {
      if (in_flight_.size() == static_cast<size_t>(kStagingSlots)) LandChunk();
      CopyOutChunk();
    }
    while (!in_flight_.empty()) LandChunk();
    HERD_CUDA_CHECK(cudaFreeAsync(grads_.bases[u], down_));
    grads_.bases[u] = nullptr;
    shipping_ = -1;
    if (*final_from_) (*final_from_)(units_[u]);
  }
  void CopyOutChunk() {
    const int u = shipping_;
    const int64_t c = std::min(kStagingSlotFloats, unit_size(u) - shipped_);
    StagingRing::Slot& s = down_ring_.Next();
    HERD_CUDA_CHECK(cudaMemcpyAsync(s.host, grads_.bases[u] + shipped_, c * sizeof(float), cudaMemcpyDeviceToHost, down_));
    down_ring_.Recorded(s, down_);
    in_flight_.push_back({&s, units_[u] + shipped_, c});
    shipped_ += c;
  }
  // The oldest copy out has landed: added to the caller's gradients.
  void LandChunk() {
    const Chunk chunk = in_flight_.front();
    in_flight_.pop_front();
    HERD_CUDA_CHECK(cudaEventSynchronize(chunk.slot->done));
    float* out = host_grads_ + chunk.begin;
    const float* in = chunk.slot->host;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < chunk.count; ++i) out[i] += in[i];
  }

  struct Chunk {
    StagingRing::Slot* slot;
    int64_t begin, count;  // flat range
  };

  const int max_batch_, max_seq_len_;
  const std::string name_;
  const std::vector<int64_t> units_;  // ParamLayout::UnitBoundaries
  const bool tied_;
  // Streams, the pool and the rings outlive the model's kernels and buffers.
  cudaStream_t compute_ = nullptr, up_ = nullptr, down_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  cudaEvent_t uploaded_ = nullptr, computed_ = nullptr;
  StagingRing up_ring_{!std::is_same_v<T, float>};
  StagingRing down_ring_{false};
  std::unique_ptr<CudaLlamaModel<T>> model_;

  // Owned by the calling thread, call to call.
  UnitTable<T> weights_;      // the units of weights on the device
  UnitTable<float> grads_;    // the units of gradients on the device
  std::deque<cudaEvent_t> retired_;  // recorded after units let go, oldest first
  std::vector<cudaEvent_t> spare_events_;
  int shipping_ = -1;   // the unit whose gradients are on their way out
  int64_t shipped_ = 0;  // its elements whose copies are enqueued
  std::deque<Chunk> in_flight_;
  const float* host_params_ = nullptr;
  float* host_grads_ = nullptr;
  const FinalFrom* final_from_ = nullptr;
  GradientReducer reducer_;  // AttachGradientReducer's, if any
  std::vector<float> host_logits_;
  int64_t allocated_ = 0;  // by the constructor
};

}  // namespace

StatusOr<std::unique_ptr<Model>> NewStreamedCudaModel(const LlamaShape& shape, int max_batch, int max_seq_len,
                                                      bool bf16, int device, Recompute recompute, bool accumulates) {
  HERD_ASSIGN_OR_RETURN(
      const std::string name,
      PrepareDevice(shape, device, bf16,
                    StreamedGpuWorkerDeviceBytes(shape, max_batch, max_seq_len, bf16, recompute, accumulates)));
  int pools = 0;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess || pools == 0) {
    (void)cudaGetLastError();
    return Status::FailedPrecondition("cluster.stream_weights: " + name +
                                      " has no stream-ordered memory pools, which the device window needs");
  }
  return MakeCudaModel<StreamedCudaModel>(bf16, shape, max_batch, max_seq_len, device, name, recompute);
}

}  // namespace herd::cuda
