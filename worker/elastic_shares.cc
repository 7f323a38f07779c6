#include "worker/elastic_shares.h"

#include <algorithm>

namespace herd {

ElasticShares::ElasticShares(int shares, int rank) : shares_(shares), rank_(rank) {
  for (int r = 0; r < shares; ++r) live_.push_back(r);
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
  std::lock_guard<std::mutex> lock(mu_);
  if (change.epoch <= (changes_.empty() ? 0 : changes_.back().epoch)) return;
  changes_.push_back(change);
  live_ = change.live_workers;
}

int ElasticShares::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return changes_.empty() ? 0 : changes_.back().epoch;
}

std::vector<transport::MembershipChange> ElasticShares::ChangesSince(int epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<transport::MembershipChange> out;
  for (const auto& c : changes_) {
    if (c.epoch > epoch) out.push_back(c);
  }
  return out;
}

std::vector<int> ElasticShares::Mine() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Assign(shares_, live_, rank_);
}

int ElasticShares::leader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.empty() ? 0 : live_.front();
}

}  // namespace herd
