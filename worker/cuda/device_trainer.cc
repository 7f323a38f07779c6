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

template <typename T>
class ResidentTrainer final : public DeviceTrainer {
 public:
  ResidentTrainer(const Options& o, std::string name)
      : o_(o), name_(std::move(name)), layout_(o.shape), P_(layout_.size()), evaluator_(this) {
    HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    model_ = std::make_unique<CudaLlamaModel<T>>(o.shape, o.batch, o.seq_len, stream_, o.recompute);
    for (float** p : {&master_, &grads_, &m_, &v_}) HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(p), P_ * 4));
    const int64_t chunks = SumOfSquaresChunks(P_);
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&partials_), chunks * 8));
    host_partials_.resize(chunks);
    if constexpr (!std::is_same_v<T, float>) {
      HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&compute_), P_ * sizeof(T)));
    }
    // AdamW runs once per run of equal decay (the tensors alternate).
    for (const DecaySegment& s : DecaySegments(layout_, 0, P_)) {
      if (!runs_.empty() && runs_.back().decay == s.decay && runs_.back().end == s.begin) {
        runs_.back().end = s.end;
      } else {
        runs_.push_back(s);
      }
    }
  }

  ~ResidentTrainer() override {
    cudaStreamSynchronize(stream_);
    model_.reset();
    for (void* p : {static_cast<void*>(master_), static_cast<void*>(grads_), static_cast<void*>(m_),
                    static_cast<void*>(v_), static_cast<void*>(partials_), static_cast<void*>(compute_)})
      cudaFree(p);
    cudaStreamDestroy(stream_);
  }

  void SetState(const float* weights, const float* m, const float* v) override {
    HERD_CUDA_CHECK(cudaMemcpy(master_, weights, P_ * 4, cudaMemcpyHostToDevice));
    HERD_CUDA_CHECK(cudaMemcpy(m_, m, P_ * 4, cudaMemcpyHostToDevice));
    HERD_CUDA_CHECK(cudaMemcpy(v_, v, P_ * 4, cudaMemcpyHostToDevice));
    compute_stale_ = true;
  }

  void GetState(float* weights, float* m, float* v) override {
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    HERD_CUDA_CHECK(cudaMemcpy(weights, master_, P_ * 4, cudaMemcpyDeviceToHost));
    if (m != nullptr) HERD_CUDA_CHECK(cudaMemcpy(m, m_, P_ * 4, cudaMemcpyDeviceToHost));
    if (v != nullptr) HERD_CUDA_CHECK(cudaMemcpy(v, v_, P_ * 4, cudaMemcpyDeviceToHost));
  }

  Gradients ComputeGradients(const std::vector<const int32_t*>& inputs,
                             const std::vector<const int32_t*>& targets) override {
    const int A = static_cast<int>(inputs.size());
    const T* params = ComputeWeights();
    HERD_CUDA_CHECK(cudaMemsetAsync(grads_, 0, P_ * 4, stream_));
    const double loss_scale = 1.0 / (static_cast<double>(o_.batch) * o_.seq_len * A);
    Gradients g;
    for (int a = 0; a < A; ++a) {
      g.loss += model_->Forward(params, inputs[a], targets[a], o_.batch, o_.seq_len);
      model_->Backward(params, grads_, loss_scale);
    }
    g.loss /= A;
    // The global norm: fixed chunks in double on the device, added in order.
    SumOfSquaresPartials(partials_, grads_, P_, stream_);
    HERD_CUDA_CHECK(
        cudaMemcpyAsync(host_partials_.data(), partials_, host_partials_.size() * 8, cudaMemcpyDeviceToHost, stream_));
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    double squares = 0;
    for (double p : host_partials_) squares += p;
    g.global_norm = std::sqrt(squares);
    return g;
  }

  void ApplyUpdate(const OptimizerShard::Scalars& step) override {
    if (step.spike.skip) return;
    const AdamWScalars k = MakeAdamWScalars(o_.adamw, step.step, step.lr, step.grad_scale);
    for (const DecaySegment& s : runs_) {
      AdamW(master_ + s.begin, grads_ + s.begin, m_ + s.begin, v_ + s.begin, s.end - s.begin, k, k.DecayFor(s.decay),
            stream_);
    }
    HERD_CUDA_CHECK_LAUNCH();
    compute_stale_ = true;
  }

  void Synchronize() override { HERD_CUDA_CHECK(cudaDeviceSynchronize()); }
  Model& evaluator() override { return evaluator_; }
  std::string Describe() const override { return name_; }

 private:
  // The weights in the compute dtype, refreshed after every change.
  const T* ComputeWeights() {
    if constexpr (std::is_same_v<T, float>) {
      return master_;
    } else {
      if (compute_stale_) Convert(compute_, master_, P_, stream_);
      compute_stale_ = false;
      return compute_;
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
      return t_->model_->Forward(t_->ComputeWeights(), tokens, targets, B, T_);
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

  const Options o_;
  const std::string name_;
  const ParamLayout layout_;
  const int64_t P_;
  Evaluator evaluator_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaLlamaModel<T>> model_;
  float *master_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  double* partials_ = nullptr;
  T* compute_ = nullptr;  // bf16 mode's copy of master_
  bool compute_stale_ = true;
  std::vector<double> host_partials_;
  std::vector<DecaySegment> runs_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceTrainer>> DeviceTrainer::Create(const Options& o) {
  HERD_ASSIGN_OR_RETURN(
      const std::string name,
      PrepareDevice(o.shape, o.device, o.bf16,
                    DeviceTrainerDeviceBytes(o.shape, o.batch, o.seq_len, o.bf16, o.recompute)));
  if (o.bf16) return std::unique_ptr<DeviceTrainer>(new ResidentTrainer<__nv_bfloat16>(o, name));
  return std::unique_ptr<DeviceTrainer>(new ResidentTrainer<float>(o, name));
}

}  // namespace herd::cuda
