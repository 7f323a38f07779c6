#include "worker/share_schedule.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace herd {
namespace {

class Fixed : public ShareSchedule {
 public:
  Fixed(SyncStrategy& sync, int share, bool leads) : sync_(sync), share_(share), leads_(leads) {}

  int max_shares() const override { return 1; }
  bool leads() const override { return leads_; }
  StatusOr<std::vector<int>> SharesOf(int64_t, StepBoundary&) override { return std::vector<int>{share_}; }
  Status AwaitWeights(int64_t, bool, const Redo&) override { return sync_.FinishWeights(); }

 private:
  SyncStrategy& sync_;
  const int share_;
  const bool leads_;
};

class Elastic : public ShareSchedule {
 public:
  explicit Elastic(const ElasticScheduleParts& p) : p_(p) {}

  int max_shares() const override { return p_.shares->shares(); }
  bool leads() const override { return p_.shares->leader() == p_.rank; }

  // Settled at the step boundary, after the weights (and any share taken
  // over) are in, by the membership the previous step's report names.
  StatusOr<std::vector<int>> SharesOf(int64_t, StepBoundary& previous) override {
    HERD_RETURN_IF_ERROR(previous.Settle());
    drawn_stamp_ = static_cast<int>(p_.sync->report().membership_epoch);
    HERD_RETURN_IF_ERROR(p_.shares->AwaitEpoch(drawn_stamp_, [this] { return p_.client->health(); }));
    computed_ = p_.shares->Mine(drawn_stamp_);
    drawn_from_ = p_.sampler->SaveState();
    return computed_;
  }

  Status AwaitWeights(int64_t version, bool made_here, const Redo& redo) override {
    for (;;) {
      const int seen = p_.shares->epoch();
      // Workers lost while the step that makes `version` was under way
      // (before this wait or during it): this worker computes the lost
      // shares the membership now gives it (the servers drop any that turn
      // out to be in already).
      if (made_here) HERD_RETURN_IF_ERROR(TakeOverShares(version - 1, redo));
      HERD_ASSIGN_OR_RETURN(const bool in, p_.sync->FinishWeightsUnless([&] { return p_.shares->epoch() != seen; }));
      if (in) break;
    }
    NoteMembership(version);
    return Status::OK();
  }

 private:
  Status TakeOverShares(int64_t t, const Redo& redo) {
    std::vector<int> todo;
    for (int share : p_.shares->Mine(drawn_stamp_)) {
      if (std::find(computed_.begin(), computed_.end(), share) == computed_.end()) todo.push_back(share);
    }
    if (todo.empty()) return Status::OK();
    // The step's sequences of those shares: drawn from where the step's
    // were, by a copy of the sampler (this one has moved on).
    DistributedSampler replay = *p_.sampler;
    HERD_RETURN_IF_ERROR(replay.RestoreState(drawn_from_));
    HERD_RETURN_IF_ERROR(redo(t, todo, replay));
    computed_.insert(computed_.end(), todo.begin(), todo.end());
    return Status::OK();
  }

  // The leader says who was lost or joined since it last said.
  void NoteMembership(int64_t step) {
    const std::vector<transport::MembershipChange> changes = p_.shares->ChangesSince(reported_epoch_);
    if (changes.empty()) return;
    reported_epoch_ = changes.back().epoch;
    if (!leads()) return;
    for (const auto& c : changes) {
      if (c.joined) {
        std::printf("worker %d joined at step %lld: continuing with %zu\n", c.member.rank(),
                    static_cast<long long>(step), c.live_workers.size());
      } else {
        std::printf("worker %d lost at step %lld: continuing with %zu (%s)\n", c.member.rank(),
                    static_cast<long long>(step), c.live_workers.size(), c.reason.c_str());
      }
    }
    std::fflush(stdout);
  }

  const ElasticScheduleParts p_;
  std::vector<int> computed_;  // the shares this worker computed of the step in flight
  std::string drawn_from_;     // the data position the step in flight was drawn from
  int drawn_stamp_ = 0;        // the membership epoch its shares were dealt by
  int reported_epoch_ = 0;     // the membership changes told so far
};

}  // namespace

std::unique_ptr<ShareSchedule> FixedShare(SyncStrategy& sync, int share, bool leads) {
  return std::make_unique<Fixed>(sync, share, leads);
}

std::unique_ptr<ShareSchedule> ElasticSchedule(const ElasticScheduleParts& parts) {
  return std::make_unique<Elastic>(parts);
}

}  // namespace herd
