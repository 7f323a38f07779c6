#include "model/cuda/staged_model.h"

#include <deque>
#include <type_traits>
#include <string>
#include <vector>

#include "common/strings.h"
#include "common/trace.h"
#include "model/cuda/check.h"
#include "model/cuda/cublaslt_loader.h"
#include "model/cuda/device_memory.h"
#include "model/cuda/kernels.h"
#include "model/cuda/llama_cuda.h"
#include "model/peak_flops.h"

namespace herd::cuda {

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // "no driver" is an answer here, not an error
    return 0;
  }
  return count;
}

int64_t UsedDeviceBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  HERD_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(total_bytes - free_bytes);
}

int64_t DeviceFreeBytes(int device) {
  size_t free_bytes = 0, total_bytes = 0;
  HERD_CUDA_CHECK(cudaSetDevice(device));
  HERD_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

namespace {

template <typename T>
class StagedCudaModel final : public CudaModelBase {
 public:
  StagedCudaModel(const LlamaShape& shape, int max_batch, int max_seq_len, int device, std::string name,
                  Recompute recompute, DeviceTensorGroup group, DeviceContextGroup context,
                  ContextGroup<float> host_context)
      : max_batch_(max_batch), max_seq_len_(max_seq_len), name_(std::move(name)), context_(std::move(host_context)) {
    HERD_CUDA_CHECK(cudaSetDevice(device));
    HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    model_ = std::make_unique<CudaLlamaModel<T>>(shape, max_batch, max_seq_len, compute_, recompute, std::move(group),
                                                 LayerRange{}, std::move(context));
    const int64_t P = model_->layout().size();
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&params_), P * sizeof(T)));
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&grads_), P * sizeof(float)));
    if constexpr (!std::is_same_v<T, float>) HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&params_f32_), P * 4));
    HERD_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&grad_staging_), P * sizeof(float)));
  }

  ~StagedCudaModel() override {
    cudaStreamSynchronize(compute_);
    cudaStreamSynchronize(copy_);
    model_.reset();
    for (const void* p : registered_) cudaHostUnregister(const_cast<void*>(p));
    for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
    cudaFree(params_);
    cudaFree(grads_);
    cudaFree(params_f32_);
    cudaFreeHost(grad_staging_);
    cudaStreamDestroy(compute_);
    cudaStreamDestroy(copy_);
  }

  const ParamLayout& layout() const override { return model_->layout(); }
  int max_batch() const override { return max_batch_; }
  int max_seq_len() const override { return max_seq_len_; }
  std::string Describe() const override { return name_; }
  double PeakTflops() const override { return DatasheetPeakTflops(name_, !std::is_same_v<T, float>); }
  // Everything is allocated when the model is made.
  int64_t DevicePeakBytes() const override { return allocated_; }
  void set_allocated(int64_t bytes) { allocated_ = bytes; }

  double Forward(const float* params, const int32_t* tokens, const int32_t* targets, int B, int T_,
                 const NeedUpTo& need) override {
    Register(params);
    // The device keeps the last weights: a micro-batch after the first, or
    // an evaluation of unchanged weights, uploads nothing.
    const bool upload_all = upload_due_ || need != nullptr || params != uploaded_from_;
    upload_due_ = false;
    uploaded_from_ = params;
    int64_t uploaded = 0;
    float* landing;
    if constexpr (std::is_same_v<T, float>)
      landing = params_;
    else
      landing = params_f32_;
    auto upload = [&](int64_t end) {
      if (need) need(end);  // the caller's [0, end) is in host memory now
      if (!upload_all || end <= uploaded) return;
      const int64_t n = end - uploaded;
      HERD_CUDA_CHECK(
          cudaMemcpyAsync(landing + uploaded, params + uploaded, n * sizeof(float), cudaMemcpyHostToDevice, copy_));
      cudaEvent_t copied = NextEvent();
      HERD_CUDA_CHECK(cudaEventRecord(copied, copy_));
      HERD_CUDA_CHECK(cudaStreamWaitEvent(compute_, copied, 0));
      if constexpr (!std::is_same_v<T, float>) Convert(params_ + uploaded, landing + uploaded, n, compute_);
      uploaded = end;
    };
    events_used_ = 0;
    if (context_.ranks == 1) return model_->Forward(params_, tokens, targets, B, T_, upload);
    // A context rank's chunks: a length they do not divide (a prompt being
    // sampled) padded at the end, which causal attention never reads.
    forward_len_ = static_cast<int>(ContextPaddedLength(context_.ranks, T_));
    if (forward_len_ != T_) {
      CHECK(targets == nullptr) << "a context-parallel loss over " << T_ << " tokens: not " << 2 * context_.ranks
                                << " chunks";
      padded_.assign(static_cast<size_t>(B) * forward_len_, 0);
      for (int b = 0; b < B; ++b) std::copy(tokens + b * T_, tokens + (b + 1) * T_, padded_.begin() + b * forward_len_);
      tokens = padded_.data();
    }
    return ContextGroupMean(context_, model_->Forward(params_, tokens, targets, B, forward_len_, upload));
  }

  void Backward(const float* params, float* grads, double loss_scale, const FinalFrom& final_from,
                bool last_micro_batch, const NeedFrom& /*need_from: every weight is on the device*/) override {
    (void)params;  // the device copy of the last Forward's weights is used
    const int64_t P = model_->layout().size();
    // Micro-batches accumulate on the device; the step's last one ships
    // the sum (reduced across workers first, when a reducer is attached).
    if (!device_grads_pending_) HERD_CUDA_CHECK(cudaMemsetAsync(grads_, 0, P * sizeof(float), compute_));
    device_grads_pending_ = true;
    if (!last_micro_batch) {
      model_->Backward(params_, grads_, loss_scale);
      return;
    }
    device_grads_pending_ = false;
    upload_due_ = true;  // the caller now steps the weights
    Register(grads);
    struct Range {
      int64_t begin, end;
      cudaEvent_t copied;
    };
    std::deque<Range> in_flight;
    int64_t staged_from = P;
    events_used_ = 0;
    auto stage = [&](int64_t from) {
      if (from >= staged_from) return;
      cudaEvent_t ready = NextEvent(), copied = NextEvent();
      HERD_CUDA_CHECK(cudaEventRecord(ready, compute_));
      if (reducer_) ready = reducer_(grads_, from, staged_from, ready);
      HERD_CUDA_CHECK(cudaStreamWaitEvent(copy_, ready, 0));
      HERD_CUDA_CHECK(cudaMemcpyAsync(grad_staging_ + from, grads_ + from, (staged_from - from) * sizeof(float),
                                      cudaMemcpyDeviceToHost, copy_));
      HERD_CUDA_CHECK(cudaEventRecord(copied, copy_));
      in_flight.push_back({from, staged_from, copied});
      staged_from = from;
    };
    // Every kernel is enqueued before the first wait below, so the device
    // computes the early layers' gradients while the host adds and ships
    // the late ones.
    model_->Backward(params_, grads_, loss_scale, stage);
    for (const Range& r : in_flight) {
      {
        trace::Span span("wait for gradient copy", "wait", {"from", r.begin});
        HERD_CUDA_CHECK(cudaEventSynchronize(r.copied));
      }
      {
        trace::Span span("add gradients", "compute", {"from", r.begin});
#pragma omp parallel for simd schedule(static)
        for (int64_t i = r.begin; i < r.end; ++i) grads[i] += grad_staging_[i];
      }
      if (final_from) final_from(r.begin);
    }
  }

  void SetGradientReducer(GradientReducer reducer) override { reducer_ = std::move(reducer); }

  const float* logits() override {
    model_->LogitsToHost(&host_logits_);
    return host_logits_.data();
  }
  // A tensor-parallel rank's: its columns of the row, the others' summed in.
  const float* LastLogits(int T_) override {
    if (context_.ranks > 1) {
      // Position T_ - 1 of the last Forward is in one rank's chunk: its row, gathered.
      model_->LogitsToHost(&host_logits_);
      return ContextGatherRow(context_, host_logits_.data(), forward_len_, T_ - 1, shape().vocab_size, row_);
    }
    model_->LogitsRowToHost(T_ - 1, &host_logits_);
    return host_logits_.data();
  }
  int vocab_size() const override { return shape().vocab_size * model_->tensor_group().ranks; }

 private:
  // Page-locks a caller's buffer (the whole flat space) once.
  void Register(const float* p) {
    for (const void* r : registered_)
      if (r == p) return;
    const size_t bytes = model_->layout().size() * sizeof(float);
    if (cudaHostRegister(const_cast<float*>(p), bytes, cudaHostRegisterDefault) == cudaSuccess) {
      registered_.push_back(p);
    } else {
      (void)cudaGetLastError();  // copies from pageable memory still work, only slower
    }
  }
  // Events are reused call after call (creating one per range would cost
  // a driver call each).
  cudaEvent_t NextEvent() {
    if (events_used_ == event_pool_.size()) {
      cudaEvent_t e;
      HERD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      event_pool_.push_back(e);
    }
    return event_pool_[events_used_++];
  }

  const int max_batch_, max_seq_len_;
  const std::string name_;
  // Context parallelism: the group over host memory, for the loss's mean
  // and a sampled row; a forward's tokens padded to whole chunks.
  const ContextGroup<float> context_;
  std::vector<int32_t> padded_;
  std::vector<float> row_;
  int forward_len_ = 0;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  std::unique_ptr<CudaLlamaModel<T>> model_;
  T* params_ = nullptr;
  float* params_f32_ = nullptr;  // bf16 mode: fp32 weights land here, then are converted
  float* grads_ = nullptr;
  float* grad_staging_ = nullptr;
  std::vector<const void*> registered_;
  std::vector<cudaEvent_t> event_pool_;
  size_t events_used_ = 0;
  std::vector<float> host_logits_;
  GradientReducer reducer_;
  bool device_grads_pending_ = false, upload_due_ = true;
  const float* uploaded_from_ = nullptr;
  int64_t allocated_ = 0;
};

}  // namespace

Status AttachGradientReducer(Model& model, GradientReducer reducer) {
  auto* cuda_model = dynamic_cast<CudaModelBase*>(&model);
  if (cuda_model == nullptr) return Status::InvalidArgument("gradients are reduced on the device only for CUDA models");
  cuda_model->SetGradientReducer(std::move(reducer));
  return Status::OK();
}

StatusOr<std::string> PrepareDevice(const LlamaShape& shape, int device, bool bf16, int64_t needed_bytes) {
  const int count = DeviceCount();
  if (count == 0) return Status::FailedPrecondition("device.kind CUDA: no CUDA device is visible to this process");
  if (device < 0 || device >= count) {
    return Status::InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (this process sees " +
                                   std::to_string(count) + ")");
  }
#if !defined(HERD_CUDA_EMULATION)
  std::string missing;
  if (!CublasLtAvailable(&missing)) return Status::FailedPrecondition("device.kind CUDA: " + missing);
#endif
  const std::string why = CudaLlamaModel<float>::CheckShape(shape);
  if (!why.empty()) return Status::InvalidArgument("model: " + why);
  cudaDeviceProp prop{};
  std::string gpu = "device";
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) gpu = prop.name;
  const std::string name = "cuda:" + std::to_string(device) + " " + gpu + ", " + (bf16 ? "bf16" : "fp32");
  // Out of device memory is a clear error here, not an abort mid-allocation.
  size_t free_bytes = 0, total_bytes = 0;
  HERD_CUDA_CHECK(cudaSetDevice(device));
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && needed_bytes > static_cast<int64_t>(free_bytes)) {
    return Status::FailedPrecondition("device.kind CUDA: the model needs " + FormatBytes(needed_bytes) + " on " + name +
                                      ", which has " + FormatBytes(static_cast<int64_t>(free_bytes)) +
                                      " free; lower train.batch_size or train.seq_len");
  }
  return name;
}

StatusOr<std::unique_ptr<Model>> NewStagedCudaModel(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                                                    int device, Recompute recompute, DeviceTensorGroup group,
                                                    DeviceContextGroup context, ContextGroup<float> host_context) {
  HERD_ASSIGN_OR_RETURN(
      const std::string name,
      PrepareDevice(shape, device, bf16,
                    GpuWorkerDeviceBytes(shape, max_batch, max_seq_len, bf16, recompute,
                                         CudaModelPart{group.ranks, group.sequence_parallel, {}, context.ranks})));
  return MakeCudaModel<StagedCudaModel>(bf16, shape, max_batch, max_seq_len, device, name, recompute, group, context,
                                        host_context);
}

namespace {

// Runs `host_op` over the n elements at `data` copied to the host as fp32
// (a bf16 buffer converted), and copies them back, the stream waited for
// on each side (the host buffers are the next call's).
struct HostStaging {
  std::vector<float> host;
  std::vector<bf16> raw;

  template <typename F>
  void Run(void* data, int64_t n, int element_bytes, void* stream, F host_op) {
    auto* st = static_cast<cudaStream_t>(stream);
    host.resize(n);
    if (element_bytes == 4) {
      HERD_CUDA_CHECK(cudaMemcpyAsync(host.data(), data, n * 4, cudaMemcpyDeviceToHost, st));
      HERD_CUDA_CHECK(cudaStreamSynchronize(st));
    } else {
      raw.resize(n);
      HERD_CUDA_CHECK(cudaMemcpyAsync(raw.data(), data, n * 2, cudaMemcpyDeviceToHost, st));
      HERD_CUDA_CHECK(cudaStreamSynchronize(st));
      for (int64_t i = 0; i < n; ++i) host[i] = __bfloat162float(raw[i]);
    }
    host_op(host.data());
    if (element_bytes == 4) {
      HERD_CUDA_CHECK(cudaMemcpyAsync(data, host.data(), n * 4, cudaMemcpyHostToDevice, st));
    } else {
      for (int64_t i = 0; i < n; ++i) raw[i] = __float2bfloat16(host[i]);
      HERD_CUDA_CHECK(cudaMemcpyAsync(data, raw.data(), n * 2, cudaMemcpyHostToDevice, st));
    }
    HERD_CUDA_CHECK(cudaStreamSynchronize(st));
  }
};

int64_t Total(const Partition& parts) {
  int64_t n = 0;
  for (int64_t p : parts) n += p;
  return n;
}

}  // namespace

DeviceContextGroup StagedGroup(const ContextGroup<float>& host) {
  DeviceContextGroup g;
  g.ranks = host.ranks;
  g.rank = host.rank;
  auto staging = std::make_shared<HostStaging>();
  g.all_gather = [host, staging](void* data, const Partition& parts, int element_bytes, void* stream) {
    staging->Run(data, Total(parts), element_bytes, stream, [&](float* h) { host.all_gather(h, parts); });
  };
  g.reduce_scatter = [host, staging](void* data, const Partition& parts, int element_bytes, void* stream) {
    staging->Run(data, Total(parts), element_bytes, stream, [&](float* h) { host.reduce_scatter(h, parts); });
  };
  return g;
}

DeviceTensorGroup StagedGroup(const TensorGroup<float>& host) {
  DeviceTensorGroup g;
  g.ranks = host.ranks;
  g.rank = host.rank;
  g.vocab_first = host.vocab_first;
  auto staging = std::make_shared<HostStaging>();
  g.all_reduce = [host, staging](void* data, int64_t n, int element_bytes, void* stream) {
    staging->Run(data, n, element_bytes, stream, [&](float* h) { host.all_reduce(h, n); });
  };
  g.sequence_parallel = host.sequence_parallel;
  if (!host.sequence_parallel) return g;
  g.all_gather = [host, staging](void* data, const Partition& parts, int element_bytes, void* stream) {
    staging->Run(data, Total(parts), element_bytes, stream, [&](float* h) { host.all_gather(h, parts); });
  };
  g.reduce_scatter = [host, staging](void* data, const Partition& parts, int element_bytes, void* stream) {
    staging->Run(data, Total(parts), element_bytes, stream, [&](float* h) { host.reduce_scatter(h, parts); });
  };
  return g;
}

}  // namespace herd::cuda
