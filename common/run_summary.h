// What a process of a job reports about itself at the end of a run, for
// programs (`herd bench compare`, tests) rather than people: with
// log.summary_dir set, each server and worker writes DIR/ROLE_RRRRR.json
// (e.g. worker_00001.json), one JSON object, atomically. People read the
// "peak memory: ..." line the same process prints.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace herd {

struct RunSummary {
  std::string role;  // "server" or "worker"
  int rank = 0;
  int64_t steps = 0;                 // steps this run took
  int64_t peak_rss_bytes = 0;        // PeakRssBytes() at the end
  int64_t plan_bytes = 0;            // what `herd plan` predicted for it
  // A GPU worker's device memory: the most its model held at once
  // (Model::DevicePeakBytes) and what `herd plan` predicted; 0 on CPUs.
  int64_t device_peak_bytes = 0;
  int64_t device_plan_bytes = 0;
  double bytes_sent_per_step = 0;    // over the data plane
  // An elastic job's (cluster.elastic): a worker's shares of the global
  // batch computed, its own and those it took over; a server's pushes
  // dropped because their share was in already (a lost worker's copy).
  int64_t shares_computed = 0;
  int64_t pushes_dropped = 0;
  // Data-plane messages dropped for not carrying the job's key (something
  // other than the job's processes reached this one's UCX worker).
  int64_t unauthenticated_dropped = 0;
  // A server's: the CRC-32 of its range of the final weights (a job of
  // regions' servers of the same range end with equal ones).
  uint32_t weights_crc32 = 0;
  // A job of regions' server: what its range held when it took up the
  // job's state rejoining (`region`: the one that gave it) and when it gave
  // it (`region`: the one rejoining), so that a test compares the two ends
  // of each hand-over rather than weights that end equal by construction.
  struct HandOver {
    int region = -1;
    int64_t step = 0;  // the optimizer's
    uint32_t weights_crc32 = 0, m_crc32 = 0, v_crc32 = 0;  // the inner AdamW's
    uint32_t outer_crc32 = 0, momentum_crc32 = 0;           // the outer step's
    int64_t data_epoch = 0, data_taken = 0;  // the data position the range's shard reports
  };
  std::optional<HandOver> took_up;
  std::vector<HandOver> gave;
};

// The end of a run (`run`: role, rank, steps, plan_bytes and the elastic
// counts) that sent `bytes_sent` over the data plane: prints "peak memory:
// X (herd plan: Y)" for people (workers add "; sent Z MiB per step") and
// writes the summary into `dir` (created if missing; nothing when `dir` is
// empty).
Status ReportRunSummary(const RunSummary& run, uint64_t bytes_sent, const std::string& dir);

}  // namespace herd
