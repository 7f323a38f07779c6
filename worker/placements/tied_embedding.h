// A tied embedding across pipeline stages (model.tie_word_embeddings with
// cluster.pipeline_stages > 1): the first stage computes the lookup's part
// of its gradient, the last stage the head's, each holding the embedding
// [0, end) of its own. Once each stage's gradients are reduced among its
// replicas, the two swap their parts and each adds them head part first,
// so both hold bitwise the same sum and step the embedding alike
// (Megatron's word-embedding all-reduce). The reducers call it between
// their reductions and the norm (worker/reducers/collective_sync.h's
// ReducedPlacement::after_reduction).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transport/pipeline_wire.h"

namespace herd {

class TiedEmbeddingExchange {
 public:
  // `first`: this worker is its replica's first stage (else its last);
  // `peer` the other end; `last_virtual_stage` the schedule's last.
  TiedEmbeddingExchange(transport::PipelineWire* wire, transport::PeerId peer, bool first, int last_virtual_stage,
                        int64_t embedding_end);

  // Step `step`'s exchange of grads[0, embedding_end): the sum in place.
  Status Exchange(float* grads, uint64_t step);

 private:
  transport::PipelineWire* const wire_;
  const transport::PeerId peer_;
  const bool first_;
  const int last_virtual_stage_;
  const int64_t end_;
  std::vector<float> other_;  // the other stage's part
};

}  // namespace herd
