#include "transport/wire.h"

#include <algorithm>
#include <cstring>

namespace herd::transport {
namespace {

Status Bad(const std::string& what) { return Status::Corruption("bad control message: " + what); }

bool KnownRole(int r) { return r == wire::SERVER || r == wire::WORKER; }

Status CheckName(const std::string& name, const char* what) {
  if (name.empty()) return Bad(std::string(what) + " name is empty");
  if (name.size() > kMaxNameBytes) return Bad(std::string(what) + " name longer than 256 bytes");
  return Status::OK();
}

Status CheckRank(int32_t rank, bool allow_unset) {
  if (allow_unset && rank == -1) return Status::OK();
  if (rank < 0 || rank >= kMaxRank) return Bad("rank " + std::to_string(rank) + " out of range");
  return Status::OK();
}

Status CheckAscendingRanks(const google::protobuf::RepeatedField<int32_t>& ranks, const char* what) {
  for (int i = 0; i < ranks.size(); ++i) {
    HERD_RETURN_IF_ERROR(CheckRank(ranks.Get(i), false));
    if (i > 0 && ranks.Get(i) <= ranks.Get(i - 1)) return Bad(std::string(what) + ": live workers not in ascending order");
  }
  return Status::OK();
}

Status CheckHello(const wire::Hello& h) {
  if (h.token().size() > kMaxTokenBytes) return Bad("hello: token longer than 4096 bytes");
  if (!KnownRole(h.role())) return Bad("hello: role must be SERVER or WORKER");
  HERD_RETURN_IF_ERROR(CheckRank(h.rank(), true));
  if (h.world_size() != -1 && (h.world_size() <= 0 || h.world_size() > kMaxRank)) {
    return Bad("hello: world_size " + std::to_string(h.world_size()) + " out of range");
  }
  if (h.world_size() > 0 && h.rank() >= h.world_size()) {
    return Bad("hello: rank " + std::to_string(h.rank()) + " not below world_size " + std::to_string(h.world_size()));
  }
  if (h.host().size() > kMaxHostBytes) return Bad("hello: host longer than 255 bytes");
  if (h.resume_if_forming() && !h.join()) return Bad("hello: resume_if_forming without join");
  if (h.ucx_address().size() > kMaxUcxAddressBytes) return Bad("hello: UCX address longer than 64 KiB");
  if (h.servers() < 0 || h.servers() >= kMaxRank || h.workers() <= 0 || h.workers() >= kMaxRank) {
    return Bad("hello: servers/workers counts out of range");
  }
  if (h.heartbeat_interval_ms() <= 0 || h.heartbeat_timeout_ms() <= h.heartbeat_interval_ms() ||
      h.join_timeout_ms() <= 0) {
    return Bad("hello: heartbeat interval/timeout or join timeout invalid");
  }
  return Status::OK();
}

// The membership a welcome lists: servers then workers, each role's ranks
// 0, 1, 2, ..., the receiver among them.
Status CheckWelcome(const wire::Welcome& w) {
  if (!KnownRole(w.role())) return Bad("welcome: role must be SERVER or WORKER");
  HERD_RETURN_IF_ERROR(CheckRank(w.rank(), false));
  bool self_listed = false;
  int32_t expected_rank[3] = {0, 0, 0};
  wire::Role previous = wire::SERVER;
  for (const auto& member : w.members()) {
    if (!KnownRole(member.role())) return Bad("welcome: member role must be SERVER or WORKER");
    if (member.role() < previous) return Bad("welcome: members not ordered servers then workers");
    previous = member.role();
    if (member.rank() != expected_rank[member.role()]++) return Bad("welcome: member ranks not 0, 1, 2, ...");
    if (member.host().size() > kMaxHostBytes) return Bad("welcome: member host longer than 255 bytes");
    if (member.ucx_address().size() > kMaxUcxAddressBytes) return Bad("welcome: member UCX address too long");
    if (member.role() == w.role() && member.rank() == w.rank()) self_listed = true;
  }
  if (!self_listed) return Bad("welcome: the membership does not include the receiver");
  if (w.membership_epoch() < 0) return Bad("welcome: membership epoch below 0");
  if (w.joined_at_size() != w.live_workers_size()) return Bad("welcome: joined_at does not match live_workers");
  if (w.joining_region() < -1) return Bad("welcome: joining region below -1");
  HERD_RETURN_IF_ERROR(CheckAscendingRanks(w.live_workers(), "welcome"));
  for (int32_t epoch : w.joined_at()) {
    if (epoch < 0 || epoch > w.membership_epoch()) return Bad("welcome: a join epoch outside 0..membership_epoch");
  }
  return Status::OK();
}

Status CheckPeerLost(const wire::PeerLost& p) {
  if (!KnownRole(p.role())) return Bad("peer-lost: role must be SERVER or WORKER");
  HERD_RETURN_IF_ERROR(CheckRank(p.rank(), false));
  if (p.host().size() > kMaxHostBytes || p.reason().size() > kMaxReasonBytes) return Bad("peer-lost: field too long");
  return Status::OK();
}

// A member a change names beside its lost or joined one.
Status CheckListedMember(const wire::Member& m, const wire::MembershipChanged& c, const char* what) {
  if (!KnownRole(m.role())) return Bad(std::string("membership change: a member ") + what + " is neither a server nor a worker");
  HERD_RETURN_IF_ERROR(CheckRank(m.rank(), false));
  if (m.host().size() > kMaxHostBytes || m.ucx_address().size() > kMaxUcxAddressBytes) {
    return Bad("membership change: field too long");
  }
  const bool live = m.role() == wire::WORKER &&
                    std::find(c.live_workers().begin(), c.live_workers().end(), m.rank()) != c.live_workers().end();
  if (m.role() == wire::WORKER && live == c.has_lost()) {
    return Bad(std::string("membership change: a worker ") + what + (live ? " is listed as live" : " is not listed as live"));
  }
  return Status::OK();
}

// Exactly one member lost (a worker; a job of regions: a server too, and
// its region's other members let go) or joined (a worker in place of a
// lost one; a job of regions: a server or a worker, its region's other
// members joining with it), and the live workers after it. Whether a
// server may be named is the receiver's to check (it knows the job).
Status CheckMembershipChange(const wire::MembershipChanged& c) {
  if (c.epoch() <= 0) return Bad("membership change: epoch must be >= 1");
  if (c.has_lost() == c.has_joined()) return Bad("membership change: names neither or both a lost and a joined worker");
  const wire::Member& who = c.has_lost() ? c.lost() : c.joined();
  if (!KnownRole(who.role())) return Bad("membership change: a member is neither a server nor a worker");
  if (c.has_joined() && c.let_go_size() > 0) return Bad("membership change: a join lets members go");
  if (c.has_lost() && c.joined_with_size() > 0) return Bad("membership change: a loss has members join");
  for (const wire::Member& m : c.let_go()) HERD_RETURN_IF_ERROR(CheckListedMember(m, c, "let go"));
  for (const wire::Member& m : c.joined_with()) {
    HERD_RETURN_IF_ERROR(CheckListedMember(m, c, "joining"));
    if (m.ucx_address().empty()) return Bad("membership change: a joining member has no UCX address");
  }
  HERD_RETURN_IF_ERROR(CheckRank(who.rank(), false));
  if (who.host().size() > kMaxHostBytes || c.reason().size() > kMaxReasonBytes) {
    return Bad("membership change: field too long");
  }
  if (who.ucx_address().size() > kMaxUcxAddressBytes) return Bad("membership change: UCX address too long");
  if (c.has_joined() && who.ucx_address().empty()) return Bad("membership change: the joined member has no UCX address");
  if (c.live_workers_size() == 0) return Bad("membership change: no live workers");
  HERD_RETURN_IF_ERROR(CheckAscendingRanks(c.live_workers(), "membership change"));
  const bool listed = who.role() == wire::WORKER &&
                      std::find(c.live_workers().begin(), c.live_workers().end(), who.rank()) != c.live_workers().end();
  if (c.has_lost() && listed) return Bad("membership change: the lost worker is listed as live");
  if (c.has_joined() && who.role() == wire::WORKER && !listed) {
    return Bad("membership change: the joined worker is not listed as live");
  }
  return Status::OK();
}

}  // namespace

std::string EncodeFrame(const wire::Envelope& message) {
  std::string body;
  message.SerializeToString(&body);
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::string frame(kFrameHeaderBytes, '\0');
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  frame += body;
  return frame;
}

StatusOr<uint32_t> DecodeFrameLength(const uint8_t header[kFrameHeaderBytes], size_t max_body_bytes) {
  uint32_t n = 0;
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) n |= static_cast<uint32_t>(header[i]) << (8 * i);
  if (n == 0) return Bad("empty frame");
  if (n > max_body_bytes) {
    return Bad("frame of " + std::to_string(n) + " bytes exceeds the bound of " + std::to_string(max_body_bytes) +
               " bytes (cluster.max_control_message_mb)");
  }
  return n;
}

Status DecodeBody(std::string_view body, wire::Envelope* message) {
  message->Clear();
  if (!message->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return Bad("body of " + std::to_string(body.size()) + " bytes does not parse as herd.wire.Envelope");
  }
  return ValidateMessage(*message);
}

Status ValidateMessage(const wire::Envelope& m) {
  using E = wire::Envelope;
  switch (m.body_case()) {
    case E::BODY_NOT_SET:
      return Bad("no message body (unknown message type?)");
    case E::kHello:
      return CheckHello(m.hello());
    case E::kWelcome:
      return CheckWelcome(m.welcome());
    case E::kRefused:
      if (m.refused().reason().size() > kMaxReasonBytes) return Bad("refused: reason too long");
      return Status::OK();
    case E::kBarrier:
      if (!wire::Scope_IsValid(m.barrier().scope())) return Bad("barrier: unknown scope");
      return CheckName(m.barrier().name(), "barrier");
    case E::kAllGather:
      if (!wire::Scope_IsValid(m.all_gather().scope())) return Bad("all-gather: unknown scope");
      if (m.all_gather().scope() == wire::REGION) return Bad("all-gather: a region's scope is for barriers");
      for (int32_t member : m.all_gather().members()) {
        if (member < 0) return Bad("all-gather: a member index below 0");
      }
      if (m.all_gather().members_epoch() < 0) return Bad("all-gather: a membership epoch below 0");
      return CheckName(m.all_gather().name(), "all-gather");
    case E::kAllGatherResult:
      return CheckName(m.all_gather_result().name(), "all-gather result");
    case E::kHeartbeat:
    case E::kLeave:
    case E::kClockProbe:
      return Status::OK();
    case E::kClockReading:
      if (m.clock_reading().coordinator_ns() < 0) return Bad("clock reading: a negative time");
      return Status::OK();
    case E::kPeerLost:
      return CheckPeerLost(m.peer_lost());
    case E::kShutdown:
      if (m.shutdown().reason().size() > kMaxReasonBytes) return Bad("shutdown: reason too long");
      return Status::OK();
    case E::kMembershipChanged:
      return CheckMembershipChange(m.membership_changed());
    case E::kMembershipAck:
      if (m.membership_ack().epoch() <= 0) return Bad("membership ack: epoch must be >= 1");
      return Status::OK();
  }
  return Bad("unknown message type");
}

Status FrameReader::Append(const void* data, size_t size) {
  if (!failed_.ok()) return failed_;
  // Compact once the consumed prefix dominates, so the buffer stays bounded
  // by one frame plus what arrived with it.
  if (consumed_ > 0 && consumed_ * 2 >= buffer_.size()) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(static_cast<const char*>(data), size);
  if (buffered() >= kFrameHeaderBytes) {
    auto n = DecodeFrameLength(reinterpret_cast<const uint8_t*>(buffer_.data() + consumed_), max_body_bytes_);
    if (!n.ok()) return failed_ = n.status();
  }
  return Status::OK();
}

bool FrameReader::Next(wire::Envelope* message, Status* status) {
  *status = failed_;
  if (!failed_.ok() || buffered() < kFrameHeaderBytes) return false;
  auto n = DecodeFrameLength(reinterpret_cast<const uint8_t*>(buffer_.data() + consumed_), max_body_bytes_);
  if (!n.ok()) {
    *status = failed_ = n.status();
    return false;
  }
  if (buffered() < kFrameHeaderBytes + *n) return false;
  std::string_view body(buffer_.data() + consumed_ + kFrameHeaderBytes, *n);
  consumed_ += kFrameHeaderBytes + *n;
  Status st = DecodeBody(body, message);
  if (!st.ok()) {
    *status = failed_ = st;
    return false;
  }
  // The next header, if already here, is checked now rather than after more
  // bytes pile up behind it.
  if (buffered() >= kFrameHeaderBytes) {
    auto next = DecodeFrameLength(reinterpret_cast<const uint8_t*>(buffer_.data() + consumed_), max_body_bytes_);
    if (!next.ok()) failed_ = next.status();
  }
  return true;
}

std::string DescribeRole(wire::Role role, int32_t rank) {
  std::string name = role == wire::SERVER ? "server" : role == wire::WORKER ? "worker" : "process";
  return rank >= 0 ? name + " rank " + std::to_string(rank) : name + " (rank unassigned)";
}

}  // namespace herd::transport
