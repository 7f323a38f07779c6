// The warp-level tensor-core instructions the bf16 kernels are written in
// (PTX mma.sync m16n8k16, ldmatrix, cp.async), with register fragments whose
// element layout is PTX's (the "Matrix Fragments for mma.m16n8k16" tables):
// for lane l, g = l / 4 and t = l % 4,
//   A [16 x 16] row-major, 4 registers of 2 bf16:
//     a[0] = (g, 2t..2t+1)  a[1] = (g+8, 2t..)  a[2] = (g, 2t+8..)  a[3] = (g+8, 2t+8..)
//   B [16 x 8] (k x n), 2 registers: b0 = (k 2t..2t+1, n g)  b1 = (k 2t+8.., n g)
//   C [16 x 8] fp32, 4 floats: (g, 2t) (g, 2t+1) (g+8, 2t) (g+8, 2t+1)
// so a C fragment's rows are the same as an A fragment's (a score tile
// becomes the next product's left operand without leaving registers).
//
// On the emulated device the same functions exchange the warp's registers
// through a mailbox and compute each lane's part by those tables, so the
// kernels' indexing is checked against the real layouts everywhere.
#pragma once

#include <cstdint>
#include <cstring>

#include "model/cuda/device_compat.h"
#if defined(HERD_CUDA_EMULATION)
#include "common/bf16.h"
#endif

namespace herd::cuda {

// Two floats rounded to bf16, low element first (the register's order).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat16 l = __float2bfloat16(lo), h = __float2bfloat16(hi);
  uint16_t lb, hb;
  memcpy(&lb, &l, 2);
  memcpy(&hb, &h, 2);
  return static_cast<uint32_t>(lb) | (static_cast<uint32_t>(hb) << 16);
}

// A [rows x HD] bf16 tile in shared memory with each row's 16-byte chunks
// permuted (chunk c of row r at c ^ (r % 8)), so the eight row addresses of
// an ldmatrix fall in eight different bank groups.
template <int HD>
__device__ __forceinline__ int Swizzled(int row, int col) {
  static_assert(HD % 64 == 0, "rows of whole 128-byte lines");
  return row * HD + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

#if !defined(HERD_CUDA_EMULATION)

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// register i gets lane l's pair (row l/4, columns 2(l%4)..).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(row)));
}
// The same, each matrix transposed: register i gets (rows 2(l%4)..+1, column l/4).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(row)));
}

// d += a . b (bf16 in, fp32 accumulate).
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared without passing through registers; zeros when
// !valid (src is then not read).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#else  // the emulated device

__device__ __forceinline__ uint16_t Bf16Bits(const __nv_bfloat16* p) {
  uint16_t bits;
  memcpy(&bits, p, 2);
  return bits;
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const __nv_bfloat16* rows[32];
  ::herd_emu::WarpAllGather(&row, sizeof(row), rows);
  const int l = ::herd_emu::LaneId();
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat16* p = rows[8 * i + l / 4] + 2 * (l % 4);
    r[i] = Bf16Bits(p) | (static_cast<uint32_t>(Bf16Bits(p + 1)) << 16);
  }
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const __nv_bfloat16* rows[32];
  ::herd_emu::WarpAllGather(&row, sizeof(row), rows);
  const int l = ::herd_emu::LaneId();
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat16* lo = rows[8 * i + 2 * (l % 4)] + l / 4;
    const __nv_bfloat16* hi = rows[8 * i + 2 * (l % 4) + 1] + l / 4;
    r[i] = Bf16Bits(lo) | (static_cast<uint32_t>(Bf16Bits(hi)) << 16);
  }
}

__device__ __forceinline__ float Bf16Half(uint32_t reg, int which) {
  return ::herd::Bf16ToFloat(static_cast<uint16_t>(which == 0 ? reg : reg >> 16));
}

__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Operands {
    uint32_t a[4], b[2];
  };
  const Operands mine{{a[0], a[1], a[2], a[3]}, {b0, b1}};
  Operands all[32];
  ::herd_emu::WarpAllGather(&mine, sizeof(mine), all);
  // A (row, k) and B (k, n) by the tables at the top of this file.
  auto A = [&](int row, int k) {
    const int lane = 4 * (row % 8) + (k % 8) / 2;
    return Bf16Half(all[lane].a[(row / 8) + 2 * (k / 8)], k % 2);
  };
  auto Bm = [&](int k, int n) { return Bf16Half(all[4 * n + (k % 8) / 2].b[k / 8], k % 2); };
  const int l = ::herd_emu::LaneId(), g = l / 4, t = l % 4;
  float a_rows[2][16], b_cols[2][16];  // this lane's rows g, g + 8 and columns 2t, 2t + 1
  for (int k = 0; k < 16; ++k) {
    a_rows[0][k] = A(g, k);
    a_rows[1][k] = A(g + 8, k);
    b_cols[0][k] = Bm(k, 2 * t);
    b_cols[1][k] = Bm(k, 2 * t + 1);
  }
  for (int e = 0; e < 4; ++e) {
    float sum = d[e];
    for (int k = 0; k < 16; ++k) sum += a_rows[e / 2][k] * b_cols[e % 2][k];
    d[e] = sum;
  }
}

__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  if (valid)
    memcpy(dst, src, 16);
  else
    memset(dst, 0, 16);
}
__device__ __forceinline__ void CpAsyncCommit() {}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {}

#endif

}  // namespace herd::cuda
