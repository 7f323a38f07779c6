#include "sharding/diloco_plan.h"

#include <algorithm>
#include <string>

namespace herd {

StatusOr<DilocoPlan> DilocoPlan::Make(const config::DilocoConfig& diloco, const ShardPlan& plan, int64_t last_step) {
  HERD_RETURN_IF_ERROR(ValidateDilocoSchedule(diloco));
  const int64_t F = diloco.fragments(), B = static_cast<int64_t>(plan.buckets().size());
  if (F > B) {
    return Status::InvalidArgument("cluster.diloco.fragments: " + std::to_string(F) + " is above the job's " +
                                   std::to_string(B) +
                                   " buckets (a fragment is a run of buckets; lower cluster.bucket_mb for more)");
  }
  return DilocoPlan(diloco, plan, last_step);
}

DilocoPlan::DilocoPlan(const config::DilocoConfig& diloco, const ShardPlan& plan, int64_t last_step)
    : every_(diloco.every()),
      overlap_(diloco.overlap()),
      last_step_(last_step),
      fragments_(diloco.fragments()),
      plan_(plan) {}

int64_t DilocoPlan::LongestRun(int server) const {
  int64_t longest = 0;
  for (int f = 0; f < fragments_; ++f) longest = std::max(longest, RunOf(server, f).size());
  return longest;
}

ParamRange DilocoPlan::RunOf(int server, int fragment) const {
  const ParamRange& range = plan_.shard(server);
  if (fragment == kWhole) return {0, range.size()};
  // A fragment's buckets are consecutive in the plan, and so are a
  // server's: their union is one run.
  const int64_t B = static_cast<int64_t>(plan_.buckets().size());
  int64_t begin = range.end, end = range.begin;
  for (int64_t b = 0; b < B; ++b) {
    const Bucket& bucket = plan_.buckets()[b];
    if (bucket.server != server || b * fragments_ / B != fragment) continue;
    begin = std::min(begin, bucket.range.begin);
    end = std::max(end, bucket.range.end);
  }
  if (begin >= end) return {0, 0};
  return {begin - range.begin, end - range.begin};
}

std::optional<int> DilocoPlan::FragmentSentAfter(int64_t step) const {
  for (int f = 0; f < fragments_; ++f) {
    if (step % every_ == (every_ * (f + 1) / fragments_) % every_) return f;
  }
  return std::nullopt;
}

std::optional<DilocoPlan::Exchange> DilocoPlan::SentAfter(int64_t step) const {
  if (step == last_step_) return Exchange{kWhole, step, step};
  if (step > last_step_) return std::nullopt;
  const std::optional<int> f = FragmentSentAfter(step);
  if (!f) return std::nullopt;
  return Exchange{*f, step, std::min(step + overlap_, last_step_)};
}

std::optional<DilocoPlan::Exchange> DilocoPlan::InFlightAfter(int64_t step) const {
  for (int64_t sent = std::max<int64_t>(1, step - overlap_); sent <= step; ++sent) {
    const std::optional<Exchange> e = SentAfter(sent);
    if (e && e->lands > step) return e;
  }
  return std::nullopt;
}

}  // namespace herd
