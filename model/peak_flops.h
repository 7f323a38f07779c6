// What a device can do at best, for model FLOPs utilization (MFU): the
// datasheet's dense figure for the dtype herd's matrix products run in on
// it (bf16 on tensor cores; fp32 on CUDA cores: herd's fp32 products do
// not use TF32). log.peak_tflops overrides it; CPUs have no entry (their
// peak depends on cores, clock and vector width: give log.peak_tflops).
#pragma once

#include <string>

namespace herd {

// TFLOP/s of the GPU that `device` names (its CUDA name, "NVIDIA H100 80GB
// HBM3", or a model's Describe(), which contains it); 0 when unknown.
double DatasheetPeakTflops(const std::string& device, bool bf16);

}  // namespace herd
