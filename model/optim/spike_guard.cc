#include "model/optim/spike_guard.h"

#include <cmath>

namespace herd {
namespace {

// How far above the mean x lies, in standard deviations (0 without spread).
double ZScore(double x, double mean, double var) { return var > 0 ? (x - mean) / std::sqrt(var) : 0.0; }

// West's exponentially weighted mean and variance.
void Add(double x, double alpha, double* mean, double* var) {
  const double d = x - *mean;
  *mean += alpha * d;
  *var = (1 - alpha) * (*var + alpha * d * d);
}

}  // namespace

SpikeVerdict JudgeAndUpdate(SpikeStats* s, double loss, double norm, double zscore, int window) {
  SpikeVerdict v;
  if (s->count == 0) {
    s->loss_mean = loss;
    s->norm_mean = norm;
    s->count = 1;
    return v;
  }
  v.loss_z = ZScore(loss, s->loss_mean, s->loss_var);
  v.norm_z = ZScore(norm, s->norm_mean, s->norm_var);
  v.skip = zscore > 0 && s->count >= window && (v.loss_z > zscore || v.norm_z > zscore);
  const double alpha = 2.0 / (window + 1.0);
  Add(loss, alpha, &s->loss_mean, &s->loss_var);
  Add(norm, alpha, &s->norm_mean, &s->norm_var);
  ++s->count;
  return v;
}

}  // namespace herd
