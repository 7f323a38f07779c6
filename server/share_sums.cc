#include "server/share_sums.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "common/bf16.h"
#include "common/cpu_dispatch.h"
#include "model/optim/adamw.h"

namespace herd {
namespace {

// The five ways a contribution enters the sum, each one loop the compiler
// vectorises per clone.
HERD_CPU_CLONES void Copy(float* __restrict sum, const float* __restrict in, int64_t n) {
  std::memcpy(sum, in, n * sizeof(float));
}
HERD_CPU_CLONES void Widen(float* __restrict sum, const uint16_t* __restrict in, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) sum[i] = Bf16ToFloat(in[i]);
}
HERD_CPU_CLONES void Add(float* __restrict sum, const float* __restrict in, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) sum[i] += in[i];
}
HERD_CPU_CLONES void AddBf16(float* __restrict sum, const uint16_t* __restrict in, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) sum[i] += Bf16ToFloat(in[i]);
}
HERD_CPU_CLONES void WidenAdd(float* __restrict sum, const uint16_t* __restrict first, const uint16_t* __restrict in,
                              int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) sum[i] = Bf16ToFloat(first[i]) + Bf16ToFloat(in[i]);
}

// Elements [lo, hi) of the sum.
void AddPart(float* sum, const ShareInput& in, int64_t lo, int64_t hi) {
  const int64_t n = hi - lo;
  if (n <= 0) return;
  if (in.bf16) {
    const uint16_t* g = static_cast<const uint16_t*>(in.data) + lo;
    if (in.first) return Widen(sum + lo, g, n);
    if (in.first_bf16 != nullptr) return WidenAdd(sum + lo, in.first_bf16 + lo, g, n);
    return AddBf16(sum + lo, g, n);
  }
  const float* g = static_cast<const float*>(in.data) + lo;
  if (in.first) return Copy(sum + lo, g, n);
  Add(sum + lo, g, n);
}

// A piece of the pass: [lo, hi) of the sum, and whether it is a chunk of
// counted range `range` (whose squares it sums) or lies outside them.
struct Piece {
  int64_t lo, hi;
  int range;  // -1: uncounted
};

std::vector<Piece> Pieces(int64_t n, const std::vector<ParamRange>* counted) {
  constexpr int64_t kChunk = kSumOfSquaresChunk;
  std::vector<Piece> pieces;
  auto gap = [&](int64_t lo, int64_t hi) {
    for (int64_t a = lo; a < hi; a += 4 * kChunk) pieces.push_back({a, std::min(hi, a + 4 * kChunk), -1});
  };
  int64_t cursor = 0;
  if (counted != nullptr) {
    for (size_t r = 0; r < counted->size(); ++r) {
      const ParamRange& c = (*counted)[r];
      gap(cursor, c.begin);
      for (int64_t a = c.begin; a < c.end; a += kChunk) {
        pieces.push_back({a, std::min(c.end, a + kChunk), static_cast<int>(r)});
      }
      cursor = c.end;
    }
  }
  gap(cursor, n);
  return pieces;
}

// Each range's chunks' partials added in order, then the ranges' totals.
double InOrder(const std::vector<Piece>& pieces, const std::vector<double>& partial, size_t ranges) {
  std::vector<double> per_range(ranges, 0.0);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].range >= 0) per_range[pieces[i].range] += partial[i];
  }
  double total = 0;
  for (double s : per_range) total += s;
  return total;
}

}  // namespace

double AddShare(float* sum, const ShareInput& in, int64_t n, const std::vector<ParamRange>* counted) {
  const std::vector<Piece> pieces = Pieces(n, counted);
  const int64_t count = static_cast<int64_t>(pieces.size());
  std::vector<double> partial(pieces.size(), 0.0);
#pragma omp parallel for schedule(static) if (count >= 16)
  for (int64_t i = 0; i < count; ++i) {
    const Piece& p = pieces[i];
    AddPart(sum, in, p.lo, p.hi);
    if (p.range >= 0) partial[i] = ChunkSumOfSquares(sum + p.lo, p.hi - p.lo);
  }
  return counted == nullptr ? 0.0 : InOrder(pieces, partial, counted->size());
}

double SumOfSquaresOverBf16(const uint16_t* x, const std::vector<ParamRange>& counted) {
  double total = 0;
  for (const ParamRange& c : counted) total += SumOfSquaresBf16(x + c.begin, c.size());
  return total;
}

}  // namespace herd
