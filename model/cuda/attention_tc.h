// The tensor-core (bf16, warp-matrix) flash attention of attention_tc.cu,
// which kernels.h's AttentionForward/AttentionBackward use in bf16 mode
// for the head dimensions it supports. Same tensors and contracts as
// there; `delta` is sum(dout * out) per row, computed by the caller.
#pragma once

#include <cstdint>

#include "model/cuda/device_compat.h"

namespace herd::cuda {

bool TensorCoreAttentionSupports(int64_t head_dim);
void TensorCoreAttentionForward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                const __nv_bfloat16* v, int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t head_dim,
                                cudaStream_t stream);
void TensorCoreAttentionBackward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, const __nv_bfloat16* dout,
                                 const float* lse, const float* delta, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                 const __nv_bfloat16* v, int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t head_dim,
                                 cudaStream_t stream);

}  // namespace herd::cuda
