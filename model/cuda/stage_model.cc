#include "model/cuda/stage_model.h"

#include <string>
#include <type_traits>
#include <vector>

#include "model/cuda/check.h"
#include "model/cuda/device_memory.h"
#include "model/cuda/kernels.h"
#include "model/cuda/llama_cuda.h"
#include "model/cuda/staged_model.h"
#include "model/peak_flops.h"

namespace herd::cuda {
namespace {

template <typename T>
class CudaStageModel final : public StageModel {
 public:
  CudaStageModel(const LlamaShape& shape, int max_batch, int max_seq_len, int device, std::string name,
                 Recompute recompute, LayerRange layers, int slots, bool split_backward, DeviceTensorGroup group)
      : layout_(shape), max_batch_(max_batch), max_seq_len_(max_seq_len), name_(std::move(name)) {
    HERD_CUDA_CHECK(cudaSetDevice(device));
    HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int i = 0; i < slots; ++i) {
      models_.push_back(std::make_unique<CudaLlamaModel<T>>(shape, max_batch, max_seq_len, stream_, recompute, group,
                                                            layers, DeviceContextGroup{}, split_backward));
    }
    // The stage's units on the device; the rest of the space stays null,
    // so a read of it stops the process (UnitSpace).
    const std::vector<int64_t> bounds = layout_.UnitBoundaries();
    weights_.begins.assign(bounds.begin(), bounds.end() - 1);
    grads_.begins = weights_.begins;
    weights_.bases.assign(weights_.begins.size(), nullptr);
    grads_.bases.assign(grads_.begins.size(), nullptr);
    landing_.assign(weights_.begins.size(), nullptr);
    for (int u : StageUnits(shape, layers)) {
      const int64_t n = bounds[u + 1] - bounds[u];
      units_.push_back({bounds[u], bounds[u + 1], u, false});
      HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&weights_.bases[u]), n * sizeof(T)));
      HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&grads_.bases[u]), n * sizeof(float)));
      HERD_CUDA_CHECK(cudaMemsetAsync(grads_.bases[u], 0, n * sizeof(float), stream_));
      if constexpr (!std::is_same_v<T, float>) {
        HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&landing_[u]), n * sizeof(float)));
      }
    }
    const int64_t elements = models_[0]->StageElements(max_batch, max_seq_len);
    for (int i = 0; i < slots; ++i) {
      host_.push_back({std::vector<float>(elements), std::vector<float>(elements), std::vector<float>(elements),
                       std::vector<float>(elements)});
    }
    if constexpr (!std::is_same_v<T, float>) {
      HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&activation_landing_), elements * sizeof(float)));
    }
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  ~CudaStageModel() override {
    cudaStreamSynchronize(stream_);
    models_.clear();
    for (size_t u = 0; u < weights_.bases.size(); ++u) {
      cudaFree(weights_.bases[u]);
      cudaFree(grads_.bases[u]);
      cudaFree(landing_[u]);
    }
    cudaFree(activation_landing_);
    cudaStreamDestroy(stream_);
  }

  const ParamLayout& layout() const override { return layout_; }
  int max_batch() const override { return max_batch_; }
  int max_seq_len() const override { return max_seq_len_; }
  int slots() const override { return static_cast<int>(models_.size()); }
  std::string Describe() const override { return name_; }
  int64_t DevicePeakBytes() const override { return allocated_; }  // everything is allocated when made
  void set_allocated(int64_t bytes) { allocated_ = bytes; }

  int64_t StageElements(int B, int T_) const override { return models_[0]->StageElements(B, T_); }
  float* StageInput(int slot) override { return host_[slot].input.data(); }
  float* StageOutputGrad(int slot) override { return host_[slot].output_grad.data(); }

  double StageForward(int slot, const float* params, const int32_t* tokens, const int32_t* targets,
                      const float* input, int B, int T_, float* grads, double loss_scale,
                      const NeedUpTo& need) override {
    CudaLlamaModel<T>& m = *models_[slot];
    last_B_ = B;
    last_T_ = T_;
    const int64_t n = m.StageElements(B, T_);
    if (input != nullptr) ToDevice(m.StageInput(), input, n);
    auto upload = [&](int64_t end) {
      if (need) need(end);  // the caller's [0, end) is in host memory now
      for (Unit& u : units_) {
        if (!u.uploaded && u.begin < end) Upload(u, params);
      }
    };
    UnitSpace<float> device_grads(&grads_);
    const double loss = m.StageForward(UnitSpace<const T>(Weights()), tokens, targets, m.StageInput(), B, T_,
                                       grads != nullptr ? &device_grads : nullptr, loss_scale, upload);
    if (!m.has_head()) ToHost(host_[slot].output.data(), m.StageOutput(), n);
    return loss;
  }
  const float* StageOutput(int slot) override { return host_[slot].output.data(); }

  void StageBackward(int slot, const float* /*params: the device's copy*/, float* grads, const float* output_grad,
                     bool last_micro_batch, const FinalFrom& final_from, const NeedFrom& /*need_from*/) override {
    CudaLlamaModel<T>& m = *models_[slot];
    if (output_grad != nullptr) ToDevice(m.StageOutputGrad(), output_grad, StageElementsOfLast(m));
    m.StageBackward(UnitSpace<const T>(Weights()), UnitSpace<float>(&grads_), m.StageOutputGrad());
    if (!m.embeds()) ToHost(host_[slot].input_grad.data(), m.StageInputGrad(), StageElementsOfLast(m));
    if (last_micro_batch) Deliver(grads, final_from);
  }
  const float* StageInputGrad(int slot) override { return host_[slot].input_grad.data(); }

  void StageBackwardInput(int slot, const float* /*params: the device's copy*/, float* /*grads: at the weights'*/,
                          const float* output_grad, const FinalFrom& /*done*/, const NeedFrom& /*need_from*/) override {
    CudaLlamaModel<T>& m = *models_[slot];
    if (output_grad != nullptr) ToDevice(m.StageOutputGrad(), output_grad, StageElementsOfLast(m));
    m.StageBackwardInput(UnitSpace<const T>(Weights()), UnitSpace<float>(&grads_), m.StageOutputGrad());
    if (!m.embeds()) ToHost(host_[slot].input_grad.data(), m.StageInputGrad(), StageElementsOfLast(m));
  }
  // The step's last micro-batch's calls it with final_from.
  void StageBackwardWeights(int slot, float* grads, const FinalFrom& final_from) override {
    models_[slot]->StageBackwardWeights(UnitSpace<float>(&grads_));
    if (final_from) Deliver(grads, final_from);
  }

  void EndStep() override {
    for (Unit& u : units_) u.uploaded = false;
  }

  const float* logits() override {
    models_[0]->LogitsToHost(&host_logits_);
    return host_logits_.data();
  }

 private:
  struct Unit {
    int64_t begin, end;
    int index;              // in the UnitTable
    bool uploaded = false;  // the device holds the host's weights of this step
  };
  struct HostBuffers {
    std::vector<float> input, output, output_grad, input_grad;  // StageElements each
  };

  const UnitTable<T>* Weights() const { return &weights_; }

  // The step's sums, unit by unit from the last, into the caller's (the
  // device's zeroed for the next step).
  void Deliver(float* grads, const FinalFrom& final_from) {
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto u = units_.rbegin(); u != units_.rend(); ++u) {
      const int64_t size = u->end - u->begin;
      staging_.resize(size);
      HERD_CUDA_CHECK(cudaMemcpy(staging_.data(), grads_.bases[u->index], size * 4, cudaMemcpyDeviceToHost));
      float* into = grads + u->begin;
      for (int64_t i = 0; i < size; ++i) into[i] += staging_[i];
      HERD_CUDA_CHECK(cudaMemsetAsync(grads_.bases[u->index], 0, size * sizeof(float), stream_));
      if (final_from) final_from(u->begin);
    }
  }
  int64_t StageElementsOfLast(const CudaLlamaModel<T>& m) const { return m.StageElements(last_B_, last_T_); }

  // The unit's weights from the host, converted on the device in bf16.
  void Upload(Unit& u, const float* params) {
    u.uploaded = true;
    const int64_t n = u.end - u.begin;
    if constexpr (std::is_same_v<T, float>) {
      HERD_CUDA_CHECK(cudaMemcpyAsync(weights_.bases[u.index], params + u.begin, n * 4, cudaMemcpyHostToDevice,
                                      stream_));
    } else {
      HERD_CUDA_CHECK(cudaMemcpyAsync(landing_[u.index], params + u.begin, n * 4, cudaMemcpyHostToDevice, stream_));
      Convert(weights_.bases[u.index], landing_[u.index], n, stream_);
    }
  }
  // n fp32 host elements into the compute dtype's device buffer `to`.
  void ToDevice(T* to, const float* from, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      HERD_CUDA_CHECK(cudaMemcpyAsync(to, from, n * 4, cudaMemcpyHostToDevice, stream_));
    } else {
      HERD_CUDA_CHECK(cudaMemcpyAsync(activation_landing_, from, n * 4, cudaMemcpyHostToDevice, stream_));
      Convert(to, activation_landing_, n, stream_);
    }
  }
  // n device elements as fp32 into the host's `to`, waited for.
  void ToHost(float* to, const T* from, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      HERD_CUDA_CHECK(cudaMemcpyAsync(to, from, n * 4, cudaMemcpyDeviceToHost, stream_));
    } else {
      Convert(activation_landing_, from, n, stream_);
      HERD_CUDA_CHECK(cudaMemcpyAsync(to, activation_landing_, n * 4, cudaMemcpyDeviceToHost, stream_));
    }
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  const ParamLayout layout_;
  const int max_batch_, max_seq_len_;
  const std::string name_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::unique_ptr<CudaLlamaModel<T>>> models_;  // one per slot
  UnitTable<T> weights_;
  UnitTable<float> grads_;
  std::vector<float*> landing_;  // bf16: each unit's fp32 weights land here, then are converted
  float* activation_landing_ = nullptr;
  std::vector<Unit> units_;  // the stage's, ascending
  std::vector<HostBuffers> host_;
  std::vector<float> staging_, host_logits_;
  int last_B_ = 0, last_T_ = 0;
  int64_t allocated_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<StageModel>> NewCudaStageModel(const LlamaShape& shape, int max_batch, int max_seq_len,
                                                        bool bf16, int device, Recompute recompute, LayerRange layers,
                                                        int slots, bool split_backward, DeviceTensorGroup group) {
  const CudaModelPart part{group.ranks, group.sequence_parallel, layers, 1, split_backward};
  HERD_ASSIGN_OR_RETURN(const std::string name,
                        PrepareDevice(shape, device, bf16,
                                      StageWorkerDeviceBytes(shape, max_batch, max_seq_len, bf16, recompute, part,
                                                             slots, StageHeldElements(shape, layers))));
  const int64_t before = UsedDeviceBytes();
  auto make = [&](auto zero) -> std::unique_ptr<StageModel> {
    auto model = std::make_unique<CudaStageModel<decltype(zero)>>(shape, max_batch, max_seq_len, device, name,
                                                                  recompute, layers, slots, split_backward, group);
    model->set_allocated(UsedDeviceBytes() - before);
    return model;
  };
  return bf16 ? make(__nv_bfloat16{}) : make(float{});
}

}  // namespace herd::cuda
