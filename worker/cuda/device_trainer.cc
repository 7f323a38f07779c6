#include "worker/cuda/device_trainer.h"

#include <algorithm>
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

// A run of equal decay inside one owned range, and its packed offset:
// AdamW's unit of work.
struct Run {
  int64_t begin, end, packed;
  bool decay;
};

// The squared norm of some device ranges: fixed chunks of each in double
// on the device, copied back and added in order (so two trainers that add
// the same ranges agree bitwise).
class DeviceSquares {
 public:
  // Room for ranges of these sizes.
  explicit DeviceSquares(const std::vector<int64_t>& sizes) {
    int64_t chunks = 0;
    for (int64_t n : sizes) chunks += SumOfSquaresChunks(n);
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&partials_), chunks * 8));
    host_.resize(chunks);
  }
  ~DeviceSquares() { cudaFree(partials_); }
  DeviceSquares(const DeviceSquares&) = delete;
  DeviceSquares& operator=(const DeviceSquares&) = delete;

  // Waits for `stream`; each (device address, size) of `ranges` as sized.
  double Sum(const std::vector<std::pair<const float*, int64_t>>& ranges, cudaStream_t stream) {
    int64_t at = 0;
    for (const auto& [x, n] : ranges) {
      SumOfSquaresPartials(partials_ + at, x, n, stream);
      at += SumOfSquaresChunks(n);
    }
    HERD_CUDA_CHECK(cudaMemcpyAsync(host_.data(), partials_, host_.size() * 8, cudaMemcpyDeviceToHost, stream));
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream));
    double squares = 0;
    for (double p : host_) squares += p;
    return squares;
  }

 private:
  double* partials_ = nullptr;
  std::vector<double> host_;
};

// Each range's size.
std::vector<int64_t> SizesOf(const std::vector<ParamRange>& ranges) {
  std::vector<int64_t> sizes;
  for (const ParamRange& r : ranges) sizes.push_back(r.size());
  return sizes;
}

// A trainer's current weights behind the Model interface, forward only
// (its Forward ignores the weights it is given, and it has no Backward):
// `Trainer` has o_, name_, layout_, model_, a compute type T,
// EvaluateForward and PeakBytes.
template <typename Trainer>
class Evaluated final : public Model {
 public:
  explicit Evaluated(Trainer* t) : t_(t) {}
  const ParamLayout& layout() const override { return t_->layout_; }
  int64_t DevicePeakBytes() const override { return t_->PeakBytes(); }
  int max_batch() const override { return t_->o_.batch; }
  int max_seq_len() const override { return t_->o_.seq_len; }
  std::string Describe() const override { return t_->Describe(); }
  double PeakTflops() const override { return DatasheetPeakTflops(t_->name_, t_->o_.bf16); }
  double Forward(const float*, const int32_t* tokens, const int32_t* targets, int B, int T_,
                 const NeedUpTo& need) override {
    if (need) need(t_->layout_.size());
    return t_->EvaluateForward(tokens, targets, B, T_);
  }
  void Backward(const float*, float*, double, const FinalFrom&, bool, const NeedFrom&) override {
    LOG(FATAL) << "DeviceTrainer::evaluator() has no Backward";
  }
  const float* logits() override {
    t_->model_->LogitsToHost(&logits_);
    return logits_.data();
  }

 private:
  Trainer* const t_;
  std::vector<float> logits_;
};

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
        evaluator_(this),
        squares_(SizesOf(counted_)) {
    HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    model_ = std::make_unique<CudaLlamaModel<T>>(o.shape, o.batch, o.seq_len, stream_, o.recompute);
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&weights_), P_ * sizeof(T)));
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&grads_), P_ * 4));
    for (float** p : {&m_, &v_}) HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(p), owned_size_ * 4));
    if constexpr (!std::is_same_v<T, float>) {
      HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&master_), owned_size_ * 4));
    }
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
                    static_cast<void*>(v_), static_cast<void*>(master_)})
      cudaFree(p);
    cudaStreamDestroy(stream_);
  }

  int64_t owned_size() const override { return owned_size_; }
  void set_allocated(int64_t bytes) { allocated_ = bytes; }

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
    std::vector<std::pair<const float*, int64_t>> counted;
    for (const ParamRange& r : counted_) counted.push_back({grads_ + r.begin, r.size()});
    g.squares = squares_.Sum(counted, stream_);
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
    if (exchange_ != nullptr) exchange_->GatherWeights(weights_, 0, P_, sizeof(T), stream_);
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

  // What Evaluated<ResidentTrainer> reads.
  friend class Evaluated<ResidentTrainer<T>>;
  double EvaluateForward(const int32_t* tokens, const int32_t* targets, int B, int T_) {
    return model_->Forward(weights_, tokens, targets, B, T_);
  }
  // Everything is allocated when the trainer is made.
  int64_t PeakBytes() const { return allocated_; }

  const Options o_;
  const std::string name_;
  const ParamLayout layout_;
  const int64_t P_;
  const std::vector<ParamRange> owned_, counted_;
  const int64_t owned_size_;
  Evaluated<ResidentTrainer<T>> evaluator_;
  DeviceExchange* exchange_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaLlamaModel<T>> model_;
  T* weights_ = nullptr;        // the compute weights, whole
  float* master_ = nullptr;     // bf16: the owned ranges' fp32 master weights, packed
  float* grads_ = nullptr;      // whole
  float *m_ = nullptr, *v_ = nullptr;  // the owned ranges', packed
  DeviceSquares squares_;
  std::vector<Run> runs_;
  int64_t allocated_ = 0;  // by the constructor
};

// ZeRO-3 on the device (FSDP2's layout): the owned slices' fp32 master
// weights, moments and reduced gradients, packed, are all this worker
// keeps of the model between passes. A pass gathers each unit
// (ParamLayout::UnitBoundaries) into a buffer of the compute dtype as the
// model reaches it (each owner converts its slices into place, then the
// exchange all-gathers the rest) and lets it go once its kernels are
// enqueued, so the device holds two consecutive units, the head from the
// forward's end into backward and, with tied embeddings, the embedding
// for the whole step. Each unit's gradients live from its backward to the
// step's last micro-batch: then they are reduce-scattered, this worker's
// slices kept, the rest let go. The same kernels read the same values as
// the resident trainer's, so the steps are ZeRO-1's wherever the
// exchange adds alike.
template <typename T>
class GatheredTrainer final : public DeviceTrainer {
 public:
  GatheredTrainer(const Options& o, std::string name)
      : o_(o),
        name_(std::move(name)),
        layout_(o.shape),
        P_(layout_.size()),
        units_(layout_.UnitBoundaries()),
        tied_(o.shape.tie_word_embeddings),
        owned_(OrWhole(o.owned, P_)),
        owned_size_(SizeOf(owned_)),
        evaluator_(this),
        squares_(SizesOf(owned_)) {
    HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Freed units are reused as soon as their frees are done, and kept by
    // the pool rather than given back at each synchronization.
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = o.device;
    HERD_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    uint64_t keep = UINT64_MAX;
    HERD_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    model_ = std::make_unique<CudaLlamaModel<T>>(o.shape, o.batch, o.seq_len, stream_, o.recompute);
    weights_.begins.assign(units_.begin(), units_.end() - 1);
    weights_.bases.assign(num_units(), nullptr);
    grads_.begins = weights_.begins;
    grads_.bases.assign(num_units(), nullptr);
    for (float** p : {&master_, &slice_grads_, &m_, &v_}) {
      HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(p), owned_size_ * 4));
    }
    int64_t packed = 0;
    for (const ParamRange& r : owned_) {
      packed_.push_back(packed);
      for (const DecaySegment& s : DecaySegments(layout_, r.begin, r.end)) {
        runs_.push_back({s.begin, s.end, packed + (s.begin - r.begin), s.decay});
      }
      packed += r.size();
    }
  }

  ~GatheredTrainer() override {
    cudaStreamSynchronize(stream_);
    model_.reset();
    for (int u = 0; u < num_units(); ++u) {
      LetGo(u);
      if (grads_.bases[u] != nullptr) cudaFreeAsync(grads_.bases[u], stream_);
    }
    cudaStreamSynchronize(stream_);
    for (void* p : {static_cast<void*>(master_), static_cast<void*>(slice_grads_), static_cast<void*>(m_),
                    static_cast<void*>(v_)})
      cudaFree(p);
    cudaMemPoolDestroy(pool_);
    cudaStreamDestroy(stream_);
  }

  int64_t owned_size() const override { return owned_size_; }
  void set_allocated(int64_t bytes) { allocated_ = bytes; }

  void SetState(const float* weights, const float* m, const float* v) override {
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < owned_.size(); ++i) {
      HERD_CUDA_CHECK(cudaMemcpy(master_ + packed_[i], weights + owned_[i].begin, owned_[i].size() * 4,
                                 cudaMemcpyHostToDevice));
    }
    HERD_CUDA_CHECK(cudaMemcpy(m_, m, owned_size_ * 4, cudaMemcpyHostToDevice));
    HERD_CUDA_CHECK(cudaMemcpy(v_, v, owned_size_ * 4, cudaMemcpyHostToDevice));
    for (int u = 0; u < num_units(); ++u) LetGo(u);
  }

  void GetState(float* weights, float* m, float* v) override {
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    HERD_CUDA_CHECK(cudaMemcpy(weights, master_, owned_size_ * 4, cudaMemcpyDeviceToHost));
    if (m != nullptr) HERD_CUDA_CHECK(cudaMemcpy(m, m_, owned_size_ * 4, cudaMemcpyDeviceToHost));
    if (v != nullptr) HERD_CUDA_CHECK(cudaMemcpy(v, v_, owned_size_ * 4, cudaMemcpyDeviceToHost));
  }

  void SetExchange(DeviceExchange* exchange) override { exchange_ = exchange; }

  Gradients ComputeGradients(const std::vector<const int32_t*>& inputs,
                             const std::vector<const int32_t*>& targets) override {
    CHECK(exchange_ != nullptr) << "ZeRO-3 on the device gathers its weights through an exchange";
    const int A = static_cast<int>(inputs.size());
    const double loss_scale = 1.0 / (static_cast<double>(o_.batch) * o_.seq_len * A * o_.replicas);
    Gradients g;
    const int head = num_units() - 1;
    for (int a = 0; a < A; ++a) {
      g.loss += Forward(inputs[a], targets[a], o_.batch, o_.seq_len);
      const bool last = a + 1 == A;
      auto arrive = [&](int64_t x) {
        const int u = weights_.Unit(x);
        if (weights_.bases[u] == nullptr) Gather(u);
        HoldGradients(u);
        if (tied_ && u == head) HoldGradients(0);  // the head writes the embedding's gradients
      };
      auto computed = [&](int64_t x) {  // unit u's kernels are enqueued
        const int u = weights_.Unit(x);
        LetGo(u);
        if (last) Scatter(u);
        if (u > 0) HoldGradients(u - 1);  // the embedding's backward has no need_from
      };
      model_->Backward(UnitSpace<const T>(&weights_), UnitSpace<float>(&grads_), loss_scale, computed, arrive);
      if (last) {
        for (int u = num_units(); u-- > 0;) {
          if (grads_.bases[u] != nullptr) Scatter(u);
        }
      }
      for (int u = 0; u < num_units(); ++u) LetGo(u);
    }
    g.loss /= A;
    // The owned slices are the counted ones, in the resident trainer's order.
    std::vector<std::pair<const float*, int64_t>> counted;
    for (size_t i = 0; i < owned_.size(); ++i) counted.push_back({slice_grads_ + packed_[i], owned_[i].size()});
    g.squares = squares_.Sum(counted, stream_);
    return g;
  }

  void ApplyUpdate(const OptimizerShard::Scalars& step) override {
    if (step.spike.skip) return;
    const AdamWScalars k = MakeAdamWScalars(o_.adamw, step.step, step.lr, step.grad_scale);
    for (const Run& r : runs_) {
      AdamW(master_ + r.packed, slice_grads_ + r.packed, m_ + r.packed, v_ + r.packed, r.end - r.begin, k,
            k.DecayFor(r.decay), stream_);
    }
    HERD_CUDA_CHECK_LAUNCH();
  }

  void Synchronize() override { HERD_CUDA_CHECK(cudaDeviceSynchronize()); }
  Model& evaluator() override { return evaluator_; }
  std::string Describe() const override { return name_ + ", ZeRO-3 gathered"; }

 private:
  int num_units() const { return static_cast<int>(units_.size()) - 1; }
  int64_t unit_size(int u) const { return units_[u + 1] - units_[u]; }

  // A forward on the current weights, each unit gathered as it is reached
  // and let go once the kernels past it are enqueued.
  double Forward(const int32_t* tokens, const int32_t* targets, int B, int T_) {
    int next = 0;
    int64_t past_end = 0;
    auto arrive = [&](int64_t end) {
      for (int u = 0; u < num_units() && units_[u + 1] <= past_end; ++u) {
        if (!(tied_ && u == 0)) LetGo(u);  // the tied embedding is the head too
      }
      while (next < num_units() && units_[next] < end) {
        if (weights_.bases[next] == nullptr) Gather(next);
        ++next;
      }
      past_end = end;
    };
    return model_->Forward(UnitSpace<const T>(&weights_), tokens, targets, B, T_, arrive);
  }

  // Unit u's compute weights: this worker's slices converted into place,
  // the others' gathered.
  void Gather(int u) {
    const int64_t ub = units_[u], ue = units_[u + 1];
    T* unit = nullptr;
    HERD_CUDA_CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&unit), unit_size(u) * sizeof(T), pool_, stream_));
    for (size_t i = 0; i < owned_.size(); ++i) {
      const int64_t lo = std::max(ub, owned_[i].begin), hi = std::min(ue, owned_[i].end);
      if (lo < hi) Convert(unit + (lo - ub), master_ + packed_[i] + (lo - owned_[i].begin), hi - lo, stream_);
    }
    exchange_->GatherWeights(unit - ub, ub, ue, sizeof(T), stream_);
    weights_.bases[u] = unit;
  }

  // Unit u's weights go once the kernels enqueued so far are done.
  void LetGo(int u) {
    if (weights_.bases[u] == nullptr) return;
    HERD_CUDA_CHECK(cudaFreeAsync(weights_.bases[u], stream_));
    weights_.bases[u] = nullptr;
  }

  // Unit u's gradients on the device, zero when new.
  void HoldGradients(int u) {
    if (grads_.bases[u] != nullptr) return;
    float* g = nullptr;
    HERD_CUDA_CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&g), unit_size(u) * sizeof(float), pool_, stream_));
    HERD_CUDA_CHECK(cudaMemsetAsync(g, 0, unit_size(u) * sizeof(float), stream_));
    grads_.bases[u] = g;
  }

  // Unit u's summed gradients reduce-scattered; this worker's slices of
  // them kept, the unit's buffer let go.
  void Scatter(int u) {
    float* g = grads_.bases[u];
    if (g == nullptr) return;
    const int64_t ub = units_[u], ue = units_[u + 1];
    exchange_->ReduceGradients(g - ub, ub, ue, stream_);
    exchange_->AwaitGradients(stream_);
    for (size_t i = 0; i < owned_.size(); ++i) {
      const int64_t lo = std::max(ub, owned_[i].begin), hi = std::min(ue, owned_[i].end);
      if (lo >= hi) continue;
      HERD_CUDA_CHECK(cudaMemcpyAsync(slice_grads_ + packed_[i] + (lo - owned_[i].begin), g + (lo - ub),
                                      (hi - lo) * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    }
    HERD_CUDA_CHECK(cudaFreeAsync(g, stream_));
    grads_.bases[u] = nullptr;
  }

  // What Evaluated<GatheredTrainer> reads.
  friend class Evaluated<GatheredTrainer<T>>;
  double EvaluateForward(const int32_t* tokens, const int32_t* targets, int B, int T_) {
    const double loss = Forward(tokens, targets, B, T_);
    for (int u = 0; u < num_units(); ++u) LetGo(u);
    return loss;
  }
  // The buffers made with the trainer, and the units' pool at its fullest.
  int64_t PeakBytes() const {
    uint64_t high = 0;
    HERD_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &high));
    return allocated_ + static_cast<int64_t>(high);
  }

  const Options o_;
  const std::string name_;
  const ParamLayout layout_;
  const int64_t P_;
  const std::vector<int64_t> units_;  // ParamLayout::UnitBoundaries
  const bool tied_;
  const std::vector<ParamRange> owned_;
  const int64_t owned_size_;
  Evaluated<GatheredTrainer<T>> evaluator_;
  DeviceExchange* exchange_ = nullptr;
  // The stream and the pool outlive the model and the units' buffers.
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  std::unique_ptr<CudaLlamaModel<T>> model_;
  UnitTable<T> weights_;     // the gathered units
  UnitTable<float> grads_;   // the units' gradients, until scattered
  float* master_ = nullptr;  // the owned slices', packed
  float* slice_grads_ = nullptr;
  float *m_ = nullptr, *v_ = nullptr;
  std::vector<int64_t> packed_;  // each owned range's packed offset
  DeviceSquares squares_;
  std::vector<Run> runs_;
  int64_t allocated_ = 0;  // by the constructor
};

// A trainer, told the device memory its making took.
template <typename Trainer>
std::unique_ptr<DeviceTrainer> Made(const DeviceTrainer::Options& o, const std::string& name) {
  const int64_t before = UsedDeviceBytes();
  auto trainer = std::make_unique<Trainer>(o, name);
  trainer->set_allocated(UsedDeviceBytes() - before);
  return trainer;
}

}  // namespace

StatusOr<std::unique_ptr<DeviceTrainer>> DeviceTrainer::Create(const Options& o) {
  HERD_ASSIGN_OR_RETURN(
      const std::string name,
      PrepareDevice(o.shape, o.device, o.bf16,
                    o.gathered ? GatheredTrainerDeviceBytes(o.shape, o.batch, o.seq_len, o.bf16, o.recompute,
                                                            o.accumulates, SizeOf(o.owned))
                               : DeviceTrainerDeviceBytes(o.shape, o.batch, o.seq_len, o.bf16, o.recompute,
                                                          o.owned.empty() ? -1 : SizeOf(o.owned))));
  if (o.gathered) {
    if (o.bf16) return Made<GatheredTrainer<__nv_bfloat16>>(o, name);
    return Made<GatheredTrainer<float>>(o, name);
  }
  if (o.bf16) return Made<ResidentTrainer<__nv_bfloat16>>(o, name);
  return Made<ResidentTrainer<float>>(o, name);
}

}  // namespace herd::cuda
