// MFU's two halves: the FLOPs a training token costs (model/param_layout.h)
// counted by hand for a small model, and the device peaks of
// model/peak_flops.h by the names CUDA gives the GPUs.
#include <gtest/gtest.h>

#include "model/param_layout.h"
#include "model/peak_flops.h"

namespace herd {
namespace {

LlamaShape Small(bool tied) {
  LlamaShape s;
  s.vocab_size = 256;
  s.hidden_size = 64;
  s.intermediate_size = 160;
  s.num_layers = 2;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.tie_word_embeddings = tied;
  return s;
}

TEST(Flops, PerTokenIsSixTimesTheMatrixWeightsPlusAttention) {
  // Per layer: q 64x64, k and v 64x32, o 64x64, gate, up and down 64x160.
  const double layer = 4096 + 2048 + 2048 + 4096 + 3 * 10240;
  const double lm_head = 256 * 64;  // the embedding lookup is no product
  const double attention = 12.0 * 2 * 64 * 32;
  EXPECT_EQ(TrainingFlopsPerToken(Small(true), 32), 6 * (2 * layer + lm_head) + attention);
  EXPECT_EQ(TrainingFlopsPerToken(Small(false), 32), 6 * (2 * layer + lm_head) + attention);
}

TEST(Flops, DatasheetPeaksByCudaDeviceName) {
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA H100 80GB HBM3", true), 989);
  EXPECT_EQ(DatasheetPeakTflops("cuda:0 NVIDIA H100 80GB HBM3, fp32", false), 67);
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA H100 PCIe", true), 756);
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA H100 NVL", true), 835);
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA H200", true), 989);
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA H200 NVL", true), 835);
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA A100-SXM4-80GB", true), 312);
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA A100 80GB PCIe", false), 19.5);
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA L40S", true), 362);
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA L4", true), 121);
  EXPECT_EQ(DatasheetPeakTflops("NVIDIA L40", true), 0);  // not in the table: no guess
  EXPECT_EQ(DatasheetPeakTflops("cpu (8 threads)", false), 0);
  EXPECT_EQ(DatasheetPeakTflops("", true), 0);
}

}  // namespace
}  // namespace herd
