// Pipeline-parallel schedules: the order in which each pipeline device runs
// the forward and backward passes of the micro-batches of one step, as a
// static table every process computes alike, and a simulator that replays
// a table under given pass times (for tests, `herd plan` and bubble
// estimates).
//
// Promises of every table MakePipelineSchedule returns:
//  - each device runs the forward and the backward (for ZERO_BUBBLE, the
//    input-gradient and the weight-gradient parts) of every (chunk,
//    micro-batch) it holds exactly once, and nothing else;
//  - on each device, the backwards of a chunk, and its weight-gradient
//    parts, run in ascending micro-batch order, so that gradients
//    accumulate in the same order, bit for bit, as one process doing
//    micro-batch 0, 1, 2, ... in turn;
//  - it cannot deadlock: with buffered sends and blocking receives the
//    lists run to completion whatever each pass takes, since the table is
//    one run's order and the dependencies below are a fixed graph;
//  - activations stay within the schedule's bound. Micro-batch-chunks whose
//    forward has run and whose backward has not: M for GPipe; on device p,
//    min(P - p, M) for 1F1B and ZB-H1; Megatron's warm-up forwards plus one
//    for the interleaved schedule. Counting also ZB-H1's micro-batches
//    whose weight-gradient part is still owed, no device holds more than P,
//    1F1B's peak on device 0.
//
// Dependencies, i.e. what an executor waits for: Forward(vs, m) needs
// Forward(vs - 1, m) (vs > 0); Backward(vs, m) needs Forward(vs, m) and
// Backward(vs + 1, m) (vs below the last); WeightGrad(vs, m) needs
// Backward(vs, m), on the same device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace herd {

enum class PipelineScheduleKind { kGPipe, kOneFOneB, kInterleaved1F1B, kZeroBubble };

// The config's spelling (cluster.pipeline_schedule): GPIPE, ONE_F_ONE_B,
// INTERLEAVED_1F1B, ZERO_BUBBLE.
const char* PipelineScheduleName(PipelineScheduleKind kind);
StatusOr<PipelineScheduleKind> ParsePipelineScheduleKind(std::string_view name);

// One action of a device's list. kBackward is the whole backward of (chunk,
// micro_batch) for every schedule but kZeroBubble, where it is only the
// input-gradient part (the one on the critical path) and kWeightGrad the
// weight-gradient part, which nothing downstream waits for (ZB-H1).
struct PipelineAction {
  enum Kind : uint8_t { kForward, kBackward, kWeightGrad };
  Kind kind = kForward;
  int chunk = 0;
  int micro_batch = 0;
  bool operator==(const PipelineAction&) const = default;
};

struct PipelineSchedule {
  PipelineScheduleKind kind = PipelineScheduleKind::kGPipe;
  int devices = 1;        // P: cluster.pipeline_stages
  int chunks = 1;         // v: model chunks (virtual stages) per device, cluster.virtual_stages
  int micro_batches = 1;  // M: train.grad_accum
  std::vector<std::vector<PipelineAction>> actions;  // [device] -> its actions in order

  // Megatron's interleaving: device p holds model chunks p, p + P, p + 2P, ...
  // Virtual stage 0 holds the embedding, the last one the head.
  int VirtualStage(int device, int chunk) const { return chunk * devices + device; }
  int DeviceOf(int virtual_stage) const { return virtual_stage % devices; }
  int ChunkOf(int virtual_stage) const { return virtual_stage / devices; }
  int virtual_stages() const { return devices * chunks; }
};

// The table for P = `devices`, v = `chunks`, M = `micro_batches`:
//  - GPIPE: all forwards, then all backwards.
//  - ONE_F_ONE_B (PipeDream-Flush, as Megatron-LM and PyTorch's
//    Schedule1F1B): device p runs min(P - p - 1, M) warm-up forwards, then
//    one forward and one backward in turn, then the remaining backwards.
//    Needs M >= P.
//  - INTERLEAVED_1F1B (Megatron-LM's): micro-batches pass each chunk in
//    groups of P; (P - p - 1) * 2 + (v - 1) * P warm-up forwards, then 1F1B.
//    Needs v >= 2, P >= 2 and M a multiple of P.
//  - ZERO_BUBBLE (ZB-H1 of Qi et al., "Zero Bubble Pipeline Parallelism",
//    ICLR 2024, its handcrafted schedule): 1F1B's forwards and
//    input-gradient parts, each followed by the weight-gradient part of the
//    micro-batch P - 1 behind the forward, so the weight parts fill what
//    1F1B leaves idle. Needs M >= P.
// Every schedule but INTERLEAVED_1F1B needs v = 1 and works with P = 1.
// Errors name the config fields: cluster.pipeline_schedule,
// cluster.pipeline_stages, cluster.virtual_stages, train.grad_accum.
StatusOr<PipelineSchedule> MakePipelineSchedule(PipelineScheduleKind kind, int devices, int chunks, int micro_batches);

// [chunk]: the most micro-batches whose activations chunk c of `device`
// holds at once (forward run, backward not; ZERO_BUBBLE: its weight part
// not): the slots its model needs,
// micro-batch m in slot m % slots (the micro-batches in flight on a chunk
// are consecutive, since both its forwards and backwards ascend).
std::vector<int> ChunkSlots(const PipelineSchedule& schedule, int device);

// What one pass of one chunk takes. For every schedule but ZERO_BUBBLE a
// kBackward runs both parts and takes backward + weight_grad.
struct PipelineTimes {
  double forward = 1;
  double backward = 2;
  double weight_grad = 0;
};

struct PipelineSimulation {
  double makespan = 0;
  std::vector<double> busy;        // [device]
  std::vector<double> idle_share;  // [device]: 1 - busy / makespan
  // [device]: the most micro-batch-chunks at once whose forward has run and
  // whose last backward part (W for ZERO_BUBBLE, B otherwise) has not.
  std::vector<int> peak_in_flight;
  // [device]: the same with B for the last part: whole activations held.
  // Equal to peak_in_flight but for ZERO_BUBBLE, whose micro-batches between
  // B and W hold only what W reads (each layer's inputs and output gradients).
  std::vector<int> peak_activations;
};

// Runs every device's list in order, each action starting once its device
// is free and its dependencies are done; messages take no time. Errors:
// InvalidArgument for negative times; FailedPrecondition, naming the device
// and the action, if an action is out of range, duplicated or missing, or
// if the lists deadlock.
StatusOr<PipelineSimulation> SimulatePipeline(const PipelineSchedule& schedule, const PipelineTimes& times);

// The idle share of each device that theory gives, and that the tables
// here reach in SimulatePipeline: GPipe and 1F1B (P - 1) / (M + P - 1);
// interleaved (P - 1) / (v M + P - 1); ZB-H1
// (P - 1)(tF + tB - tW) / (M (tF + tB + tW) + (P - 1)(tF + tB - tW)) while
// tW <= min(tF, tB) (a heavier weight-gradient part stretches the tail).
double TheoreticalBubble(PipelineScheduleKind kind, int devices, int chunks, int micro_batches,
                         const PipelineTimes& times);

// One line per device, its actions separated by spaces: "F0 F1 B0 B1" (F
// forward, B backward, W weight-gradient part, then the micro-batch, then
// ".chunk" when v > 1: "F3.1"), for docs, logs and error messages.
std::string RenderPipelineSchedule(const PipelineSchedule& schedule);

}  // namespace herd
