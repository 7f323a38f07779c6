#include "model/cuda/llama_cuda.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "model/cpu/ops.h"
#include "model/cuda/check.h"
#include "model/cuda/device_memory.h"
#include "model/cuda/kernels.h"
#include "model/cuda/matmul.h"

namespace herd::cuda {

template <typename T>
struct CudaLlamaModel<T>::Buffers {
  std::vector<void*> owned;
  template <typename U>
  U* Alloc(int64_t n) {
    void* p = nullptr;
    HERD_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(U)));
    owned.push_back(p);
    return static_cast<U*>(p);
  }
  ~Buffers() {
    for (void* p : owned) cudaFree(p);
  }

  Matmul matmul;
  int64_t N = 0, R = 0, d = 0, qd = 0, kvd = 0, f = 0, V = 0, lse_stride = 0;
  int32_t *tokens, *targets, *group_tokens, *group_starts, *group_positions;
  int64_t groups = 0;
  float *rope_cos, *rope_sin;
  // Context parallelism: this rank's rows' positions and RoPE rows, the
  // whole sequences' keys and values ([B, Tk, kvd]) gathered and their
  // gradients, the gathers' rank-major [C, B, Tcur, kvd] buffer; the host's
  // tables and the last batch's local rows (alive until the next batch).
  int32_t* positions;
  float *rope_local_cos, *rope_local_sin;
  T *k_all, *v_all, *dk_all, *dv_all, *kv_ranks;
  std::vector<float> host_cos, host_sin, host_local_cos, host_local_sin;
  std::vector<int32_t> host_positions, host_tokens_local, host_targets_local;
  int64_t Tk = 0;  // the keys' rows a sequence (Tcur without context parallelism)
  // Zero bubble's split backward: each layer's products' output gradients
  // ([Ll, N, width]) from the input part, for the weights' part.
  T *w_down, *w_o, *w_gate, *w_up, *w_q, *w_k, *w_v;
  // R: the rows of the residual stream and the norms (sequence
  // parallelism: the rank's, rounded up; else N).
  T* residual;                 // [L+1, R, d]: input of layer l; [L] = final
  T *ln1, *ln2, *mid;          // [L, R, d]
  float *ln1_rstd, *ln2_rstd;  // [L, R]
  T *q, *k, *v, *att;          // [L, N, qd|kvd] (q, k after RoPE)
  float* lse;                  // [L, B, H, T]
  T *gate, *up, *act;          // [L, N, f]
  T* lnf;                      // [N, d] (sequence parallelism: gathered)
  float* lnf_rstd;             // [R]
  T* whole;                    // sequence parallelism: [N, d], the gathers' and the partial sums'
  T* logits;                   // [N, V] (dlogits in place in backward)
  float *losses, *ce_lse;      // [N]
  float* vocab_stats;          // tensor-parallel: [N, 2 x ranks + 1]
  float* logits_row;           // tensor-parallel: [the whole vocabulary]
  T *dres, *dln, *datt, *dq, *dk, *dv, *dact, *dgate, *dup;
  float *rms_scratch, *attn_scratch;
  std::vector<float> host_losses;
  EmbeddingGroups host_groups;  // the last Forward's, read by its copies
  int B = 0, Tcur = 0;
  bool has_targets = false;
  bool one_layer = false;  // Recompute::kFull: every layer's intermediates in layer 0's room

  struct Layer {
    T *x, *x_out, *ln1, *q, *k, *v, *att, *mid, *ln2, *gate, *up, *act;
    float *ln1_rstd, *ln2_rstd, *lse;
  };
  Layer layer(int64_t l) {
    const int64_t i = one_layer ? 0 : l;
    return {residual + l * R * d, residual + (l + 1) * R * d,
            ln1 + i * R * d,      q + i * N * qd,
            k + i * N * kvd,      v + i * N * kvd,
            att + i * N * qd,     mid + i * R * d,
            ln2 + i * R * d,      gate + i * N * f,
            up + i * N * f,       act + i * N * f,
            ln1_rstd + i * R,     ln2_rstd + i * R,
            lse + i * lse_stride};
  }
};

template <typename T>
std::string CudaLlamaModel<T>::CheckShape(const LlamaShape& shape) {
  if (!AttentionHeadDimSupported(shape.head_dim())) {
    return "head_dim " + std::to_string(shape.head_dim()) +
           " (hidden_size / num_attention_heads) is not one the CUDA attention kernels are built for (16, 32, 64, 128)";
  }
  return "";
}

template <typename T>
CudaLlamaModel<T>::CudaLlamaModel(const LlamaShape& shape, int max_batch, int max_seq_len, cudaStream_t stream,
                                  Recompute recompute, DeviceTensorGroup group, LayerRange layers,
                                  DeviceContextGroup context, bool split_backward)
    : layout_(shape),
      tp_(std::move(group)),
      cp_(std::move(context)),
      first_layer_(layers.first),
      end_layer_(layers.end < 0 ? shape.num_layers : layers.end),
      split_backward_(split_backward),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len),
      stream_(stream),
      b_(new Buffers()) {  // value-initialized: every pointer null until allocated
  const std::string why = CheckShape(shape);
  CHECK(why.empty()) << why;
  Buffers& b = *b_;
  b.one_layer = recompute == Recompute::kFull;
  CHECK(0 <= first_layer_ && first_layer_ <= end_layer_ && end_layer_ <= shape.num_layers)
      << "CudaLlamaModel: layers [" << first_layer_ << ", " << end_layer_ << ") of " << shape.num_layers;
  const CudaActivationSizes z(shape, max_batch, max_seq_len, recompute,
                              CudaModelPart{tp_.ranks, sequence_parallel(), {first_layer_, end_layer_}, cp_.ranks,
                                            split_backward_});
  b.N = z.N;
  b.R = z.R;
  b.d = shape.hidden_size;
  b.qd = shape.q_dim();
  b.kvd = shape.kv_dim();
  b.f = shape.intermediate_size;
  b.V = shape.vocab_size;
  b.lse_stride = z.attn_scratch;
  b.tokens = b.template Alloc<int32_t>(b.N);
  b.targets = b.template Alloc<int32_t>(b.N);
  b.group_tokens = b.template Alloc<int32_t>(b.N);
  b.group_starts = b.template Alloc<int32_t>(b.N + 1);
  b.group_positions = b.template Alloc<int32_t>(b.N);
  b.rope_cos = b.template Alloc<float>(z.rope);
  b.rope_sin = b.template Alloc<float>(z.rope);
  b.residual = b.template Alloc<T>(z.residual);
  b.ln1 = b.template Alloc<T>(z.per_layer_d);
  b.ln2 = b.template Alloc<T>(z.per_layer_d);
  b.mid = b.template Alloc<T>(z.per_layer_d);
  b.ln1_rstd = b.template Alloc<float>(z.per_layer_rows);
  b.ln2_rstd = b.template Alloc<float>(z.per_layer_rows);
  b.q = b.template Alloc<T>(z.per_layer_qd);
  b.att = b.template Alloc<T>(z.per_layer_qd);
  b.k = b.template Alloc<T>(z.per_layer_kvd);
  b.v = b.template Alloc<T>(z.per_layer_kvd);
  b.lse = b.template Alloc<float>(z.lse);
  b.gate = b.template Alloc<T>(z.per_layer_f);
  b.up = b.template Alloc<T>(z.per_layer_f);
  b.act = b.template Alloc<T>(z.per_layer_f);
  b.dres = b.template Alloc<T>(b.R * b.d);
  b.dln = b.template Alloc<T>(b.N * b.d);
  b.datt = b.template Alloc<T>(b.N * b.qd);
  b.dq = b.template Alloc<T>(b.N * b.qd);
  b.dk = b.template Alloc<T>(b.N * b.kvd);
  b.dv = b.template Alloc<T>(b.N * b.kvd);
  b.dact = b.template Alloc<T>(b.N * b.f);
  b.dgate = b.template Alloc<T>(b.N * b.f);
  b.dup = b.template Alloc<T>(b.N * b.f);
  b.rms_scratch = b.template Alloc<float>(z.rms_scratch);
  b.attn_scratch = b.template Alloc<float>(z.attn_scratch);
  b.host_losses.resize(b.N);
  // The CPU's fp32 tables, so both devices rotate by the same angles.
  b.host_cos.resize(z.rope);
  b.host_sin.resize(z.rope);
  cpu::RopeTables(b.host_cos.data(), b.host_sin.data(), max_seq_len, shape.head_dim(), shape.rope_theta,
                  shape.rope_scaling);
  HERD_CUDA_CHECK(cudaMemcpy(b.rope_cos, b.host_cos.data(), z.rope * 4, cudaMemcpyHostToDevice));
  HERD_CUDA_CHECK(cudaMemcpy(b.rope_sin, b.host_sin.data(), z.rope * 4, cudaMemcpyHostToDevice));
  AllocatePartBuffers(z, recompute, max_batch, max_seq_len);
}

// The buffers of the model's part alone: the head's, sequence and tensor
// parallelism's, a split backward's, context parallelism's.
template <typename T>
void CudaLlamaModel<T>::AllocatePartBuffers(const CudaActivationSizes& z, Recompute recompute, int max_batch,
                                            int max_seq_len) {
  Buffers& b = *b_;
  if (z.head) {
    b.lnf = b.template Alloc<T>(b.N * b.d);
    b.lnf_rstd = b.template Alloc<float>(b.R);
    b.logits = b.template Alloc<T>(z.logits);
    b.losses = b.template Alloc<float>(b.N);
    b.ce_lse = b.template Alloc<float>(b.N);
  }
  if (sequence_parallel()) {
    CHECK(tp_.all_gather && tp_.reduce_scatter) << "a sequence-parallel CUDA model needs its group's gathers";
    b.whole = b.template Alloc<T>(z.whole);
  }
  if (tp_.ranks > 1 && z.head) {
    CHECK(tp_.all_reduce) << "a tensor-parallel CUDA model needs its group's sum";
    b.vocab_stats = b.template Alloc<float>(b.N * (2 * tp_.ranks + 1));  // the two of z.vocab_stats
    b.logits_row = b.template Alloc<float>(static_cast<int64_t>(b.V) * tp_.ranks);
  }
  if (split_backward_) {
    CHECK(recompute == Recompute::kNone) << "a split backward keeps every layer's activations";
    const int64_t layers = end_layer_ - first_layer_, per = layers * b.N;
    b.w_down = b.template Alloc<T>(per * b.d);
    b.w_o = b.template Alloc<T>(per * b.d);
    b.w_gate = b.template Alloc<T>(per * b.f);
    b.w_up = b.template Alloc<T>(per * b.f);
    b.w_q = b.template Alloc<T>(per * b.qd);
    b.w_k = b.template Alloc<T>(per * b.kvd);
    b.w_v = b.template Alloc<T>(per * b.kvd);  // the seven of z.split_kept
  }
  if (cp_.ranks > 1) {
    CHECK(cp_.all_gather && cp_.reduce_scatter) << "a context-parallel CUDA model needs its group's gathers";
    CHECK_EQ(max_seq_len % (2 * cp_.ranks), 0) << "context parallelism cuts each sequence into 2 x " << cp_.ranks
                                               << " chunks: " << max_seq_len;
    const int64_t kv = static_cast<int64_t>(max_batch) * max_seq_len * b.kvd;  // z.context_kv / 5
    b.positions = b.template Alloc<int32_t>(z.positions);
    b.rope_local_cos = b.template Alloc<float>(z.rope_local / 2);
    b.rope_local_sin = b.template Alloc<float>(z.rope_local / 2);
    b.k_all = b.template Alloc<T>(kv);
    b.v_all = b.template Alloc<T>(kv);
    b.dk_all = b.template Alloc<T>(kv);
    b.dv_all = b.template Alloc<T>(kv);
    b.kv_ranks = b.template Alloc<T>(kv);
  }
}

namespace {

// n device elements of T as fp32 on the host (the device idle).
template <typename T>
void ToHostFloats(const T* device, int64_t n, std::vector<float>* out) {
  std::vector<T> raw(n);
  HERD_CUDA_CHECK(cudaMemcpy(raw.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  out->resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>)
      (*out)[i] = raw[i];
    else
      (*out)[i] = __bfloat162float(raw[i]);
  }
}

}  // namespace

template <typename T>
CudaLlamaModel<T>::~CudaLlamaModel() {
  cudaStreamSynchronize(stream_);  // no kernel may outlive its buffers
}

template <typename T>
const T* CudaLlamaModel<T>::logits() const {
  return b_->logits;
}

template <typename T>
void CudaLlamaModel<T>::LogitsToHost(std::vector<float>* out) const {
  HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ToHostFloats(b_->logits, static_cast<int64_t>(b_->B) * b_->Tcur * b_->V, out);
}

template <typename T>
void CudaLlamaModel<T>::LogitsRowToHost(int64_t row, std::vector<float>* out) {
  Buffers& b = *b_;
  const int64_t V = b.V;
  CHECK(row < static_cast<int64_t>(b.B) * b.Tcur) << "CudaLlamaModel::LogitsRowToHost: row " << row;
  if (tp_.ranks == 1) {
    HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ToHostFloats(b.logits + row * V, V, out);
    return;
  }
  // This rank's columns in place, zeros elsewhere, summed over the group.
  const int64_t whole = V * tp_.ranks;
  HERD_CUDA_CHECK(cudaMemsetAsync(b.logits_row, 0, whole * sizeof(float), stream_));
  Convert(b.logits_row + tp_.vocab_first, b.logits + row * V, V, stream_);
  tp_.all_reduce(b.logits_row, whole, sizeof(float), stream_);
  out->resize(whole);
  HERD_CUDA_CHECK(cudaMemcpyAsync(out->data(), b.logits_row, whole * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  HERD_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

template <typename T>
void CudaLlamaModel<T>::AllReduce(T* data, int64_t n) {
  if (tp_.ranks > 1) tp_.all_reduce(data, n, sizeof(T), stream_);
}

template <typename T>
Partition CudaLlamaModel<T>::RowParts(int64_t N) const {
  Partition parts = EvenPartition(N, tp_.ranks);
  for (int64_t& p : parts) p *= b_->d;
  return parts;
}

template <typename T>
int64_t CudaLlamaModel<T>::FirstRow(int64_t N) const {
  if (!sequence_parallel()) return 0;
  const Partition rows = EvenPartition(N, tp_.ranks);
  int64_t first = 0;
  for (int r = 0; r < tp_.rank; ++r) first += rows[r];
  return first;
}

template <typename T>
int64_t CudaLlamaModel<T>::HeldRows(int64_t N) const {
  return sequence_parallel() ? EvenPartition(N, tp_.ranks)[tp_.rank] : N;
}

template <typename T>
const T* CudaLlamaModel<T>::Gathered(const T* mine, int64_t N) {
  if (!sequence_parallel()) return mine;
  Buffers& b = *b_;
  T* at = b.whole + FirstRow(N) * b.d;
  if (mine != at) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(at, mine, HeldRows(N) * b.d * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
  }
  tp_.all_gather(b.whole, RowParts(N), sizeof(T), stream_);
  return b.whole;
}

template <typename T>
T* CudaLlamaModel<T>::Summed(T* part, int64_t N) {
  if (!sequence_parallel()) {
    AllReduce(part, N * b_->d);
    return part;
  }
  tp_.reduce_scatter(part, RowParts(N), sizeof(T), stream_);
  return part + FirstRow(N) * b_->d;
}

template <typename T>
void CudaLlamaModel<T>::ReorderKeyRows(T* rank_major, T* by_position, bool gather) {
  Buffers& b = *b_;
  const int C = cp_.ranks;
  const int64_t B = b.B, Tl = b.Tcur, chunk = Tl / 2, kvd = b.kvd;
  for (int r = 0; r < C; ++r) {
    for (int64_t bb = 0; bb < B; ++bb) {
      for (int64_t h = 0; h < 2; ++h) {
        T* ranks = rank_major + ((r * B + bb) * Tl + h * chunk) * kvd;
        T* positions = by_position + (bb * b.Tk + ContextPosition(r, C, chunk, h * chunk)) * kvd;
        HERD_CUDA_CHECK(cudaMemcpyAsync(gather ? positions : ranks, gather ? ranks : positions,
                                        chunk * kvd * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
      }
    }
  }
}

template <typename T>
void CudaLlamaModel<T>::GatherKeysValues(const T* k, const T* v) {
  Buffers& b = *b_;
  const int64_t part = static_cast<int64_t>(b.B) * b.Tcur * b.kvd;
  const Partition parts(cp_.ranks, part);
  for (auto [mine, all] : {std::pair<const T*, T*>{k, b.k_all}, std::pair<const T*, T*>{v, b.v_all}}) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.kv_ranks + cp_.rank * part, mine, part * sizeof(T), cudaMemcpyDeviceToDevice,
                                    stream_));
    cp_.all_gather(b.kv_ranks, parts, sizeof(T), stream_);
    ReorderKeyRows(b.kv_ranks, all, /*gather=*/true);
  }
}

template <typename T>
void CudaLlamaModel<T>::ScatterKeyValueGrads(T* dk, T* dv) {
  Buffers& b = *b_;
  const int64_t part = static_cast<int64_t>(b.B) * b.Tcur * b.kvd;
  const Partition parts(cp_.ranks, part);
  for (auto [all, mine] : {std::pair<T*, T*>{b.dk_all, dk}, std::pair<T*, T*>{b.dv_all, dv}}) {
    ReorderKeyRows(b.kv_ranks, all, /*gather=*/false);
    cp_.reduce_scatter(b.kv_ranks, parts, sizeof(T), stream_);
    HERD_CUDA_CHECK(cudaMemcpyAsync(mine, b.kv_ranks + cp_.rank * part, part * sizeof(T), cudaMemcpyDeviceToDevice,
                                    stream_));
  }
}

template <typename T>
void CudaLlamaModel<T>::TakeBatch(const int32_t* host_tokens, const int32_t* host_targets, int B, int T_) {
  Buffers& b = *b_;
  CHECK(B <= max_batch_ && T_ <= max_seq_len_)
      << "CudaLlamaModel: " << B << "x" << T_ << " exceeds " << max_batch_ << "x" << max_seq_len_;
  cudaStream_t st = stream_;
  b.B = B;
  b.Tcur = T_;
  b.Tk = T_;
  b.has_targets = host_targets != nullptr;
  if (cp_.ranks > 1) {
    // This rank's chunks of every sequence, and RoPE's rows at their positions.
    CHECK_EQ(T_ % (2 * cp_.ranks), 0) << "context parallelism cuts each sequence into 2 x " << cp_.ranks
                                      << " chunks: " << T_;
    const int64_t chunk = T_ / (2 * cp_.ranks), Tl = 2 * chunk, half = layout_.shape().head_dim() / 2;
    b.Tcur = static_cast<int>(Tl);
    b.host_positions.resize(Tl);
    b.host_local_cos.resize(Tl * half);
    b.host_local_sin.resize(Tl * half);
    for (int64_t t = 0; t < Tl; ++t) {
      const int64_t p = ContextPosition(cp_.rank, cp_.ranks, chunk, t);
      b.host_positions[t] = static_cast<int32_t>(p);
      std::copy(b.host_cos.begin() + p * half, b.host_cos.begin() + (p + 1) * half, b.host_local_cos.begin() + t * half);
      std::copy(b.host_sin.begin() + p * half, b.host_sin.begin() + (p + 1) * half, b.host_local_sin.begin() + t * half);
    }
    auto local = [&](const int32_t* whole, std::vector<int32_t>& into) -> const int32_t* {
      if (whole == nullptr) return nullptr;
      into.resize(static_cast<size_t>(B) * Tl);
      for (int64_t bb = 0; bb < B; ++bb) {
        for (int64_t t = 0; t < Tl; ++t) into[bb * Tl + t] = whole[bb * T_ + b.host_positions[t]];
      }
      return into.data();
    };
    host_tokens = local(host_tokens, b.host_tokens_local);
    host_targets = local(host_targets, b.host_targets_local);
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.positions, b.host_positions.data(), Tl * 4, cudaMemcpyHostToDevice, st));
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.rope_local_cos, b.host_local_cos.data(), Tl * half * 4, cudaMemcpyHostToDevice, st));
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.rope_local_sin, b.host_local_sin.data(), Tl * half * 4, cudaMemcpyHostToDevice, st));
  }
  const int64_t N = static_cast<int64_t>(B) * b.Tcur;
  if (embeds() && host_tokens != nullptr) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.tokens, host_tokens, N * 4, cudaMemcpyHostToDevice, st));
  }
  if (has_head() && host_targets != nullptr) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.targets, host_targets, N * 4, cudaMemcpyHostToDevice, st));
  }
  if (embeds() && host_tokens != nullptr && host_targets != nullptr) {
    // The embedding backward's grouping, made now while the host is free.
    // Kept in the model until the next pass, which starts only after this
    // one's copies were waited for (its losses, or its stage's output).
    b.host_groups = tp_.ranks > 1 ? EmbeddingGroups::Build(host_tokens, N, tp_.vocab_first, b.V)
                                  : EmbeddingGroups::Build(host_tokens, N);
    const EmbeddingGroups& g = b.host_groups;
    b.groups = static_cast<int64_t>(g.tokens.size());
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.group_tokens, g.tokens.data(), b.groups * 4, cudaMemcpyHostToDevice, st));
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.group_starts, g.starts.data(), (b.groups + 1) * 4, cudaMemcpyHostToDevice, st));
    HERD_CUDA_CHECK(
        cudaMemcpyAsync(b.group_positions, g.positions.data(), g.positions.size() * 4, cudaMemcpyHostToDevice, st));
  }
}

template <typename T>
int64_t CudaLlamaModel<T>::LayerEnd(int l) const {
  return l + 1 < layout_.shape().num_layers ? layout_.layer(l + 1).input_norm : layout_.final_norm();
}

template <typename T>
void CudaLlamaModel<T>::EmbedForward(UnitSpace<const T> params) {
  Buffers& b = *b_;
  const int64_t N = static_cast<int64_t>(b.B) * b.Tcur, d = b.d;
  cudaStream_t st = stream_;
  if (tp_.ranks > 1) {
    // Each rank's rows of the vocabulary, the others' summed in.
    T* lookup = sequence_parallel() ? b.whole : b.residual;
    EmbeddingForward(lookup, b.tokens, params + layout_.embed(), N, d, st, tp_.vocab_first, b.V);
    const T* mine = Summed(lookup, N);
    if (mine != b.residual) {
      HERD_CUDA_CHECK(cudaMemcpyAsync(b.residual, mine, HeldRows(N) * d * sizeof(T), cudaMemcpyDeviceToDevice, st));
    }
  } else {
    EmbeddingForward(b.residual, b.tokens, params + layout_.embed(), N, d, st);
  }
}

template <typename T>
double CudaLlamaModel<T>::HeadForward(UnitSpace<const T> params) {
  Buffers& b = *b_;
  const int64_t N = static_cast<int64_t>(b.B) * b.Tcur, d = b.d;
  const float eps = static_cast<float>(layout_.shape().rms_norm_eps);
  cudaStream_t st = stream_;
  const T* x_final = b.residual + (end_layer_ - first_layer_) * b.R * d;
  // The final norm of this rank's rows, where the gather puts them.
  RmsNormForward(b.lnf + FirstRow(N) * d, b.lnf_rstd, x_final, params + layout_.final_norm(), HeldRows(N), d, eps, st);
  if (sequence_parallel()) tp_.all_gather(b.lnf, RowParts(N), sizeof(T), st);
  b.matmul.Forward(b.logits, b.lnf, params + layout_.lm_head(), N, d, b.V, static_cast<const T*>(nullptr), st);
  HERD_CUDA_CHECK_LAUNCH();
  if (!b.has_targets) return 0.0;
  if (tp_.ranks > 1) {
    VocabParallelStats(b.vocab_stats, b.logits, b.targets, N, b.V, tp_.vocab_first, tp_.rank, tp_.ranks, st);
    tp_.all_reduce(b.vocab_stats, N * (2 * tp_.ranks + 1), sizeof(float), st);
    VocabParallelLoss(b.losses, b.ce_lse, b.vocab_stats, N, tp_.ranks, st);
  } else {
    CrossEntropyForward(b.losses, b.ce_lse, b.logits, b.targets, N, b.V, st);
  }
  HERD_CUDA_CHECK(cudaMemcpyAsync(b.host_losses.data(), b.losses, N * 4, cudaMemcpyDeviceToHost, st));
  HERD_CUDA_CHECK(cudaStreamSynchronize(st));
  double total = 0;  // in order, as the CPU model sums
  for (int64_t i = 0; i < N; ++i) total += b.host_losses[i];
  return N > 0 ? total / static_cast<double>(N) : 0.0;
}

template <typename T>
double CudaLlamaModel<T>::Forward(UnitSpace<const T> params, const int32_t* host_tokens, const int32_t* host_targets, int B,
                                  int T_, const NeedUpTo& need) {
  CHECK(embeds() && has_head()) << "CudaLlamaModel::Forward on a model of part of the layers: use StageForward";
  TakeBatch(host_tokens, host_targets, B, T_);
  const LlamaShape& s = layout_.shape();
  if (need) need(s.num_layers > 0 ? layout_.layer(0).input_norm : layout_.final_norm());
  EmbedForward(params);
  for (int l = 0; l < s.num_layers; ++l) {
    if (need) need(LayerEnd(l));
    LayerForward(params, l, /*to_output=*/true);
  }
  if (need) need(layout_.size());
  return HeadForward(params);
}

template <typename T>
double CudaLlamaModel<T>::StageForward(UnitSpace<const T> params, const int32_t* host_tokens,
                                       const int32_t* host_targets, const T* input, int B, int T_,
                                       UnitSpace<float>* grads, double loss_scale, const NeedUpTo& need) {
  TakeBatch(host_tokens, host_targets, B, T_);
  Buffers& b = *b_;
  const int64_t N = static_cast<int64_t>(B) * T_;
  if (embeds()) {
    if (need) need(first_layer_ < end_layer_ ? layout_.layer(first_layer_).input_norm : layout_.final_norm());
    EmbedForward(params);
  } else if (input != b.residual) {
    HERD_CUDA_CHECK(
        cudaMemcpyAsync(b.residual, input, StageElements(B, T_) * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
  }
  (void)N;
  for (int l = first_layer_; l < end_layer_; ++l) {
    if (need) need(LayerEnd(l));
    LayerForward(params, l, /*to_output=*/true);
  }
  if (!has_head()) return 0.0;
  if (need) need(layout_.size());
  const double loss = HeadForward(params);
  if (grads != nullptr && b.has_targets) HeadBackward(params, *grads, loss_scale);
  return loss;
}

template <typename T>
int64_t CudaLlamaModel<T>::StageElements(int B, int T_) const {
  return HeldRows(static_cast<int64_t>(B) * T_) * b_->d;
}

template <typename T>
T* CudaLlamaModel<T>::StageInput() {
  return b_->residual;
}

template <typename T>
const T* CudaLlamaModel<T>::StageOutput() const {
  return b_->residual + (end_layer_ - first_layer_) * b_->R * b_->d;
}

template <typename T>
T* CudaLlamaModel<T>::StageOutputGrad() {
  return b_->dres;
}

template <typename T>
const T* CudaLlamaModel<T>::StageInputGrad() const {
  return b_->dres;
}

template <typename T>
void CudaLlamaModel<T>::LayerForward(UnitSpace<const T> params, int l, bool to_output) {
  Buffers& b = *b_;
  const LlamaShape& s = layout_.shape();
  const int B = b.B, T_ = b.Tcur;
  const int64_t N = static_cast<int64_t>(B) * T_, d = b.d, qd = b.qd, kvd = b.kvd, f = b.f;
  const int64_t hd = s.head_dim(), H = s.num_heads, KV = s.num_kv_heads;
  const float eps = static_cast<float>(s.rms_norm_eps);
  cudaStream_t st = stream_;
  const LayerOffsets& w = layout_.layer(l);
  const auto a = b.layer(l - first_layer_);
  // Tensor-parallel: o_proj's and down_proj's outputs are each rank's
  // heads' and columns' parts, summed over the group (Summed); with
  // sequence parallelism the norms and residual adds run on this rank's
  // n of the N rows, gathered whole for the products that read them.
  const int64_t n = HeldRows(N);
  RmsNormForward(a.ln1, a.ln1_rstd, a.x, params + w.input_norm, n, d, eps, st);
  const T* ln1_all = Gathered(a.ln1, N);
  b.matmul.Forward(a.q, ln1_all, params + w.q_proj, N, d, qd, static_cast<const T*>(nullptr), st);
  b.matmul.Forward(a.k, ln1_all, params + w.k_proj, N, d, kvd, static_cast<const T*>(nullptr), st);
  b.matmul.Forward(a.v, ln1_all, params + w.v_proj, N, d, kvd, static_cast<const T*>(nullptr), st);
  const bool cp = cp_.ranks > 1;
  const float* cos = cp ? b.rope_local_cos : b.rope_cos;
  const float* sin = cp ? b.rope_local_sin : b.rope_sin;
  RopeForward(a.q, cos, sin, B, T_, H, hd, st);
  RopeForward(a.k, cos, sin, B, T_, KV, hd, st);
  if (cp) {
    // This rank's queries against every rank's keys and values.
    GatherKeysValues(a.k, a.v);
    AttentionForward(a.att, a.lse, a.q, b.k_all, b.v_all, B, T_, H, KV, hd, st, b.Tk, b.positions);
  } else {
    AttentionForward(a.att, a.lse, a.q, a.k, a.v, B, T_, H, KV, hd, st);
  }
  if (tp_.ranks > 1) {
    // Each rank's heads' part of o_proj, summed, then the residual.
    T* o_out = sequence_parallel() ? b.whole : a.mid;
    b.matmul.Forward(o_out, a.att, params + w.o_proj, N, qd, d, static_cast<const T*>(nullptr), st);
    AddForward(a.mid, Summed(o_out, N), a.x, n * d, st);
  } else {
    b.matmul.Forward(a.mid, a.att, params + w.o_proj, N, qd, d, static_cast<const T*>(a.x), st);  // + residual
  }
  RmsNormForward(a.ln2, a.ln2_rstd, a.mid, params + w.post_norm, n, d, eps, st);
  const T* ln2_all = Gathered(a.ln2, N);
  b.matmul.Forward(a.gate, ln2_all, params + w.gate_proj, N, d, f, static_cast<const T*>(nullptr), st);
  b.matmul.Forward(a.up, ln2_all, params + w.up_proj, N, d, f, static_cast<const T*>(nullptr), st);
  SwigluForward(a.act, a.gate, a.up, N * f, st);
  if (!to_output) return;
  if (tp_.ranks > 1) {
    T* down_out = sequence_parallel() ? b.whole : a.x_out;
    b.matmul.Forward(down_out, a.act, params + w.down_proj, N, f, d, static_cast<const T*>(nullptr), st);
    AddForward(a.x_out, Summed(down_out, N), a.mid, n * d, st);
  } else {
    b.matmul.Forward(a.x_out, a.act, params + w.down_proj, N, f, d, static_cast<const T*>(a.mid), st);
  }
}

template <typename T>
void CudaLlamaModel<T>::HeadBackward(UnitSpace<const T> params, UnitSpace<float> grads, double loss_scale) {
  Buffers& b = *b_;
  CHECK(b.has_targets) << "CudaLlamaModel: a backward needs a forward with targets first";
  const int64_t N = static_cast<int64_t>(b.B) * b.Tcur, d = b.d;
  cudaStream_t st = stream_;
  Matmul& mm = b.matmul;
  // Loss -> logits (in place) -> lm_head -> final norm.
  CrossEntropyBackward(b.logits, b.ce_lse, b.targets, N, b.V, static_cast<float>(loss_scale), st, tp_.vocab_first);
  mm.BackwardInput(b.dln, b.logits, params + layout_.lm_head(), N, d, b.V, false, st);
  mm.BackwardWeight(grads + layout_.lm_head(), b.logits, b.lnf, N, d, b.V, st);
  const T* dln_mine = Summed(b.dln, N);  // tensor-parallel: each rank's vocabulary's part
  const int64_t n = HeldRows(N);
  HERD_CUDA_CHECK(cudaMemsetAsync(b.dres, 0, n * d * sizeof(T), st));
  const T* x_final = b.residual + (end_layer_ - first_layer_) * b.R * d;
  RmsNormBackward(b.dres, grads + layout_.final_norm(), dln_mine, x_final, params + layout_.final_norm(), b.lnf_rstd,
                  n, d, b.rms_scratch, st);
}

template <typename T>
void CudaLlamaModel<T>::LayerBackward(UnitSpace<const T> params, UnitSpace<float> grads, int l, bool split) {
  Buffers& b = *b_;
  const LlamaShape& s = layout_.shape();
  const int B = b.B, T_ = b.Tcur;
  const int64_t N = static_cast<int64_t>(B) * T_, d = b.d, qd = b.qd, kvd = b.kvd, f = b.f, n = HeldRows(N);
  const int64_t hd = s.head_dim(), H = s.num_heads, KV = s.num_kv_heads;
  cudaStream_t st = stream_;
  Matmul& mm = b.matmul;
  const LayerOffsets& w = layout_.layer(l);
  const auto a = b.layer(l - first_layer_);
  if (b.one_layer) LayerForward(params, l, /*to_output=*/false);  // Recompute::kFull
  // A product's weight gradient now, or (split) its output gradient kept.
  const int64_t kept_at = (l - first_layer_) * N;
  auto weight = [&](float* dw, const T* dout, const T* in, int64_t in_dim, int64_t out_dim, T* kept) {
    if (!split) return mm.BackwardWeight(dw, dout, in, N, in_dim, out_dim, st);
    HERD_CUDA_CHECK(cudaMemcpyAsync(kept + kept_at * out_dim, dout, N * out_dim * sizeof(T), cudaMemcpyDeviceToDevice,
                                    st));
  };
  // MLP branch: dres is d(layer output) = d(mid) through the skip.
  // Sequence parallelism: dres holds this rank's n rows, gathered whole
  // for the row-parallel product's backward; the norms' outputs are
  // gathered again for the products' weight gradients, and the input
  // gradients' partial sums reduce-scattered.
  const T* dres_all = Gathered(b.dres, N);
  mm.BackwardInput(b.dact, dres_all, params + w.down_proj, N, f, d, false, st);
  weight(grads + w.down_proj, dres_all, a.act, f, d, b.w_down);
  SwigluBackward(b.dgate, b.dup, b.dact, a.gate, a.up, N * f, st);
  const T* ln2_all = split ? nullptr : Gathered(a.ln2, N);
  mm.BackwardInput(b.dln, b.dgate, params + w.gate_proj, N, d, f, false, st);
  weight(grads + w.gate_proj, b.dgate, ln2_all, d, f, b.w_gate);
  mm.BackwardInput(b.dln, b.dup, params + w.up_proj, N, d, f, true, st);
  weight(grads + w.up_proj, b.dup, ln2_all, d, f, b.w_up);
  const T* dln_mine = Summed(b.dln, N);  // tensor-parallel: each rank's columns' part
  RmsNormBackward(b.dres, grads + w.post_norm, dln_mine, a.mid, params + w.post_norm, a.ln2_rstd, n, d, b.rms_scratch,
                  st);

  // Attention branch: dres is now d(mid) = d(layer input) through the skip.
  const T* dmid_all = Gathered(b.dres, N);
  mm.BackwardInput(b.datt, dmid_all, params + w.o_proj, N, qd, d, false, st);
  weight(grads + w.o_proj, dmid_all, a.att, qd, d, b.w_o);
  const bool cp = cp_.ranks > 1;
  if (cp) {
    // The keys and values gathered again (FULL recomputation has just done
    // it), their gradients' sums reduce-scattered back to their ranks.
    if (!b.one_layer) GatherKeysValues(a.k, a.v);
    AttentionBackward(b.dq, b.dk_all, b.dv_all, b.datt, a.att, a.lse, a.q, b.k_all, b.v_all, B, T_, H, KV, hd,
                      b.attn_scratch, st, b.Tk, b.positions);
    ScatterKeyValueGrads(b.dk, b.dv);
  } else {
    AttentionBackward(b.dq, b.dk, b.dv, b.datt, a.att, a.lse, a.q, a.k, a.v, B, T_, H, KV, hd, b.attn_scratch, st);
  }
  const float* cos = cp ? b.rope_local_cos : b.rope_cos;
  const float* sin = cp ? b.rope_local_sin : b.rope_sin;
  RopeBackward(b.dq, cos, sin, B, T_, H, hd, st);
  RopeBackward(b.dk, cos, sin, B, T_, KV, hd, st);
  const T* ln1_all = split ? nullptr : Gathered(a.ln1, N);
  mm.BackwardInput(b.dln, b.dq, params + w.q_proj, N, d, qd, false, st);
  weight(grads + w.q_proj, b.dq, ln1_all, d, qd, b.w_q);
  mm.BackwardInput(b.dln, b.dk, params + w.k_proj, N, d, kvd, true, st);
  weight(grads + w.k_proj, b.dk, ln1_all, d, kvd, b.w_k);
  mm.BackwardInput(b.dln, b.dv, params + w.v_proj, N, d, kvd, true, st);
  weight(grads + w.v_proj, b.dv, ln1_all, d, kvd, b.w_v);
  const T* dln_in = Summed(b.dln, N);  // tensor-parallel: each rank's heads' part
  RmsNormBackward(b.dres, grads + w.input_norm, dln_in, a.x, params + w.input_norm, a.ln1_rstd, n, d, b.rms_scratch,
                  st);
}

template <typename T>
void CudaLlamaModel<T>::LayerBackwardWeights(UnitSpace<float> grads, int l) {
  Buffers& b = *b_;
  const int64_t N = static_cast<int64_t>(b.B) * b.Tcur, d = b.d, qd = b.qd, kvd = b.kvd, f = b.f;
  cudaStream_t st = stream_;
  Matmul& mm = b.matmul;
  const LayerOffsets& w = layout_.layer(l);
  const auto a = b.layer(l - first_layer_);
  // The weights are not read: the input part used them. Sequence
  // parallelism: the norms' outputs (kept as this rank's rows) gathered
  // again as the products' inputs.
  const int64_t i = (l - first_layer_) * N;
  mm.BackwardWeight(grads + w.down_proj, b.w_down + i * d, a.act, N, f, d, st);
  const T* ln2_all = Gathered(a.ln2, N);
  mm.BackwardWeight(grads + w.gate_proj, b.w_gate + i * f, ln2_all, N, d, f, st);
  mm.BackwardWeight(grads + w.up_proj, b.w_up + i * f, ln2_all, N, d, f, st);
  mm.BackwardWeight(grads + w.o_proj, b.w_o + i * d, a.att, N, qd, d, st);
  const T* ln1_all = Gathered(a.ln1, N);
  mm.BackwardWeight(grads + w.q_proj, b.w_q + i * qd, ln1_all, N, d, qd, st);
  mm.BackwardWeight(grads + w.k_proj, b.w_k + i * kvd, ln1_all, N, d, kvd, st);
  mm.BackwardWeight(grads + w.v_proj, b.w_v + i * kvd, ln1_all, N, d, kvd, st);
}

template <typename T>
void CudaLlamaModel<T>::StageBackwardInput(UnitSpace<const T> params, UnitSpace<float> grads, const T* output_grad) {
  Buffers& b = *b_;
  CHECK(split_backward_) << "StageBackwardInput on a model made without split_backward";
  CHECK(b.has_targets) << "CudaLlamaModel: a backward needs a forward with targets first";
  if (!has_head() && output_grad != b.dres) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.dres, output_grad, StageElements(b.B, b.Tcur) * sizeof(T),
                                    cudaMemcpyDeviceToDevice, stream_));
  }
  for (int l = end_layer_ - 1; l >= first_layer_; --l) LayerBackward(params, grads, l, /*split=*/true);
  if (embeds()) EmbedBackward(grads);
  HERD_CUDA_CHECK_LAUNCH();
}

template <typename T>
void CudaLlamaModel<T>::StageBackwardWeights(UnitSpace<float> grads) {
  CHECK(split_backward_) << "StageBackwardWeights on a model made without split_backward";
  for (int l = end_layer_ - 1; l >= first_layer_; --l) LayerBackwardWeights(grads, l);
  HERD_CUDA_CHECK_LAUNCH();
}

template <typename T>
void CudaLlamaModel<T>::EmbedBackward(UnitSpace<float> grads) {
  Buffers& b = *b_;
  const int64_t N = static_cast<int64_t>(b.B) * b.Tcur;
  EmbeddingBackward(grads + layout_.embed(), Gathered(b.dres, N), b.group_tokens, b.group_starts, b.group_positions,
                    b.groups, b.d, stream_);
  HERD_CUDA_CHECK_LAUNCH();
}

template <typename T>
void CudaLlamaModel<T>::Backward(UnitSpace<const T> params, UnitSpace<float> grads, double loss_scale,
                                 const FinalFrom& final_from, const NeedFrom& need_from) {
  CHECK(embeds() && has_head()) << "CudaLlamaModel::Backward on a model of part of the layers: use StageBackward";
  if (need_from) need_from(layout_.final_norm());
  HeadBackward(params, grads, loss_scale);
  if (final_from) final_from(layout_.final_norm());  // lm_head (untied) follows the final norm
  for (int l = layout_.shape().num_layers - 1; l >= 0; --l) {
    if (need_from) need_from(layout_.layer(l).input_norm);
    LayerBackward(params, grads, l);
    if (final_from) final_from(layout_.layer(l).input_norm);  // the layer's first tensor
  }
  EmbedBackward(grads);
  if (final_from) final_from(0);
}

template <typename T>
void CudaLlamaModel<T>::StageBackward(UnitSpace<const T> params, UnitSpace<float> grads, const T* output_grad,
                                      const FinalFrom& final_from, const NeedFrom& need_from) {
  Buffers& b = *b_;
  CHECK(b.has_targets) << "CudaLlamaModel: a backward needs a forward with targets first";
  if (has_head()) {
    if (final_from) final_from(layout_.final_norm());  // the head's, from its forward
  } else if (output_grad != b.dres) {
    const int64_t n = StageElements(b.B, b.Tcur);
    HERD_CUDA_CHECK(cudaMemcpyAsync(b.dres, output_grad, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
  }
  for (int l = end_layer_ - 1; l >= first_layer_; --l) {
    if (need_from) need_from(layout_.layer(l).input_norm);
    LayerBackward(params, grads, l);
    if (final_from) final_from(layout_.layer(l).input_norm);
  }
  if (embeds()) {
    EmbedBackward(grads);
    if (final_from) final_from(0);
  }
  HERD_CUDA_CHECK_LAUNCH();
}

template class CudaLlamaModel<float>;
template class CudaLlamaModel<__nv_bfloat16>;

}  // namespace herd::cuda
