// What a worker's link carries per training step, in each direction, as
// the worker's own policies move it: payload bytes of the data plane in
// the steady state (a fresh start's broadcast or first pull, control
// messages and the few bytes of norms and losses left out). The figure
// `herd plan` prints and bench/lab_compare.py holds the kernel's link
// counters against.
//
//   parameter servers  pushes: every gradient once (wire_dtype); pulls:
//                      every weight once, or with stream_weights what the
//                      window pulls over the step (ReplayStreamedStep:
//                      forward, and backward's units not held at the turn);
//   all-reduce (ring)  a reduce-scatter or all-gather moves (n-1)/n of the
//                      buffer through each link each way, n the ring's
//                      ranks: DDP's all-reduce is two of the gradients;
//                      ZeRO-1/2 a reduce-scatter of the gradients and an
//                      all-gather of the weights (fp32); ZeRO-3 the
//                      reduce-scatter and the gathers the window makes
//                      (the same replay); hybrid sharding, these within
//                      the group and an all-reduce of the owned slices
//                      among the replicas;
//   tensor parallel    the group's all-reduces of each micro-batch's
//                      activations and their gradients (Megatron's: 2 a
//                      layer forward, 2 backward) and of the
//                      cross-entropy's statistics, and the packed
//                      gradients' all-reduce among the rank's replicas
//                      (parameter servers: the packed gradients pushed
//                      and the packed weights pulled).
#pragma once

#include <cstdint>

#include "common/status.h"
#include "proto/herd.pb.h"

namespace herd {

struct WorkerTraffic {
  int64_t sent = 0, received = 0;  // bytes per step, averaged over the workers
};

StatusOr<WorkerTraffic> PlanWorkerTraffic(const config::JobConfig& config);

// A job of regions (cluster.diloco): the payload bytes the servers send
// between regions over one outer period (every fragment's outer step
// once), summed over every server; nothing else crosses between regions
// but control messages and the outer wire's headers: each server sends
// its contribution to every fragment's run (ContributionBytes: fp32, bf16
// or block codes) to the same range's server of each of the R−1 other
// regions. Zero without regions.
StatusOr<int64_t> PlanRegionTraffic(const config::JobConfig& config);

}  // namespace herd
