// What a training run shows: a progress line on stdout every log.every
// steps and, when log.metrics is set, one JSON object per logged step;
// when log.tensorboard is set, the same figures as TensorBoard scalars.
// Shared by the single-process trainer and parameter-server worker 0 so
// that both modes print and record the same fields.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/status.h"
#include "worker/tensorboard_writer.h"

namespace herd {

class ProgressLog {
 public:
  ProgressLog() = default;
  ~ProgressLog();
  ProgressLog(const ProgressLog&) = delete;
  ProgressLog& operator=(const ProgressLog&) = delete;

  // `append` continues an existing metrics file (resume); an empty path
  // means no such output. TensorBoard gets a new event file either way.
  Status Open(const std::string& metrics_path, const std::string& tensorboard_dir, bool append);
  // Continues the metrics file of a leader that was lost mid-run (an
  // elastic job): a line it left half-written is ended, and the steps it
  // recorded are not recorded again.
  Status TakeOver(const std::string& metrics_path, const std::string& tensorboard_dir);

  struct Entry {
    int64_t step = 0, total_steps = 0;
    double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, eta_s = 0, elapsed_s = 0;
    double step_s = 0;  // mean over the steps since the last line
    double val_loss = NAN;
    // Model FLOPs utilization (model/param_layout.h's count over the
    // workers' peak); NaN when the peak is not known.
    double mfu = NAN;
    bool skipped = false;  // the spike guard skipped this step's update
    // Share of the step time spent waiting for pushes and pulls; NaN in a
    // single process.
    double network_wait = NAN;
  };
  // Prints the progress line and appends the metrics record; a failed
  // write of the record (a full disk) is an error naming the file.
  Status Write(const Entry& e);
  // Closes the metrics file, reporting a write that failed on the way.
  Status Close();

 private:
  std::string path_;
  std::FILE* metrics_ = nullptr;
  TensorBoardWriter tensorboard_;
  int64_t recorded_through_ = 0;  // steps up to this one are in the file already
};

}  // namespace herd
