#include "transport/rendezvous.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/config.h"
#include "common/file_util.h"
#include "common/rng.h"
#include "common/strings.h"

namespace herd::transport {
namespace {

// Parses a non-negative integer environment/flag value; `what` names it.
StatusOr<int> ParseCount(const std::string& text, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < 0 || v > (1 << 20)) {
    return Status::InvalidArgument(what + ": expected a non-negative integer, got '" + text + "'");
  }
  return static_cast<int>(v);
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

StatusOr<Placement> ResolvePlacement(const std::string& flag_rank, const std::string& flag_coordinator,
                                     const std::string& config_coordinator, const EnvLookup& env) {
  Placement p;
  auto take_rank = [&](const std::string& value, const std::string& source) -> Status {
    HERD_ASSIGN_OR_RETURN(p.rank, ParseCount(value, source));
    p.rank_source = source;
    return Status::OK();
  };
  if (!flag_rank.empty()) {
    HERD_RETURN_IF_ERROR(take_rank(flag_rank, "--rank"));
  } else if (auto v = env("SLURM_PROCID")) {
    HERD_RETURN_IF_ERROR(take_rank(*v, "SLURM_PROCID"));
    if (auto n = env("SLURM_NTASKS")) {
      HERD_ASSIGN_OR_RETURN(p.world_size, ParseCount(*n, "SLURM_NTASKS"));
    }
  } else if (auto v = env("RANK")) {
    HERD_RETURN_IF_ERROR(take_rank(*v, "RANK"));
    if (auto n = env("WORLD_SIZE")) {
      HERD_ASSIGN_OR_RETURN(p.world_size, ParseCount(*n, "WORLD_SIZE"));
    }
  }
  if (p.world_size == 0) return Status::InvalidArgument(p.rank_source + ": world size is 0");
  if (p.world_size > 0 && p.rank >= p.world_size) {
    return Status::InvalidArgument(p.rank_source + ": rank " + std::to_string(p.rank) + " is not below world size " +
                                   std::to_string(p.world_size));
  }

  std::string source;
  if (!flag_coordinator.empty()) {
    p.coordinator = flag_coordinator;
    source = "--coordinator";
  } else if (auto addr = env("MASTER_ADDR")) {
    auto port = env("MASTER_PORT");
    if (!port) return Status::InvalidArgument("MASTER_ADDR is set but MASTER_PORT is not");
    p.coordinator = (addr->find(':') != std::string::npos ? "[" + *addr + "]" : *addr) + ":" + *port;
    source = "MASTER_ADDR/MASTER_PORT";
  } else if (auto c = env("HERD_COORDINATOR")) {
    p.coordinator = *c;
    source = "HERD_COORDINATOR";
  } else {
    p.coordinator = config_coordinator;
    source = "cluster.coordinator";
  }
  std::string host;
  uint16_t port = 0;
  HERD_RETURN_IF_ERROR(ParseHostPort(p.coordinator, source, &host, &port));
  if (port == 0) return Status::InvalidArgument(source + ": the coordinator's port cannot be 0");
  return p;
}

Status ParseHostPort(const std::string& text, const std::string& what, std::string* host, uint16_t* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return Status::InvalidArgument(what + ": expected HOST:PORT, got '" + text + "'");
  }
  std::string h = text.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  auto p = ParseCount(text.substr(colon + 1), what + " port");
  if (!p.ok() || *p > 65535) {
    return Status::InvalidArgument(what + ": port must be 0..65535 in '" + text + "'");
  }
  *host = h;
  *port = static_cast<uint16_t>(*p);
  return Status::OK();
}

StatusOr<std::string> LoadJobToken(const std::string& token_file, const EnvLookup& env) {
  std::string path = token_file, source = "--token-file";
  if (path.empty()) {
    if (auto v = env("HERD_JOB_TOKEN")) {
      std::string token = Trim(*v);
      if (token.empty()) return Status::InvalidArgument("HERD_JOB_TOKEN is set but empty");
      return token;
    }
    if (auto f = env("HERD_JOB_TOKEN_FILE")) {
      path = *f;
      source = "HERD_JOB_TOKEN_FILE";
    }
  }
  if (path.empty()) {
    return Status::InvalidArgument(
        "no job token: pass --token-file FILE or set HERD_JOB_TOKEN / HERD_JOB_TOKEN_FILE "
        "(herd launch writes one per job)");
  }
  auto text = ReadFile(path);
  if (!text.ok()) return text.status().WithContext(source + ": ");
  std::string token = Trim(*text);
  if (token.empty()) return Status::InvalidArgument(path + ": job token file is empty");
  return token;
}

StatusOr<std::string> CreateJobToken(const std::string& path) {
  uint8_t raw[32];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::read(fd, raw, sizeof raw) != static_cast<ssize_t>(sizeof raw)) {
    if (fd >= 0) ::close(fd);
    return Status::IOError("/dev/urandom: cannot read random bytes for the job token");
  }
  ::close(fd);
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (uint8_t b : raw) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  // Created 0600 from the start (never readable by others, not even
  // briefly), then renamed into place.
  const std::string tmp = path + ".tmp";
  fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError(tmp + ": cannot create: " + std::strerror(errno));
  const std::string line = token + "\n";
  const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::IOError(path + ": cannot write the job token: " + std::strerror(errno));
  }
  return token;
}

JobShape JobShape::FromConfig(const JobConfig& config) {
  const auto& c = config.cluster();
  JobShape shape;
  shape.servers = c.servers();
  shape.workers = c.workers();
  shape.heartbeat_interval_s = c.heartbeat_interval_s();
  shape.heartbeat_timeout_s = c.heartbeat_timeout_s();
  shape.join_timeout_s = c.join_timeout_s();
  shape.max_message_bytes = static_cast<size_t>(c.max_control_message_mb() * (1 << 20));
  shape.elastic = c.elastic();
  shape.regions = Regions(config);
  return shape;
}

uint64_t ConfigHash(const JobConfig& config) {
  // Text with defaults filled in: two configs that differ only in whether a
  // default was written out are the same job.
  return Mix64(HashName(ConfigToText(config)));
}

}  // namespace herd::transport
