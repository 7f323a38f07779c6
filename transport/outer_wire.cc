#include "transport/outer_wire.h"

#include <algorithm>
#include <optional>
#include <bit>
#include <cstdio>
#include <cstring>
#include <utility>

namespace herd::transport {
namespace {

static_assert(std::endian::native == std::endian::little, "headers are sent in host order: little-endian only");

const char* PayloadName(uint8_t payload) {
  switch (payload) {
    case static_cast<uint8_t>(OuterWire::Payload::kFloat32):
      return "fp32";
    case static_cast<uint8_t>(OuterWire::Payload::kBf16):
      return "bf16";
    case static_cast<uint8_t>(OuterWire::Payload::kCodes):
      return "block codes";
  }
  return "an unknown payload";
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// "step 10 fragment 0" (steps from 1).
std::string Describe(uint64_t step, int32_t fragment) {
  return "step " + std::to_string(step + 1) + " fragment " + std::to_string(fragment);
}

}  // namespace

OuterWire::OuterWire(UcxTransport* transport, Options options)
    : transport_(transport),
      options_(std::move(options)),
      held_(options_.peers.size()),
      lost_(options_.peers.size(), false),
      unreachable_since_(options_.peers.size()),
      unreachable_why_(options_.peers.size()) {
  transport_->SetHandler(kAmOuter, [this](PeerId from, std::string_view header, IncomingPayload& payload) {
    OnMessage(from, header, payload);
  });
  transport_->SetHandler(kAmOuterState, [this](PeerId from, std::string_view header, IncomingPayload& payload) {
    OnState(from, header, payload);
  });
  transport_->OnPeerFailure([this](PeerId peer, const Status& status) {
    for (int k = 0; k < regions(); ++k) {
      if (k == options_.region || options_.peers[k] != peer) continue;
      MutexLock lock(&mu_);
      UnreachableLocked(k, status);
    }
  });
}

OuterWire::~OuterWire() { transport_->Shutdown(); }

std::string OuterWire::Sender(PeerId from) const {
  for (int k = 0; k < regions(); ++k) {
    if (k != options_.region && options_.peers[k] == from) {
      return "region " + std::to_string(k) + "'s server (peer " + std::to_string(from) + "): ";
    }
  }
  return "peer " + std::to_string(from) + ": ";
}

// ---- sending ------------------------------------------------------------------

Status OuterWire::Send(uint64_t step, int fragment, const void* data) {
  const std::string what = Describe(step, fragment);
  if (fragment < 0 || fragment >= static_cast<int>(options_.fragment_bytes.size()) ||
      options_.fragment_bytes[fragment] <= 0) {
    return Status::InvalidArgument("outer wire: sending " + what + ": this server has no part of that fragment");
  }
  const int64_t bytes = options_.fragment_bytes[fragment];
  OuterWireHeader h;
  h.payload = static_cast<uint8_t>(options_.payload);
  h.region = options_.region;
  h.fragment = fragment;
  h.step = step;
  h.bytes = bytes;
  std::string header(sizeof h, '\0');
  std::memcpy(header.data(), &h, sizeof h);
  const char* copy;
  std::vector<int> to_regions;
  {
    MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    if (sending_ > 0) return Status::FailedPrecondition("outer wire: sending " + what + " while a send is in flight");
    if (outgoing_ == nullptr) {
      outgoing_.reset(new char[*std::max_element(options_.fragment_bytes.begin(), options_.fragment_bytes.end())]);
    }
    std::memcpy(outgoing_.get(), data, bytes);
    copy = outgoing_.get();
    for (int k = 0; k < regions(); ++k) {
      if (k != options_.region && !lost_[k]) to_regions.push_back(k);
    }
    sending_ = static_cast<int>(to_regions.size());
  }
  for (const int k : to_regions) {
    const PeerId to = options_.peers[k];
    transport_->AddBusy(1);  // until it completes
    // Not under mu_: a shut-down transport completes at once, on this thread.
    transport_->Send(to, kAmOuter, header, copy, bytes, [this, k, to, what](const Status& sent) {
      transport_->AddBusy(-1);
      MutexLock lock(&mu_);
      --sending_;
      if (!sent.ok()) UnreachableLocked(k, sent.WithContext("outer wire: sending " + what + " to " + Sender(to)));
      cv_.SignalAll();
    });
  }
  MutexLock lock(&mu_);
  while (sending_ > 0 && failed_.ok()) cv_.Wait(&mu_);
  return failed_;
}

// ---- summing ------------------------------------------------------------------

StatusOr<std::vector<bool>> OuterWire::Await(uint64_t step, int fragment) {
  const Exchange exchange{step, fragment};
  MutexLock lock(&mu_);
  if (summed_any_ && exchange <= last_summed_) {
    return Status::FailedPrecondition("outer wire: awaiting " + Describe(step, fragment) +
                                      ", at or before the last exchange summed");
  }
  auto here = [&](int k) REQUIRES(mu_) {
    if (k == options_.region) return true;
    auto it = held_[k].find(exchange);
    return it != held_[k].end() && it->second.landed;
  };
  transport_->AddBusy(1);
  for (;;) {
    bool all = true;
    std::optional<std::chrono::steady_clock::time_point> next_deadline;
    for (int k = 0; k < regions(); ++k) {
      if (lost_[k] || here(k)) continue;
      all = false;
      if (const auto since = unreachable_since_[k]) {
        const auto deadline = *since + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                           std::chrono::duration<double>(options_.unreachable_timeout_s));
        if (std::chrono::steady_clock::now() >= deadline) {
          char seconds[32];
          std::snprintf(seconds, sizeof seconds, "%g", options_.unreachable_timeout_s);
          FailLocked(Status::Unavailable("outer wire: " + Sender(options_.peers[k]) + "unreachable for " + seconds +
                                         " s and not declared lost (" + unreachable_why_[k].message() + ")"));
        }
        if (!next_deadline || deadline < *next_deadline) next_deadline = deadline;
      }
    }
    if (all || !failed_.ok()) break;
    if (next_deadline) {
      cv_.WaitUntil(&mu_, *next_deadline);
    } else {
      cv_.Wait(&mu_);
    }
  }
  transport_->AddBusy(-1);
  if (!failed_.ok()) return failed_;
  std::vector<bool> present(regions());
  for (int k = 0; k < regions(); ++k) present[k] = here(k);
  return present;
}

Status OuterWire::Sum(uint64_t step, int fragment, const void* mine, const std::vector<bool>& counted,
                      const std::function<Status(int region, const void* bytes)>& add) {
  const Exchange exchange{step, fragment};
  std::vector<const void*> parts(regions(), nullptr);
  {
    MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    if (summed_any_ && exchange <= last_summed_) {
      return Status::FailedPrecondition("outer wire: summing " + Describe(step, fragment) +
                                        ", at or before the last exchange summed");
    }
    for (int k = 0; k < regions(); ++k) {
      if (!counted[k]) continue;
      if (k == options_.region) {
        parts[k] = mine;
        continue;
      }
      auto it = held_[k].find(exchange);
      if (it == held_[k].end() || !it->second.landed) {
        return Status::Internal("outer wire: " + Describe(step, fragment) + " counts region " + std::to_string(k) +
                                ", whose contribution is not here");
      }
      parts[k] = it->second.bytes.get();
    }
    summed_any_ = true;
    last_summed_ = exchange;
  }
  // The landed buffers are the caller's until they go back below: no
  // handler touches an exchange that was summed.
  Status st;
  for (int k = 0; k < regions() && st.ok(); ++k) {
    if (!counted[k]) continue;
    st = add(k, parts[k]).WithContext("region " + std::to_string(k) + "'s contribution to " +
                                      Describe(step, fragment) + ": ");
  }
  MutexLock lock(&mu_);
  for (int k = 0; k < regions(); ++k) {
    auto it = held_[k].find(exchange);
    if (it == held_[k].end() || !it->second.landed) continue;
    held_[k].erase(it);
    --stats_.held;
  }
  return st;
}

void OuterWire::Lose(int region) {
  MutexLock lock(&mu_);
  if (region < 0 || region >= regions() || region == options_.region) return;
  lost_[region] = true;
  cv_.SignalAll();
}

void OuterWire::Rejoin(int region) {
  MutexLock lock(&mu_);
  if (region < 0 || region >= regions() || region == options_.region) return;
  lost_[region] = false;
  unreachable_since_[region].reset();
  // What its lost server sent and nobody summed (landed: a buffer UCX
  // still writes into stays until it has).
  for (auto it = held_[region].begin(); it != held_[region].end();) {
    if (!it->second.landed) {
      ++it;
      continue;
    }
    it = held_[region].erase(it);
    --stats_.held;
  }
  cv_.SignalAll();
}

std::vector<bool> OuterWire::InJob() {
  MutexLock lock(&mu_);
  std::vector<bool> in(regions());
  for (int k = 0; k < regions(); ++k) in[k] = !lost_[k];
  return in;
}

Status OuterWire::SendState(int to, const std::string& bytes) {
  if (to < 0 || to >= regions() || to == options_.region) {
    return Status::InvalidArgument("outer wire: a state for region " + std::to_string(to));
  }
  OuterStateHeader h;
  h.region = options_.region;
  h.to = to;
  std::string header(sizeof h, '\0');
  std::memcpy(header.data(), &h, sizeof h);
  // UCX reads `bytes` until the send completes, which this waits for.
  bool done = false;
  Status sent_status;
  transport_->AddBusy(1);
  transport_->Send(options_.peers[to], kAmOuterState, header, bytes.data(), bytes.size(),
                   [this, &done, &sent_status](const Status& sent) {
                     transport_->AddBusy(-1);
                     MutexLock lock(&mu_);
                     sent_status = sent;
                     done = true;
                     cv_.SignalAll();
                   });
  MutexLock lock(&mu_);
  // A failed wire shuts nothing down by itself: the send still completes
  // (or the transport's shutdown completes it), so it is waited for.
  while (!done) cv_.Wait(&mu_);
  return sent_status.WithContext("outer wire: sending the job's state to region " + std::to_string(to) + ": ");
}

StatusOr<std::pair<int, std::string>> OuterWire::AwaitState(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  MutexLock lock(&mu_);
  while (!state_landed_ && failed_.ok() && std::chrono::steady_clock::now() < deadline) cv_.WaitUntil(&mu_, deadline);
  if (!failed_.ok()) return failed_;
  if (!state_landed_) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", timeout_s);
    return Status::Unavailable(std::string("outer wire: no region gave this one the job's state within ") +
                                    seconds + " s (cluster.join_timeout_s): was it admitted before the run's end?");
  }
  return std::make_pair(state_from_, std::move(state_));
}

void OuterWire::UnreachableLocked(int k, const Status& why) {
  if (lost_[k] || unreachable_since_[k]) return;
  unreachable_since_[k] = std::chrono::steady_clock::now();
  unreachable_why_[k] = why;
  cv_.SignalAll();
}

void OuterWire::Fail(const Status& status) {
  MutexLock lock(&mu_);
  FailLocked(status);
}

void OuterWire::FailLocked(const Status& status) {
  if (failed_.ok()) failed_ = status.ok() ? Status::Aborted("outer wire failed") : status;
  cv_.SignalAll();
}

OuterWire::Stats OuterWire::stats() {
  MutexLock lock(&mu_);
  return stats_;
}

// ---- the handlers (progress thread) --------------------------------------------

void OuterWire::OnState(PeerId from, std::string_view header, IncomingPayload& payload) {
  MutexLock lock(&mu_);
  auto refuse = [&](const std::string& why) REQUIRES(mu_) {
    payload.Reject();
    FailLocked(Status::Corruption("outer wire: " + Sender(from) + "the job's state: " + why));
  };
  if (!failed_.ok()) return payload.Reject();
  if (header.size() != sizeof(OuterStateHeader)) {
    return refuse("a header of " + std::to_string(header.size()) + " bytes, expected " +
                  std::to_string(sizeof(OuterStateHeader)));
  }
  OuterStateHeader h;
  std::memcpy(&h, header.data(), sizeof h);
  if (h.magic != OuterStateHeader::kMagic || h.version != OuterStateHeader::kVersion) {
    return refuse("not a state header (magic " + Hex(h.magic) + " version " + std::to_string(h.version) + ")");
  }
  if (h.region < 0 || h.region >= regions() || h.region == options_.region || options_.peers[h.region] != from) {
    return refuse("it names region " + std::to_string(h.region) + ", of which it is not the server of this range");
  }
  if (h.to != options_.region) {
    return refuse("it is for region " + std::to_string(h.to) + ", this server is region " +
                  std::to_string(options_.region) + "'s");
  }
  if (options_.state_bytes <= 0) return refuse("this server is not rejoining the job");
  if (state_from_ >= 0) return refuse("a second one (the first came from region " + std::to_string(state_from_) + ")");
  if (payload.size() != static_cast<size_t>(options_.state_bytes)) {
    return refuse(std::to_string(payload.size()) + " bytes, expected " + std::to_string(options_.state_bytes));
  }
  state_from_ = h.region;
  state_.resize(payload.size());
  if (const void* eager = payload.eager_data(); eager != nullptr) {
    std::memcpy(state_.data(), eager, payload.size());
    state_landed_ = true;
    cv_.SignalAll();
    return;
  }
  payload.ReceiveInto(state_.data(), [this, from](const Status& received) {
    MutexLock lock(&mu_);
    if (!received.ok()) {
      FailLocked(received.WithContext("outer wire: " + Sender(from) + "the job's state: "));
    } else {
      state_landed_ = true;
    }
    cv_.SignalAll();
  });
}

std::string OuterWire::Check(PeerId from, const OuterWireHeader& h, size_t bytes) const {
  const std::string what = Describe(h.step, h.fragment);
  if (h.region < 0 || h.region >= regions() || h.region == options_.region || options_.peers[h.region] != from) {
    return what + " names region " + std::to_string(h.region) + ", of which it is not the server of this range";
  }
  if (h.payload != static_cast<uint8_t>(options_.payload)) {
    return what + " carries " + PayloadName(h.payload) + ", expected " +
           PayloadName(static_cast<uint8_t>(options_.payload)) +
           " (cluster.diloco.wire_dtype must be the same in every region)";
  }
  if (h.fragment < 0 || h.fragment >= static_cast<int>(options_.fragment_bytes.size()) ||
      options_.fragment_bytes[h.fragment] <= 0) {
    return what + ": this server has no part of that fragment";
  }
  const int64_t want = options_.fragment_bytes[h.fragment];
  if (h.bytes != want || bytes != static_cast<size_t>(want)) {
    return what + " carries " + std::to_string(bytes) + " bytes (its header says " + std::to_string(h.bytes) +
           "), expected " + std::to_string(want);
  }
  if (summed_any_ && Exchange{h.step, h.fragment} <= last_summed_) {
    return what + " arrived after " + Describe(std::get<0>(last_summed_), std::get<1>(last_summed_)) +
           " was summed";
  }
  const std::map<Exchange, Held>& held = held_[h.region];
  if (held.count({h.step, h.fragment}) != 0) return what + " arrived twice";
  if (static_cast<int>(held.size()) >= kHeldPerRegion) {
    return what + " arrived while " + std::to_string(held.size()) + " of its exchanges are held, the most a region " +
           "may be ahead";
  }
  return "";
}

void OuterWire::OnMessage(PeerId from, std::string_view header, IncomingPayload& payload) {
  MutexLock lock(&mu_);
  auto refuse = [&](const std::string& why) REQUIRES(mu_) {
    payload.Reject();
    FailLocked(Status::Corruption("outer wire: " + Sender(from) + why));
  };
  if (!failed_.ok()) return payload.Reject();
  if (header.size() != sizeof(OuterWireHeader)) {
    return refuse("a header of " + std::to_string(header.size()) + " bytes, expected " +
                  std::to_string(sizeof(OuterWireHeader)));
  }
  OuterWireHeader h;
  std::memcpy(&h, header.data(), sizeof h);
  if (h.magic != OuterWireHeader::kMagic || h.version != OuterWireHeader::kVersion) {
    return refuse("not an outer-step header (magic " + Hex(h.magic) + " version " + std::to_string(h.version) +
                  ", expected " + Hex(OuterWireHeader::kMagic) + " version " +
                  std::to_string(OuterWireHeader::kVersion) + ")");
  }
  // A region let go may still be sending: dropped, no failure.
  if (h.region >= 0 && h.region < regions() && lost_[h.region] && options_.peers[h.region] == from) {
    return payload.Reject();
  }
  if (const std::string bad = Check(from, h, payload.size()); !bad.empty()) return refuse(bad);
  const Exchange exchange{h.step, h.fragment};
  Held& held = held_[h.region][exchange];
  held.bytes.reset(new char[payload.size()]);
  stats_.peak_held = std::max(stats_.peak_held, ++stats_.held);
  ++stats_.received;
  if (const void* eager = payload.eager_data(); eager != nullptr) {
    std::memcpy(held.bytes.get(), eager, payload.size());
    held.landed = true;
    cv_.SignalAll();
    return;
  }
  // The entry stays until it has landed (Sum erases only landed ones), so
  // UCX never writes into a buffer that went.
  const std::string where = "outer wire: " + Sender(from) + Describe(h.step, h.fragment) + ": ";
  payload.ReceiveInto(held.bytes.get(), [this, region = h.region, exchange, where](const Status& received) {
    MutexLock lock(&mu_);
    held_[region][exchange].landed = true;
    if (!received.ok()) FailLocked(received.WithContext(where));
    cv_.SignalAll();
  });
}

}  // namespace herd::transport
