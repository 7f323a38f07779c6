// `herd bench gpu`'s measurement: the single-process GPU trainer's step
// (device_trainer.h: everything resident on the device) on synthetic
// tokens, timed step by step. No CUDA type appears here, so tools/ can
// call it.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/cuda/device_trainer.h"
#include "model/llama_config.h"
#include "proto/herd.pb.h"

namespace herd::cuda {

struct GpuBenchOptions {
  DeviceTrainer::Options trainer;  // total_steps is set to warmup + steps
  int steps = 20, warmup = 5;
  uint64_t seed = 0;
  double init_std = 0.02;
};

struct GpuBenchResult {
  std::string device_name;
  double median_step_s = 0, mean_step_s = 0;
  double loss_first = 0, loss_last = 0;
  int64_t parameters = 0;    // without padding; tied embeddings once
  int64_t device_bytes = 0;  // allocated by the run: state + activations
};

StatusOr<GpuBenchResult> RunGpuTrainBench(const GpuBenchOptions& options);

}  // namespace herd::cuda
