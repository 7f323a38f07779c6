#include "worker/cuda/device_trainer.h"

#include <cmath>
#include <string>
#include <type_traits>

#include "model/cuda/check.h"
#include "model/cuda/device_memory.h"
#include "model/cuda/kernels.h"
#include "model/cuda/llama_cuda.h"
#include "model/cuda/staged_model.h"
#include "model/optim/adamw.h"
#include "model/param_layout.h"
#include "model/peak_flops.h"

namespace herd::cuda {
namespace {

// The whole space, when `ranges` is empty.
std::vector<ParamRange> OrWhole(const std::vector<ParamRange>& ranges, int64_t P) {
  return ranges.empty() ? std::vector<ParamRange>{{0, P}} : ranges;
}

int64_t SizeOf(const std::vector<ParamRange>& ranges) {
  int64_t n = 0;
  for (const ParamRange& r : ranges) n += r.size();
  return n;
}

template <typename T>
class ResidentTrainer final : public DeviceTrainer {
 public:
  ResidentTrainer(const Options& o, std::string name)
      : o_(o),
        name_(std::move(name)),
        layout_(o.shape),
        P_(layout_.size()),
        owned_(OrWhole(o.owned, P_)),
        counted_(OrWhole(o.counted, P_)),
        owned_size_(SizeOf(owned_)),
        evaluator_(this) {
    HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    model_ = std::make_unique<CudaLlamaModel<T>>(o.shape, o.batch, o.seq_len, stream_, o.recompute);
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&weights_), P_ * sizeof(T)));
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&grads_), P_ * 4));
    for (float** p : {&m_, &v_}) HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(p), owned_size_ * 4));
    if constexpr (!std::is_same_v<T, float>) {
      HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&master_), owned_size_ * 4));
    }
    int64_t chunks = 0;
    for (const ParamRange& r : counted_) chunks += SumOfSquaresChunks(r.size());
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&partials_), chunks * 8));
    host_partials_.resize(chunks);
    // AdamW runs once per run of equal decay (the tensors alternate), each
    // inside one owned range, at its packed offset.
    int64_t packed = 0;
    for (const ParamRange& r : owned_) {
      for (const DecaySegment& s : DecaySegments(layout_, r.begin, r.end)) {
        if (!runs_.empty() && runs_.back().decay == s.decay && runs_.back().end == s.begin) {
          runs_.back().end = s.end;
        } else {
          runs_.push_back({s.begin, s.end, packed + (s.begin - r.begin), s.decay});
        }
      }
      packed += r.size();
    }
  }

  ~ResidentTrainer() override {
    cudaStreamSynchronize(stream_);
    model_.reset();
    for (void* p : {static_cast<void*>(weights_), static_cast<void*>(grads_), static_cast<void*>(m_),
                    static_cast<void*>(v_), static_cast<void*>(partials_), static_cast<void*>(master_)})
      cudaFree(p);
    cudaStreamDestroy(stream_);
  }

  int64_t owned_size() const override { return owned_size_; }

  void SetState(const float* weights, const float* m, const float* v) override {
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if constexpr (std::is_same_v<T, float>) {
      HERD_CUDA_CHECK(cudaMemcpy(weights_, weights, P_ * 4, cudaMemcpyHostToDevice));
    } else {
      // The compute copy rounded on the host, a chunk at a time (nothing
      // more on the device than the trainer's own buffers).
      std::vector<T> chunk(std::min<int64_t>(P_, int64_t{1} << 20));
      for (int64_t at = 0; at < P_; at += static_cast<int64_t>(chunk.size())) {
        const int64_t n = std::min<int64_t>(chunk.size(), P_ - at);
        for (int64_t i = 0; i < n; ++i) chunk[i] = __float2bfloat16(weights[at + i]);
        HERD_CUDA_CHECK(cudaMemcpy(weights_ + at, chunk.data(), n * sizeof(T), cudaMemcpyHostToDevice));
      }
      int64_t packed = 0;
      for (const ParamRange& r : owned_) {
        HERD_CUDA_CHECK(cudaMemcpy(master_ + packed, weights + r.begin, r.size() * 4, cudaMemcpyHostToDevice));
        packed += r.size();
      }
    }
    HERD_CUDA_CHECK(cudaMemcpy(m_, m, owned_size_ * 4, cudaMemcpyHostToDevice));
    HERD_CUDA_CHECK(cudaMemcpy(v_, v, owned_size_ * 4, cudaMemcpyHostToDevice));
  }

  void GetState(float* weights, float* m, float* v) override {
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    int64_t packed = 0;
    for (const ParamRange& r : owned_) {
      HERD_CUDA_CHECK(cudaMemcpy(weights + packed, MasterOf(r.begin, packed), r.size() * 4, cudaMemcpyDeviceToHost));
      packed += r.size();
    }
    if (m != nullptr) HERD_CUDA_CHECK(cudaMemcpy(m, m_, owned_size_ * 4, cudaMemcpyDeviceToHost));
    if (v != nullptr) HERD_CUDA_CHECK(cudaMemcpy(v, v_, owned_size_ * 4, cudaMemcpyDeviceToHost));
  }

  void SetExchange(DeviceExchange* exchange) override { exchange_ = exchange; }

  Gradients ComputeGradients(const std::vector<const int32_t*>& inputs,
                             const std::vector<const int32_t*>& targets) override {
    const int A = static_cast<int>(inputs.size());
    HERD_CUDA_CHECK(cudaMemsetAsync(grads_, 0, P_ * 4, stream_));
    const double loss_scale = 1.0 / (static_cast<double>(o_.batch) * o_.seq_len * A * o_.replicas);
    Gradients g;
    for (int a = 0; a < A; ++a) {
      g.loss += model_->Forward(weights_, inputs[a], targets[a], o_.batch, o_.seq_len);
      if (a + 1 < A || exchange_ == nullptr) {
        model_->Backward(weights_, grads_, loss_scale);
        continue;
      }
      // The last micro-batch: each range leaves as soon as backward has
      // finished it, beside the rest of backward.
      int64_t reduced_from = P_;
      auto reduce = [&](int64_t from) {
        if (from >= reduced_from) return;
        exchange_->ReduceGradients(grads_, from, reduced_from, stream_);
        reduced_from = from;
      };
      model_->Backward(weights_, grads_, loss_scale, reduce);
      reduce(0);
      exchange_->AwaitGradients(stream_);
    }
    g.loss /= A;
    // The squares: fixed chunks of each counted range in double on the
    // device, added in order.
    int64_t at = 0;
    for (const ParamRange& r : counted_) {
      SumOfSquaresPartials(partials_ + at, grads_ + r.begin, r.size(), stream_);
      at += SumOfSquaresChunks(r.size());
    }
    HERD_CUDA_CHECK(
        cudaMemcpyAsync(host_partials_.data(), partials_, host_partials_.size() * 8, cudaMemcpyDeviceToHost, stream_));
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (double p : host_partials_) g.squares += p;
    return g;
  }

  void ApplyUpdate(const OptimizerShard::Scalars& step) override {
    if (step.spike.skip) return;
    const AdamWScalars k = MakeAdamWScalars(o_.adamw, step.step, step.lr, step.grad_scale);
    for (const Run& r : runs_) {
      AdamW(MasterOf(r.begin, r.packed), grads_ + r.begin, m_ + r.packed, v_ + r.packed, r.end - r.begin, k,
            k.DecayFor(r.decay), stream_);
    }
    if constexpr (!std::is_same_v<T, float>) {
      int64_t packed = 0;
      for (const ParamRange& r : owned_) {
        Convert(weights_ + r.begin, master_ + packed, r.size(), stream_);
        packed += r.size();
      }
    }
    HERD_CUDA_CHECK_LAUNCH();
    if (exchange_ != nullptr) exchange_->GatherWeights(weights_, sizeof(T), stream_);
  }

  void Synchronize() override { HERD_CUDA_CHECK(cudaDeviceSynchronize()); }
  Model& evaluator() override { return evaluator_; }
  std::string Describe() const override { return name_; }

 private:
  // The master weights of flat offset `begin`, packed offset `packed`:
  // fp32's are the compute weights themselves.
  float* MasterOf(int64_t begin, int64_t packed) {
    if constexpr (std::is_same_v<T, float>) {
      (void)packed;
      return weights_ + begin;
    } else {
      (void)begin;
      return master_ + packed;
    }
  }

  // The current weights behind the Model interface, forward only.
  class Evaluator final : public Model {
   public:
    explicit Evaluator(ResidentTrainer* t) : t_(t) {}
    const ParamLayout& layout() const override { return t_->layout_; }
    int max_batch() const override { return t_->o_.batch; }
    int max_seq_len() const override { return t_->o_.seq_len; }
    std::string Describe() const override { return t_->name_; }
    double PeakTflops() const override { return DatasheetPeakTflops(t_->name_, !std::is_same_v<T, float>); }
    double Forward(const float*, const int32_t* tokens, const int32_t* targets, int B, int T_,
                   const NeedUpTo& need) override {
      if (need) need(t_->layout_.size());
      return t_->model_->Forward(t_->weights_, tokens, targets, B, T_);
    }
    void Backward(const float*, float*, double, const FinalFrom&, bool, const NeedFrom&) override {
      LOG(FATAL) << "DeviceTrainer::evaluator() has no Backward";
    }
    const float* logits() override {
      t_->model_->LogitsToHost(&logits_);
      return logits_.data();
    }

   private:
    ResidentTrainer* t_;
    std::vector<float> logits_;
  };

  // A run of equal decay inside one owned range, and its packed offset.
  struct Run {
    int64_t begin, end, packed;
    bool decay;
  };

  const Options o_;
  const std::string name_;
  const ParamLayout layout_;
  const int64_t P_;
  const std::vector<ParamRange> owned_, counted_;
  const int64_t owned_size_;
  Evaluator evaluator_;
  DeviceExchange* exchange_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaLlamaModel<T>> model_;
  T* weights_ = nullptr;        // the compute weights, whole
  float* master_ = nullptr;     // bf16: the owned ranges' fp32 master weights, packed
  float* grads_ = nullptr;      // whole
  float *m_ = nullptr, *v_ = nullptr;  // the owned ranges', packed
  double* partials_ = nullptr;
  std::vector<double> host_partials_;
  std::vector<Run> runs_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceTrainer>> DeviceTrainer::Create(const Options& o) {
  HERD_ASSIGN_OR_RETURN(
      const std::string name,
      PrepareDevice(o.shape, o.device, o.bf16,
                    DeviceTrainerDeviceBytes(o.shape, o.batch, o.seq_len, o.bf16, o.recompute,
                                             o.owned.empty() ? -1 : SizeOf(o.owned))));
  if (o.bf16) return std::unique_ptr<DeviceTrainer>(new ResidentTrainer<__nv_bfloat16>(o, name));
  return std::unique_ptr<DeviceTrainer>(new ResidentTrainer<float>(o, name));
}

}  // namespace herd::cuda
