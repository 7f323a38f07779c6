#include "sharding/pipeline_schedule.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"

namespace herd {
namespace {

using Kind = PipelineScheduleKind;

constexpr std::pair<Kind, const char*> kNames[] = {
    {Kind::kGPipe, "GPIPE"},
    {Kind::kOneFOneB, "ONE_F_ONE_B"},
    {Kind::kInterleaved1F1B, "INTERLEAVED_1F1B"},
    {Kind::kZeroBubble, "ZERO_BUBBLE"},
};

std::string Count(int n, const char* one, const char* many) { return std::to_string(n) + " " + (n == 1 ? one : many); }

Status CheckShape(Kind kind, int P, int v, int M) {
  const std::string schedule = std::string("cluster.pipeline_schedule ") + PipelineScheduleName(kind);
  if (P < 1) return Status::InvalidArgument("cluster.pipeline_stages must be >= 1 (got " + std::to_string(P) + ")");
  if (v < 1) return Status::InvalidArgument("cluster.virtual_stages must be >= 1 (got " + std::to_string(v) + ")");
  if (M < 1) return Status::InvalidArgument("train.grad_accum must be >= 1 (got " + std::to_string(M) + ")");
  if (const int64_t passes = int64_t{P} * v * M; passes > kMaxPipelinePasses) {
    return Status::InvalidArgument("cluster.pipeline_stages " + std::to_string(P) + " x cluster.virtual_stages " +
                                   std::to_string(v) + " x train.grad_accum " + std::to_string(M) + " = " +
                                   std::to_string(passes) + " passes, more than the " +
                                   std::to_string(kMaxPipelinePasses) + " a pipeline schedule may hold");
  }
  const std::string got =
      " (got " + Count(M, "micro-batch", "micro-batches") + " for " + Count(P, "stage", "stages") + ")";
  if (kind != Kind::kInterleaved1F1B) {
    if (v > 1) {
      return Status::InvalidArgument("cluster.virtual_stages " + std::to_string(v) +
                                     " needs cluster.pipeline_schedule INTERLEAVED_1F1B (got " +
                                     PipelineScheduleName(kind) + ")");
    }
    // With fewer micro-batches than stages 1F1B never reaches its steady state and is GPipe under another name.
    if (kind != Kind::kGPipe && M < P) {
      return Status::InvalidArgument(schedule + " needs train.grad_accum >= cluster.pipeline_stages" + got);
    }
    return Status::OK();
  }
  if (v < 2) {
    return Status::InvalidArgument(schedule + " needs cluster.virtual_stages >= 2 (got " + std::to_string(v) + ")");
  }
  if (P < 2) {
    return Status::InvalidArgument(schedule + " needs cluster.pipeline_stages >= 2 (got " + std::to_string(P) + ")");
  }
  // Micro-batches pass each chunk in groups of P; a ragged last group would need Megatron's newer bookkeeping.
  if (M % P != 0) {
    return Status::InvalidArgument(schedule + " needs train.grad_accum to be a multiple of cluster.pipeline_stages" +
                                   got);
  }
  return Status::OK();
}

PipelineAction F(int chunk, int m) { return {PipelineAction::kForward, chunk, m}; }
PipelineAction B(int chunk, int m) { return {PipelineAction::kBackward, chunk, m}; }
PipelineAction W(int chunk, int m) { return {PipelineAction::kWeightGrad, chunk, m}; }

void GPipe(PipelineSchedule& s) {
  for (auto& list : s.actions) {
    for (int m = 0; m < s.micro_batches; ++m) list.push_back(F(0, m));
    for (int m = 0; m < s.micro_batches; ++m) list.push_back(B(0, m));
  }
}

// 1F1B on device p, in steps x = 0, 1, ...: forward x, then the backward of micro-batch x - (P - p - 1), whose
// gradient takes that many steps to come back from the last stage. That makes P - p - 1 warm-up forwards, then one
// forward and one backward in turn, then the backwards left, with at most P - p forwards awaiting their backward.
// `split` (ZB-H1, the paper's handcrafted schedule) ends each step with the weight-gradient part of micro-batch
// x - (P - 1), the same lag on every device, so that no device holds, counting the parts owed, more micro-batches
// than 1F1B's device 0. The input-gradient parts, free of the weight work, come back up sooner, and the parts owed
// fill 1F1B's cooldown: each device idles (P - 1)(tF + tB - tW) where 1F1B's idles (P - 1)(tF + tB + tW).
void OneFOneB(PipelineSchedule& s, bool split) {
  const int P = s.devices, M = s.micro_batches;
  for (int p = 0; p < P; ++p) {
    auto& list = s.actions[p];
    for (int x = 0; x < M + P - 1; ++x) {
      if (x < M) list.push_back(F(0, x));
      const int b = x - (P - p - 1), w = x - (P - 1);
      if (b >= 0 && b < M) list.push_back(B(0, b));
      if (split && w >= 0 && w < M) list.push_back(W(0, w));
    }
  }
}

// Megatron-LM's interleaved order: the k-th forward of a device is micro-batch `micro_batch(k)` of chunk
// (k / P) % v, its k-th backward the same micro-batch of chunk v - 1 - (k / P) % v, so that micro-batches pass
// each chunk in groups of P. Warm-up forwards enough for the first backward to have come round, then 1F1B.
void Interleaved(PipelineSchedule& s) {
  const int P = s.devices, v = s.chunks, total = s.micro_batches * s.chunks;
  auto micro_batch = [&](int k) { return (k / (P * v)) * P + k % P; };
  auto fwd = [&](int k) { return F((k / P) % v, micro_batch(k)); };
  auto bwd = [&](int k) { return B(v - 1 - (k / P) % v, micro_batch(k)); };
  for (int p = 0; p < P; ++p) {
    auto& list = s.actions[p];
    const int warmup = std::min((P - p - 1) * 2 + (v - 1) * P, total);
    for (int k = 0; k < warmup; ++k) list.push_back(fwd(k));
    for (int k = 0; k < total - warmup; ++k) {
      list.push_back(fwd(warmup + k));
      list.push_back(bwd(k));
    }
    for (int k = total - warmup; k < total; ++k) list.push_back(bwd(k));
  }
}

std::string ActionName(const PipelineAction& a, int chunks) {
  static constexpr char kLetter[] = {'F', 'B', 'W'};
  std::string s(1, a.kind <= PipelineAction::kWeightGrad ? kLetter[a.kind] : '?');
  s += std::to_string(a.micro_batch);
  if (chunks > 1) {
    s += '.';
    s += std::to_string(a.chunk);
  }
  return s;
}

}  // namespace

const char* PipelineScheduleName(PipelineScheduleKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "UNKNOWN";
}

StatusOr<PipelineScheduleKind> ParsePipelineScheduleKind(std::string_view name) {
  for (const auto& [k, n] : kNames) {
    if (name == n) return k;
  }
  return Status::InvalidArgument("cluster.pipeline_schedule: unknown schedule \"" + std::string(name) +
                                 "\" (GPIPE, ONE_F_ONE_B, INTERLEAVED_1F1B or ZERO_BUBBLE)");
}

StatusOr<PipelineSchedule> MakePipelineSchedule(PipelineScheduleKind kind, int devices, int chunks, int micro_batches) {
  HERD_RETURN_IF_ERROR(CheckShape(kind, devices, chunks, micro_batches));
  PipelineSchedule s;
  s.kind = kind;
  s.devices = devices;
  s.chunks = chunks;
  s.micro_batches = micro_batches;
  s.actions.resize(devices);
  switch (kind) {
    case Kind::kGPipe:
      GPipe(s);
      break;
    case Kind::kOneFOneB:
      OneFOneB(s, /*split=*/false);
      break;
    case Kind::kInterleaved1F1B:
      Interleaved(s);
      break;
    case Kind::kZeroBubble:
      OneFOneB(s, /*split=*/true);
      break;
  }
  return s;
}

std::vector<int> ChunkSlots(const PipelineSchedule& schedule, int device) {
  // A split backward's weight part still reads the micro-batch's
  // activations: they are held until it has run.
  const PipelineAction::Kind last = schedule.kind == PipelineScheduleKind::kZeroBubble ? PipelineAction::kWeightGrad
                                                                                      : PipelineAction::kBackward;
  std::vector<int> in_flight(schedule.chunks, 0), most(schedule.chunks, 1);
  for (const PipelineAction& a : schedule.actions[device]) {
    if (a.kind == PipelineAction::kForward) {
      most[a.chunk] = std::max(most[a.chunk], ++in_flight[a.chunk]);
    } else if (a.kind == last) {
      --in_flight[a.chunk];
    }
  }
  return most;
}

namespace {

// Where (kind, virtual stage, micro-batch) of `a` on `device` sits in a
// table of every action of the schedule.
int ActionIndex(const PipelineSchedule& s, const PipelineAction& a, int device) {
  return (static_cast<int>(a.kind) * s.virtual_stages() + s.VirtualStage(device, a.chunk)) * s.micro_batches +
         a.micro_batch;
}

// A schedule every device can run: its counts >= 1, a list per device,
// and each device's actions those of its chunks, each once.
Status CheckActionLists(const PipelineSchedule& s, const std::string& name) {
  const int P = s.devices, v = s.chunks, M = s.micro_batches;
  if (P < 1 || v < 1 || M < 1) {
    return Status::FailedPrecondition(name + ": needs devices, chunks and micro-batches >= 1 (got " +
                                      std::to_string(P) + ", " + std::to_string(v) + ", " + std::to_string(M) + ")");
  }
  if (static_cast<int>(s.actions.size()) != P) {
    return Status::FailedPrecondition(name + ": " + Count(static_cast<int>(s.actions.size()), "list", "lists") +
                                      " for " + Count(P, "device", "devices"));
  }
  const bool split = s.kind == Kind::kZeroBubble;
  const int V = s.virtual_stages();
  auto index = [&](const PipelineAction& a, int device) { return ActionIndex(s, a, device); };
  std::vector<char> listed(3 * V * M, 0);
  auto where = [&](int device, const PipelineAction& a) {
    return "device " + std::to_string(device) + " " + ActionName(a, v);
  };
  for (int p = 0; p < P; ++p) {
    for (const PipelineAction& a : s.actions[p]) {
      if (a.kind > PipelineAction::kWeightGrad || a.chunk < 0 || a.chunk >= v || a.micro_batch < 0 ||
          a.micro_batch >= M || (a.kind == PipelineAction::kWeightGrad && !split)) {
        return Status::FailedPrecondition(name + ": " + where(p, a) + " is not an action of this schedule");
      }
      if (listed[index(a, p)]++) return Status::FailedPrecondition(name + ": " + where(p, a) + " runs twice");
    }
  }
  for (int p = 0; p < P; ++p) {
    for (int c = 0; c < v; ++c) {
      for (int m = 0; m < M; ++m) {
        for (const PipelineAction& a : {F(c, m), B(c, m), W(c, m)}) {
          if (a.kind == PipelineAction::kWeightGrad && !split) continue;
          if (!listed[index(a, p)]) return Status::FailedPrecondition(name + ": " + where(p, a) + " never runs");
        }
      }
    }
  }
  return Status::OK();
}

// How long `a` takes; without a split backward, B includes W.
double ActionCost(const PipelineAction& a, const PipelineTimes& t, bool split) {
  switch (a.kind) {
    case PipelineAction::kForward:
      return t.forward;
    case PipelineAction::kBackward:
      return split ? t.backward : t.backward + t.weight_grad;
    case PipelineAction::kWeightGrad:
      return t.weight_grad;
  }
  return 0.0;
}

// Every device that has not run its whole list ("device 1 waits at F0.2"):
// the first need not be where the fault lies.
std::string StuckDevices(const PipelineSchedule& s, const std::vector<size_t>& next) {
  std::string stuck;
  for (int p = 0; p < s.devices; ++p) {
    if (next[p] < s.actions[p].size()) {
      stuck += (stuck.empty() ? "device " : ", device ") + std::to_string(p) + " waits at " +
               ActionName(s.actions[p][next[p]], s.chunks);
    }
  }
  return stuck;
}

}  // namespace

StatusOr<PipelineSimulation> SimulatePipeline(const PipelineSchedule& s, const PipelineTimes& t) {
  if (t.forward < 0 || t.backward < 0 || t.weight_grad < 0) {
    return Status::InvalidArgument("pipeline times must be >= 0 (forward " + std::to_string(t.forward) + ", backward " +
                                   std::to_string(t.backward) + ", weight_grad " + std::to_string(t.weight_grad) + ")");
  }
  const std::string name = std::string("pipeline schedule ") + PipelineScheduleName(s.kind);
  HERD_RETURN_IF_ERROR(CheckActionLists(s, name));
  const int P = s.devices, M = s.micro_batches;
  const bool split = s.kind == Kind::kZeroBubble;
  const int V = s.virtual_stages();
  // Finish time of (kind, virtual stage, micro-batch); negative: not run yet.
  auto index = [&](const PipelineAction& a, int device) { return ActionIndex(s, a, device); };
  std::vector<double> end(3 * V * M, -1);

  // When the inputs of `a` on `device` are ready, or a negative time if some are not yet.
  auto ready = [&](int device, const PipelineAction& a) {
    const int vs = s.VirtualStage(device, a.chunk);
    auto done = [&](PipelineAction::Kind kind, int stage) {
      return end[(static_cast<int>(kind) * V + stage) * M + a.micro_batch];
    };
    double at = 0;
    auto need = [&](double e) { at = (at < 0 || e < 0) ? -1 : std::max(at, e); };
    switch (a.kind) {
      case PipelineAction::kForward:
        if (vs > 0) need(done(PipelineAction::kForward, vs - 1));
        break;
      case PipelineAction::kBackward:
        need(done(PipelineAction::kForward, vs));
        if (vs < V - 1) need(done(PipelineAction::kBackward, vs + 1));
        break;
      case PipelineAction::kWeightGrad:
        need(done(PipelineAction::kBackward, vs));
        break;
    }
    return at;
  };

  PipelineSimulation sim;
  sim.busy.assign(P, 0);
  sim.peak_in_flight.assign(P, 0);
  sim.peak_activations.assign(P, 0);
  std::vector<double> free_at(P, 0);
  std::vector<size_t> next(P, 0);
  std::vector<int> in_flight(P, 0), activations(P, 0);
  const PipelineAction::Kind last_part = split ? PipelineAction::kWeightGrad : PipelineAction::kBackward;
  // Each sweep runs every action whose inputs are done; finish times do not depend on the sweep order, since a
  // device runs its list in order and messages take no time.
  for (bool moved = true; moved;) {
    moved = false;
    for (int p = 0; p < P; ++p) {
      const auto& list = s.actions[p];
      for (; next[p] < list.size(); ++next[p]) {
        const PipelineAction& a = list[next[p]];
        const double inputs = ready(p, a);
        if (inputs < 0) break;
        const double d = ActionCost(a, t, split);
        free_at[p] = std::max(free_at[p], inputs) + d;
        end[index(a, p)] = free_at[p];
        sim.busy[p] += d;
        if (a.kind == PipelineAction::kForward) {
          sim.peak_in_flight[p] = std::max(sim.peak_in_flight[p], ++in_flight[p]);
          sim.peak_activations[p] = std::max(sim.peak_activations[p], ++activations[p]);
        }
        if (a.kind == PipelineAction::kBackward) --activations[p];
        if (a.kind == last_part) --in_flight[p];
        moved = true;
      }
    }
  }
  if (const std::string stuck = StuckDevices(s, next); !stuck.empty()) {
    return Status::FailedPrecondition(name + " deadlocks: " + stuck);
  }
  sim.makespan = *std::max_element(free_at.begin(), free_at.end());
  sim.idle_share.resize(P);
  for (int p = 0; p < P; ++p) sim.idle_share[p] = sim.makespan > 0 ? 1 - sim.busy[p] / sim.makespan : 0;
  return sim;
}

double TheoreticalBubble(PipelineScheduleKind kind, int devices, int chunks, int micro_batches,
                         const PipelineTimes& t) {
  const double P = devices, v = chunks, M = micro_batches;
  switch (kind) {
    case Kind::kGPipe:
    case Kind::kOneFOneB:
      return (P - 1) / (M + P - 1);
    case Kind::kInterleaved1F1B:
      return (P - 1) / (v * M + P - 1);
    case Kind::kZeroBubble: {
      const double idle = (P - 1) * (t.forward + t.backward - t.weight_grad);
      const double total = M * (t.forward + t.backward + t.weight_grad) + idle;
      return total > 0 ? idle / total : 0;
    }
  }
  return 0;
}

std::string RenderPipelineSchedule(const PipelineSchedule& s) {
  std::string out;
  for (const auto& list : s.actions) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out += ' ';
      out += ActionName(list[i], s.chunks);
    }
    out += '\n';
  }
  return out;
}

}  // namespace herd
