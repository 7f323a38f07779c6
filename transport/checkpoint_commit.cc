#include "transport/checkpoint_commit.h"

#include <glog/logging.h>
#include <pthread.h>
#include <sched.h>

#include <cstring>

#include "common/trace.h"
#include "model/checkpoint_commit.h"
#include "model/checkpoint_format.h"
#include "transport/exchanges.h"
#include "transport/join.h"

namespace herd::transport {
namespace {

// One phase's vote: everyone reports how its part went; OK when all
// succeeded, else the first failure, naming its process. `lost`: set when
// the share of one of `writers` (every voter when empty) is empty (a
// member lost since; only a job of regions goes on without one).
// `named`: the voters, when not the whole scope (Gather's).
Status AllSucceeded(CoordinatorClient& client, const Exchange<wire::CheckpointVote>& vote, const Status& mine,
                    const Voters& named, const std::vector<bool>& writers = {}, bool* lost = nullptr) {
  wire::CheckpointVote my_vote;
  my_vote.set_voted(true);
  if (!mine.ok()) my_vote.set_error(mine.message());
  HERD_ASSIGN_OR_RETURN(std::vector<wire::CheckpointVote> all, Gather(client, vote, my_vote, named));
  // Scope order is membership order: servers, then workers.
  const size_t first = vote.scope == wire::WORKERS ? client.num_servers() : 0;
  if (!mine.ok()) return mine;  // this process's own failure, not a consequence
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].has_error()) return Status::Aborted(DescribeMember(client.members()[first + i]) + ": " + all[i].error());
    if (!all[i].voted() && lost != nullptr && (writers.empty() || (i < writers.size() && writers[i]))) *lost = true;
  }
  return Status::OK();
}

}  // namespace

Status CommitCheckpoint(CoordinatorClient* client, const std::string& step_dir, int64_t step,
                        const config::JobConfig& config, bool committer, const std::vector<std::string>& parts,
                        const std::function<Status()>& write_parts, wire::Scope voters,
                        const std::vector<bool>& writers, const Voters& named) {
  if (client == nullptr) {
    trace::Span span("checkpoint write", "checkpoint", {"step", step});
    return CommitOneProcessCheckpoint(step_dir, step, config, parts, write_parts);
  }
  Status part;
  {
    trace::Span span("checkpoint write", "checkpoint", {"step", step});
    part = BeginCheckpointPart(step_dir);
    if (part.ok() && committer) part = WriteConfigPart(step_dir, config);
    if (part.ok()) part = write_parts();
  }
  trace::Span span("checkpoint vote", "checkpoint", {"step", step});
  const std::string where = "checkpoint " + step_dir + ": ";
  bool lost = false;
  HERD_RETURN_IF_ERROR(AllSucceeded(*client, PartsWrittenVote(step, voters), part, named, writers, &lost).WithContext(where));
  if (lost) {
    // Every voter saw the same shares: none writes the manifest, so the
    // step is never loaded, and the job goes on.
    LOG(WARNING) << where << "abandoned: a process that writes part of it was lost (a job of regions went on "
                 << "without its region)";
    return Status::OK();
  }
  Status committed;
  if (committer) committed = WriteManifest(step_dir, step, parts);
  return AllSucceeded(*client, CommittedVote(step, voters), committed, named).WithContext(where);
}

BackgroundCommit::~BackgroundCommit() { Wait(); }

void BackgroundCommit::Start(std::function<Status()> commit) {
  CHECK(!thread_.joinable()) << "a checkpoint commit is already in progress";
  thread_ = std::thread([this, commit = std::move(commit)] {
    // Checksumming and writing take cores only when training leaves one
    // idle (SCHED_IDLE), so that they do not slow the step.
    trace::NameThread("background checkpoint");
    const sched_param none{};
    if (const int err = ::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &none); err != 0) {
      LOG(WARNING) << "checkpoint writer: cannot lower its priority: " << std::strerror(err);
    }
    result_ = commit();
  });
}

Status BackgroundCommit::Wait() {
  if (!thread_.joinable()) return result_;
  // Training waits for it now: it runs as any thread does, or it could
  // starve behind other work on the cores. (The handle stays valid until
  // the join, whether or not the thread has ended.)
  const sched_param none{};
  ::pthread_setschedparam(thread_.native_handle(), SCHED_OTHER, &none);
  thread_.join();
  return result_;
}

}  // namespace herd::transport
