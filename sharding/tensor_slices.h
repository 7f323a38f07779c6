// A tensor-parallel rank's part of the model (cluster.tensor_parallel: T
// ranks, Megatron's split) and how it maps onto the flat space.
//
// Rank r of T holds: the rows of q_proj, k_proj and v_proj of its heads
// (heads [r·H/T, (r+1)·H/T), KV heads likewise), of gate_proj and up_proj
// of its intermediate columns, and of the embedding and an untied lm_head
// of its vocabulary rows [r·V/T, (r+1)·V/T); the columns of o_proj and
// down_proj that multiply its heads' and its intermediate columns'
// outputs; and every norm whole. Those are the weights of a Llama of the
// rank's shape (its heads, intermediate size and vocabulary divided by T,
// the head size kept), laid out by ParamLayout as any model: the rank's
// packed space, in which LlamaModel computes (model/llama.h's
// TensorGroup) and in which the rank's gradients and optimizer state
// live. Pack and Unpack copy between it and the flat space, which stays
// the checkpoint's and the servers' currency.
//
// In the flat space (HF's [out, in] row-major matrices) a rank's rows of a
// column-parallel matrix are one contiguous range; its columns of o_proj
// and down_proj are a range in each of their d rows (strided). Ranges()
// lists them all, ascending.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/llama_config.h"
#include "model/param_layout.h"

namespace herd {

class TensorSlices {
 public:
  // Errors name cluster.tensor_parallel: T must divide the heads, the KV
  // heads, the intermediate size and the vocabulary.
  static StatusOr<TensorSlices> Make(const LlamaShape& shape, int ranks, int rank);

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  // The rank's model: heads, KV heads, intermediate size and vocabulary
  // divided by ranks(), the head size the model's.
  const LlamaShape& shape() const { return local_.shape(); }
  const ParamLayout& layout() const { return local_; }
  // The first of the rank's vocabulary rows.
  int64_t vocab_first() const { return vocab_first_; }

  // The rank's part of the flat space as runs, ascending and disjoint:
  // `flat` of the flat space is [local, local + flat.size()) of the
  // rank's; `replicated`: a norm's, which every rank holds alike.
  struct Run {
    ParamRange flat;
    int64_t local = 0;
    bool replicated = false;
  };
  const std::vector<Run>& runs() const { return runs_; }
  // flat (the model's flat space) -> local (layout()'s), every element of
  // the rank's part.
  void Pack(const float* flat, float* local) const;
  // local -> flat, the rank's part of flat only.
  void Unpack(const float* local, float* flat) const;
  // The runs' flat ranges.
  std::vector<ParamRange> Ranges() const;

 private:
  TensorSlices(const LlamaShape& shape, int ranks, int rank);

  int ranks_, rank_;
  ParamLayout local_;
  int64_t vocab_first_ = 0;
  std::vector<Run> runs_;
};

}  // namespace herd
