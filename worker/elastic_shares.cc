#include "worker/elastic_shares.h"

#include <algorithm>
#include <chrono>

namespace herd {

ElasticShares::ElasticShares(int shares, int rank, const transport::WelcomedMembership& welcomed)
    : shares_(shares), rank_(rank), welcomed_(welcomed) {
  for (size_t i = 0; i < welcomed_.live_workers.size(); ++i) {
    joined_at_[welcomed_.live_workers[i]] = welcomed_.joined_at[i];
    if (welcomed_.live_workers[i] == rank_) joined_at_self_ = welcomed_.joined_at[i];
  }
}

std::vector<int> ElasticShares::Assign(int shares, const std::vector<int>& live, int rank) {
  std::vector<int> mine;
  if (std::find(live.begin(), live.end(), rank) == live.end()) return mine;
  if (rank < shares) mine.push_back(rank);
  int orphan = 0;
  for (int share = 0; share < shares; ++share) {
    if (std::find(live.begin(), live.end(), share) != live.end()) continue;
    if (live[orphan++ % live.size()] == rank) mine.push_back(share);
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

void ElasticShares::Apply(const transport::MembershipChange& change) {
  {
    MutexLock lock(&mu_);
    const int known = changes_.empty() ? welcomed_.epoch : changes_.back().epoch;
    if (change.epoch <= known) return;
    changes_.push_back(change);
    if (change.joined) {
      joined_at_[change.member.rank()] = change.epoch;
    } else {
      joined_at_.erase(change.member.rank());
    }
  }
  cv_.SignalAll();
}

int ElasticShares::epoch() const {
  MutexLock lock(&mu_);
  return changes_.empty() ? welcomed_.epoch : changes_.back().epoch;
}

Status ElasticShares::AwaitEpoch(int epoch, const std::function<Status()>& health) const {
  mu_.Lock();
  for (;;) {
    if ((changes_.empty() ? welcomed_.epoch : changes_.back().epoch) >= epoch) {
      mu_.Unlock();
      return Status::OK();
    }
    mu_.Unlock();
    HERD_RETURN_IF_ERROR(health());
    mu_.Lock();
    cv_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  }
}

std::vector<transport::MembershipChange> ElasticShares::ChangesSince(int epoch) const {
  MutexLock lock(&mu_);
  std::vector<transport::MembershipChange> out;
  for (const auto& c : changes_) {
    if (c.epoch > epoch) out.push_back(c);
  }
  return out;
}

std::vector<int> ElasticShares::LiveAt(int stamp) const {
  std::vector<int> live;
  for (size_t i = 0; i < welcomed_.live_workers.size(); ++i) {
    if (welcomed_.joined_at[i] <= stamp) live.push_back(welcomed_.live_workers[i]);
  }
  for (const auto& c : changes_) {
    const int r = c.member.rank();
    if (!c.joined) {
      live.erase(std::remove(live.begin(), live.end(), r), live.end());
    } else if (c.epoch <= stamp && std::find(live.begin(), live.end(), r) == live.end()) {
      live.push_back(r);
    }
  }
  std::sort(live.begin(), live.end());
  return live;
}

std::vector<int> ElasticShares::Mine(int stamp) const {
  MutexLock lock(&mu_);
  return Assign(shares_, LiveAt(stamp), rank_);
}

int ElasticShares::leader() const {
  MutexLock lock(&mu_);
  int best = 0, best_epoch = -1;
  for (const auto& [rank, epoch] : joined_at_) {
    if (best_epoch < 0 || epoch < best_epoch) {  // ascending ranks: the first of an epoch wins
      best = rank;
      best_epoch = epoch;
    }
  }
  return best;
}

}  // namespace herd
