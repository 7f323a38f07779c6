#include "transport/ps_protocol.h"

namespace herd {

StepReport ReportOf(int64_t step, double grad_norm, double lr, double mean_loss, const SpikeVerdict& spike) {
  StepReport r;
  r.version = static_cast<uint64_t>(step);
  r.grad_norm = grad_norm;
  r.lr = lr;
  r.mean_loss = mean_loss;
  r.skipped = spike.skip ? 1 : 0;
  r.loss_z = static_cast<float>(spike.loss_z);
  r.norm_z = static_cast<float>(spike.norm_z);
  return r;
}

}  // namespace herd
