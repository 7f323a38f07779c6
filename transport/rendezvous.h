// Where a process finds the coordinator and which rank it asks for, from
// flags or the environment of the launcher that started it; the job token;
// and the config hash that proves every process runs the same job.
//
// Precedence, highest first: --rank / --coordinator flags; Slurm
// (SLURM_PROCID, SLURM_NTASKS); torchrun (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT); HERD_COORDINATOR; the config's cluster.coordinator.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace herd::transport {

// Reads an environment variable; tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup ProcessEnv();

struct Placement {
  std::string coordinator;  // HOST:PORT
  int rank = -1;            // -1: the coordinator assigns
  int world_size = -1;      // -1: not given
  std::string rank_source;  // "--rank", "SLURM_PROCID", "RANK" or "" (assigned)
};

// `flag_rank` / `flag_coordinator` are empty when not given.
StatusOr<Placement> ResolvePlacement(const std::string& flag_rank, const std::string& flag_coordinator,
                                     const std::string& config_coordinator, const EnvLookup& env);

// "host:port" → host and port (0 allowed: "any free port" when listening);
// "[v6addr]:port" accepted. Errors name `what`.
Status ParseHostPort(const std::string& text, const std::string& what, std::string* host, uint16_t* port);

// The job token: from `token_file` when given, else HERD_JOB_TOKEN, else the
// file named by HERD_JOB_TOKEN_FILE. Never from a command-line value, which
// other users can read in ps.
StatusOr<std::string> LoadJobToken(const std::string& token_file, const EnvLookup& env);

// A fresh random token (64 hex digits), written to `path` with mode 0600.
StatusOr<std::string> CreateJobToken(const std::string& path);

// The job's shape and timing, as the coordinator and every process use
// them (one copy of the cluster.* fields and their defaults).
struct JobShape {
  int servers = 0;
  int workers = 1;
  double heartbeat_interval_s = 1.0;
  double heartbeat_timeout_s = 10.0;
  double join_timeout_s = 300.0;
  size_t max_message_bytes = 16u << 20;  // cluster.max_control_message_mb
  bool elastic = false;                   // cluster.elastic: a lost worker does not end the job
  int regions = 1;                        // cluster.diloco.regions: a lost region does not end the job

  static JobShape FromConfig(const JobConfig& config);
};

// Hash of the whole config (defaults filled in): equal hashes = same job.
uint64_t ConfigHash(const JobConfig& config);

}  // namespace herd::transport
