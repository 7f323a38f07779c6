// What a CPU ring (transport/ring_collectives.h) and the outer steps' wire
// (transport/outer_wire.h) hold beside their callers' buffers, bounded by
// design so that the memory plan (sharding/memory_plan.h) can count it.
#pragma once

#include <cstdint>

namespace herd {

// The pipelining grain: a chunk moves on as soon as it is reduced.
inline constexpr int64_t kRingChunkBytes = 512 << 10;
// Chunks a rank sends ahead to a neighbour that has not started the
// operation yet (the neighbour keeps them in chunk buffers until it
// does); more wait until it says it has.
inline constexpr int kRingChunksAhead = 8;
// Chunks a rank has in flight to its neighbour at most: its bf16 copies
// being sent, and the neighbour's buffers for rendezvous chunks it is
// receiving to add.
inline constexpr int kRingChunksInFlight = 8;
// The most chunk buffers a ring holds at once: early chunks (counted
// twice: those of an operation the neighbour has just started may still
// be arriving while the next one's come early), the left-hand neighbour's
// chunks being received, and this rank's bf16 copies being sent.
inline constexpr int kRingChunkBuffers = 2 * kRingChunksAhead + 2 * kRingChunksInFlight;

// The outer wire: the exchanges of another region it holds at most, each
// one contribution (a region runs at most one exchange ahead of another:
// it cannot land the one in flight without this server's contribution).
inline constexpr int kOuterHeldPerRegion = 2;

}  // namespace herd
