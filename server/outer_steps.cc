#include "server/outer_steps.h"

#include <algorithm>
#include <string>

#include "common/trace.h"
#include "model/optim/block_quantizer.h"

namespace herd {

OuterSteps::OuterSteps(const config::DilocoConfig& diloco, DilocoPlan plan, int server,
                       std::unique_ptr<OuterOptimizer> outer, transport::Collectives* ring,
                       std::optional<DilocoPlan::Exchange> landing)
    : wire_(diloco.wire_dtype()),
      plan_(std::move(plan)),
      server_(server),
      outer_(std::move(outer)),
      ring_(ring),
      in_flight_(landing) {
  const int64_t longest = plan_.LongestRun(server_);
  sum_.resize(longest);
  if (const std::optional<BlockCode> code = BlockCodeOf(wire_)) {
    gathered_.resize(ring_->size() * QuantizedFloats(*code, longest));
  }
}

OuterSteps::~OuterSteps() {
  if (exchange_.valid()) exchange_.wait();
}

bool OuterSteps::Replaces(int64_t step) const {
  if (plan_.SentAfter(step)) return true;
  const std::optional<DilocoPlan::Exchange> flying = plan_.InFlightAfter(step - 1);
  return flying && flying->lands == step;
}

Status OuterSteps::After(int64_t step, float* weights) {
  const std::string at = "step " + std::to_string(step) + ": ";
  if (in_flight_ && in_flight_->lands == step) {
    HERD_RETURN_IF_ERROR(Settle().WithContext(at));
    Land(RunOf(in_flight_->fragment), weights);
    in_flight_.reset();
  }
  const std::optional<DilocoPlan::Exchange> sent = plan_.SentAfter(step);
  if (!sent) return Status::OK();
  if (sent->fragment == DilocoPlan::kWhole) {
    // The run's end: every fragment, one after another, waited for.
    for (int f = 0; f < plan_.fragments(); ++f) {
      const ParamRange run = RunOf(f);
      HERD_RETURN_IF_ERROR(Take(run, weights).WithContext(at));
      HERD_RETURN_IF_ERROR(SumAndStep(run, step).WithContext(at));
      Land(run, weights);
    }
    return Status::OK();
  }
  const ParamRange run = RunOf(sent->fragment);
  HERD_RETURN_IF_ERROR(Take(run, weights).WithContext(at));
  if (sent->lands == step) {
    HERD_RETURN_IF_ERROR(SumAndStep(run, step).WithContext(at));
    Land(run, weights);
    return Status::OK();
  }
  in_flight_ = sent;
  exchange_ = std::async(std::launch::async, [this, run, step] { return SumAndStep(run, step); });
  return Status::OK();
}

Status OuterSteps::Settle() {
  if (exchange_.valid()) failed_ = exchange_.get();
  return failed_;
}

void OuterSteps::Abandon(const Status& why) { ring_->Fail(why); }

Status OuterSteps::Take(const ParamRange& run, const float* weights) {
  const int64_t n = run.size();
  const float* w = weights + run.begin;
  switch (wire_) {
    case config::DilocoConfig::BF16:
      outer_->RoundedPseudoGradient(run.begin, n, w, sum_.data());
      return Status::OK();
    case config::DilocoConfig::INT8:
    case config::DilocoConfig::FP4: {
      const BlockCode code = *BlockCodeOf(wire_);
      auto* mine = reinterpret_cast<uint8_t*>(gathered_.data() + ring_->rank() * QuantizedFloats(code, n));
      return outer_->QuantizedPseudoGradient(run.begin, n, w, code, mine);
    }
    default:
      outer_->PseudoGradient(run.begin, n, w, sum_.data());
      return Status::OK();
  }
}

Status OuterSteps::SumAndStep(const ParamRange& run, int64_t step) {
  const int64_t n = run.size();
  if (n == 0) return Status::OK();  // the same range's servers of every region hold no part of it alike
  trace::Span span("outer step", "server", {"step", step});
  const int regions = ring_->size();
  if (const std::optional<BlockCode> code = BlockCodeOf(wire_)) {
    const int64_t words = QuantizedFloats(*code, n);
    HERD_RETURN_IF_ERROR(ring_->Wait(ring_->AllGather(gathered_.data(), transport::Partition(regions, words)))
                             .WithContext("the outer step's gather over the regions: "));
    std::fill(sum_.begin(), sum_.begin() + n, 0.0f);
    for (int k = 0; k < regions; ++k) {
      const auto* codes = reinterpret_cast<const uint8_t*>(gathered_.data() + k * words);
      HERD_RETURN_IF_ERROR(AddDequantized(codes, n, *code, sum_.data())
                               .WithContext("region " + std::to_string(k) + "'s pseudo-gradient of [" +
                                            std::to_string(run.begin) + ", " + std::to_string(run.end) + "): "));
    }
  } else {
    const transport::Wire wire = wire_ == config::DilocoConfig::BF16 ? transport::Wire::kBf16 : transport::Wire::kFloat32;
    HERD_RETURN_IF_ERROR(ring_->Wait(ring_->AllReduce(sum_.data(), n, transport::DType::kFloat32, wire))
                             .WithContext("the outer step's sum over the regions: "));
  }
  outer_->Step(run.begin, n, sum_.data(), regions);
  return Status::OK();
}

void OuterSteps::Land(const ParamRange& run, float* weights) const {
  std::copy(outer_->outer() + run.begin, outer_->outer() + run.end, weights + run.begin);
}

}  // namespace herd
