// Collectives among the workers of a job, over a buffer: sum all-reduce,
// reduce-scatter, all-gather and broadcast, in NCCL's manner. Every rank
// issues the same operations in the same order; each call returns a handle
// at once and the operation runs in the background (so a worker overlaps
// it with compute); Wait(handle) blocks until this rank's part is done.
//
// Implementations: RingCollectives (ring_collectives.h), a ring over the
// UCX data plane for CPU buffers; NcclCollectives (nccl_collectives.h) for
// GPU buffers when CUDA is present.
//
// Promises: results are bitwise deterministic and identical on every rank
// (each part of the sum is added in a fixed ring order); a failure (a lost
// peer, a malformed message) completes every pending and later operation
// with an error that says what happened.
#pragma once

#include <cstdint>
#include <vector>

#include "common/partition.h"
#include "common/status.h"

namespace herd::transport {

enum class DType { kFloat32, kFloat64 };
// How a float32 sum travels: as float32, or as bfloat16 (half the bytes),
// each partial sum rounded to bf16 as it leaves a rank and added in fp32
// where it arrives; a part's final sum is rounded to bf16 on the rank that
// completes it too, so every rank (and a reduce-scatter's owner) still
// holds bitwise the same values.
enum class Wire { kFloat32, kBf16 };

// Parts are common/partition.h's: counts per rank in rank order; an
// all-reduce cuts its buffer by EvenPartition(n, size, kCollectiveAlign).
using herd::EvenPartition;
using herd::Partition;

class Collectives {
 public:
  using Handle = uint64_t;
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[0, n) summed over all ranks, on every rank. A bf16 wire applies
  // to kFloat32 only.
  virtual Handle AllReduce(void* data, int64_t n, DType dtype, Wire wire = Wire::kFloat32) = 0;
  // Afterwards rank r's part of data (per `parts`, which must sum to the
  // buffer's length) holds the sum over ranks; the rest is scratch.
  virtual Handle ReduceScatter(float* data, const Partition& parts, Wire wire = Wire::kFloat32) = 0;
  // Rank r contributes its part; afterwards every rank holds every part.
  virtual Handle AllGather(float* data, const Partition& parts) = 0;
  // root's data[0, n) on every rank.
  virtual Handle Broadcast(float* data, int64_t n, int root) = 0;

  virtual Status Wait(Handle handle) = 0;
  // Fails every pending and later operation with `status` (a lost peer).
  virtual void Fail(const Status& status) = 0;
};

// A group of one, of one thread: every operation leaves the data as it is
// (the sum over one rank, its own part) and is done at once; a Fail's
// status is what every later Wait returns. A reducer among the replicas
// of a placement that has none runs over it.
class SoloCollectives : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Handle AllReduce(void*, int64_t, DType, Wire) override { return 0; }
  Handle ReduceScatter(float*, const Partition&, Wire) override { return 0; }
  Handle AllGather(float*, const Partition&) override { return 0; }
  Handle Broadcast(float*, int64_t, int) override { return 0; }
  Status Wait(Handle) override { return failure_; }
  void Fail(const Status& status) override {
    if (failure_.ok()) failure_ = status;
  }

 private:
  Status failure_;
};

}  // namespace herd::transport
