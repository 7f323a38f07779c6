#include "worker/placements/group_ring.h"

#include "common/trace.h"

namespace herd {

using transport::DType;

TensorGroup<float> GroupRing::Group(const TensorSlices& slices, bool sequence_parallel) {
  TensorGroup<float> g;
  g.ranks = slices.ranks();
  g.rank = slices.rank();
  g.vocab_first = slices.vocab_first();
  g.all_reduce = [this](float* data, int64_t n) { Sum(data, n); };
  g.sequence_parallel = sequence_parallel;
  g.all_gather = Gathers("tensor-parallel gather");
  g.reduce_scatter = ReduceScatters("tensor-parallel reduce-scatter");
  return g;
}

std::function<void(float*, const Partition&)> GroupRing::Gathers(const char* span_name) {
  return [this, span_name](float* data, const Partition& parts) {
    if (!failure_.ok()) return;
    trace::Span span(span_name, "collective");
    failure_ = wait_.Timed([&] { return ring_->Wait(ring_->AllGather(data, parts)); });
  };
}

std::function<void(float*, const Partition&)> GroupRing::ReduceScatters(const char* span_name) {
  return [this, span_name](float* data, const Partition& parts) {
    if (!failure_.ok()) return;
    trace::Span span(span_name, "collective");
    failure_ = wait_.Timed([&] { return ring_->Wait(ring_->ReduceScatter(data, parts)); });
  };
}

ContextGroup<float> GroupRing::Context(int ranks, int rank) {
  ContextGroup<float> g;
  g.ranks = ranks;
  g.rank = rank;
  g.all_gather = Gathers("context-parallel gather");
  g.reduce_scatter = ReduceScatters("context-parallel reduce-scatter");
  return g;
}

Status GroupRing::Sum(float* data, int64_t n) {
  if (!failure_.ok()) return failure_;
  trace::Span span("tensor-parallel sum", "collective");
  failure_ = wait_.Timed([&] { return ring_->Wait(ring_->AllReduce(data, n, DType::kFloat32)); });
  return failure_;
}

}  // namespace herd
