#include "server/outer_steps.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/bf16.h"
#include "common/trace.h"
#include "model/optim/block_quantizer.h"
#include "transport/exchanges.h"

namespace herd {

transport::OuterWire::Options OuterSteps::WireOptions(const config::DilocoConfig& diloco, const DilocoPlan& plan,
                                                      int server, int region, std::vector<transport::PeerId> peers) {
  transport::OuterWire::Options o;
  o.region = region;
  o.peers = std::move(peers);
  o.payload = BlockCodeOf(diloco.wire_dtype())               ? transport::OuterWire::Payload::kCodes
              : diloco.wire_dtype() == config::DilocoConfig::BF16 ? transport::OuterWire::Payload::kBf16
                                                                : transport::OuterWire::Payload::kFloat32;
  for (int f = 0; f < plan.fragments(); ++f) {
    o.fragment_bytes.push_back(ContributionBytes(diloco.wire_dtype(), plan.RunOf(server, f).size()));
  }
  return o;
}

OuterSteps::OuterSteps(const config::DilocoConfig& diloco, DilocoPlan plan, int server, int region_servers,
                       std::unique_ptr<OuterOptimizer> outer, transport::OuterWire* wire,
                       transport::CoordinatorClient* client, std::optional<DilocoPlan::Exchange> landing)
    : wire_dtype_(diloco.wire_dtype()),
      plan_(std::move(plan)),
      server_(server),
      region_servers_(region_servers),
      outer_(std::move(outer)),
      wire_(wire),
      client_(client),
      in_flight_(landing),
      live_(wire->regions(), true) {
  const int64_t longest = plan_.LongestRun(server_);
  sum_.resize(longest);
  mine_.resize((ContributionBytes(wire_dtype_, longest) + 3) / 4);
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
      HERD_RETURN_IF_ERROR(SumAndStep(run, step, f).WithContext(at));
      Land(run, weights);
    }
    return Status::OK();
  }
  const ParamRange run = RunOf(sent->fragment);
  HERD_RETURN_IF_ERROR(Take(run, weights).WithContext(at));
  if (sent->lands == step) {
    HERD_RETURN_IF_ERROR(SumAndStep(run, step, sent->fragment).WithContext(at));
    Land(run, weights);
    return Status::OK();
  }
  in_flight_ = sent;
  exchange_ = std::async(std::launch::async,
                         [this, run, step, fragment = sent->fragment] { return SumAndStep(run, step, fragment); });
  return Status::OK();
}

void OuterSteps::Lose(int region) {
  {
    MutexLock lock(&heard_mu_);
    heard_.erase(region);
  }
  wire_->Lose(region);
}

void OuterSteps::Heard(int region) {
  MutexLock lock(&heard_mu_);
  heard_.insert(region);
}

std::vector<int> OuterSteps::Admit() {
  // Only once nothing is in flight: voted_in_ is the exchange thread's
  // until then.
  if (in_flight_ || exchange_.valid()) return {};
  std::vector<int> admitted;
  for (int k : voted_in_) {
    MutexLock lock(&heard_mu_);
    if (heard_.erase(k) == 0) continue;  // lost since
    wire_->Rejoin(k);
    admitted.push_back(k);
  }
  voted_in_.clear();
  return admitted;
}

void OuterSteps::StartFrom(const std::vector<bool>& in_job, const std::vector<bool>& counted) {
  for (int k = 0; k < static_cast<int>(in_job.size()); ++k) {
    if (!in_job[k]) wire_->Lose(k);
  }
  live_ = counted;
}

Status OuterSteps::Settle() {
  if (exchange_.valid()) failed_ = exchange_.get();
  return failed_;
}

void OuterSteps::Abandon(const Status& why) { wire_->Fail(why); }

Status OuterSteps::Take(const ParamRange& run, const float* weights) {
  const int64_t n = run.size();
  const float* w = weights + run.begin;
  switch (wire_dtype_) {
    case config::DilocoConfig::BF16:
      // Rounded to bf16 values (the error kept), then their bits: exact.
      outer_->RoundedPseudoGradient(run.begin, n, w, sum_.data());
      FloatsToBf16(sum_.data(), reinterpret_cast<uint16_t*>(mine_.data()), n);
      return Status::OK();
    case config::DilocoConfig::INT8:
    case config::DilocoConfig::FP4:
      return outer_->QuantizedPseudoGradient(run.begin, n, w, *BlockCodeOf(wire_dtype_),
                                             reinterpret_cast<uint8_t*>(mine_.data()));
    default:
      outer_->PseudoGradient(run.begin, n, w, mine_.data());
      return Status::OK();
  }
}

Status OuterSteps::Add(const void* bytes, const ParamRange& run) {
  const int64_t n = run.size();
  float* sum = sum_.data();
  if (const std::optional<BlockCode> code = BlockCodeOf(wire_dtype_)) {
    return AddDequantized(static_cast<const uint8_t*>(bytes), n, *code, sum);
  }
  const bool bf16 = wire_dtype_ == config::DilocoConfig::BF16;
  for (int64_t i = 0; i < n; ++i) {
    const float v = bf16 ? Bf16ToFloat(static_cast<const uint16_t*>(bytes)[i]) : static_cast<const float*>(bytes)[i];
    if (!std::isfinite(v)) {
      return Status::Corruption("the value at flat offset " + std::to_string(run.begin + i) + " is " +
                                std::to_string(v));
    }
    sum[i] += v;
  }
  return Status::OK();
}

Status OuterSteps::SumAndStep(const ParamRange& run, int64_t step, int fragment) {
  const int64_t n = run.size();
  trace::Span span("outer step", "server", {"step", step});
  // The same range's servers of every region hold no part of it alike:
  // they only vote.
  if (n > 0) {
    HERD_RETURN_IF_ERROR(wire_->Send(step, fragment, mine_.data()));
    HERD_RETURN_IF_ERROR(wire_->Await(step, fragment).status());
  }
  HERD_ASSIGN_OR_RETURN(const std::vector<bool> counted, Vote(step, fragment));
  if (n == 0) return Status::OK();
  std::fill(sum_.begin(), sum_.begin() + n, 0.0f);
  HERD_RETURN_IF_ERROR(wire_->Sum(step, fragment, mine_.data(), counted,
                                  [this, &run](int, const void* bytes) { return Add(bytes, run); }));
  outer_->Step(run.begin, n, sum_.data(), static_cast<int>(std::count(counted.begin(), counted.end(), true)));
  return Status::OK();
}

StatusOr<std::vector<bool>> OuterSteps::Vote(int64_t step, int fragment) {
  wire::OuterVote ready;
  ready.set_ready(true);
  {
    MutexLock lock(&heard_mu_);
    for (int k : heard_) ready.add_joining(k);
  }
  // The voters: every server of the regions in the job here (servers'
  // member indices are their ranks), as of the membership read first.
  const int regions = wire_->regions();
  transport::Voters voters;
  voters.epoch = client_->membership_epoch();
  const std::vector<bool> in_job = wire_->InJob();
  for (int k = 0; k < regions; ++k) {
    for (int j = 0; in_job[k] && j < region_servers_; ++j) voters.members.push_back(k * region_servers_ + j);
  }
  HERD_ASSIGN_OR_RETURN(const std::vector<wire::OuterVote> all,
                        transport::Gather(*client_, transport::OuterVoteExchange(step, fragment), ready, voters));
  if (static_cast<int>(all.size()) != regions * region_servers_) {
    return Status::Internal("the outer step's vote has " + std::to_string(all.size()) + " servers' votes, expected " +
                            std::to_string(regions * region_servers_));
  }
  std::vector<bool> counted(regions);
  for (int k = 0; k < regions; ++k) counted[k] = all[k * region_servers_ + server_].ready();
  // A region rejoining is admitted when every voter names it.
  std::vector<int> named(regions, 0);
  int voted = 0;
  for (const wire::OuterVote& v : all) {
    if (!v.ready()) continue;
    ++voted;
    std::set<int> names;
    for (int k : v.joining()) {
      if (k >= 0 && k < regions && names.insert(k).second) ++named[k];
    }
  }
  for (int k = 0; k < regions; ++k) {
    if (named[k] == voted && voted > 0 && !counted[k] &&
        std::find(voted_in_.begin(), voted_in_.end(), k) == voted_in_.end()) {
      voted_in_.push_back(k);
    }
  }
  live_ = counted;
  return counted;
}

void OuterSteps::Land(const ParamRange& run, float* weights) const {
  std::copy(outer_->outer() + run.begin, outer_->outer() + run.end, weights + run.begin);
}

}  // namespace herd
