// The two-phase commit of a checkpoint (its format and promise:
// model/checkpoint_format.h). Every process of a job writes its own parts;
// the coordinator collects a vote; only when every part succeeded does the
// committer write the manifest that makes the step loadable.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "proto/herd.pb.h"
#include "transport/coordinator_client.h"

namespace herd::transport {

// Commits the checkpoint of `step` in `step_dir`. Each process creates the
// step directory and writes its parts (`write_parts`; the committer also
// the job's config), everyone votes through the coordinator, and only when
// every part succeeded does the committer write the manifest listing
// `parts`; a second vote tells everyone whether it did. A step directory
// without a manifest is never loaded, so a failure anywhere leaves no
// checkpoint that could be. Errors name the step directory and the first
// process that failed (this one's own first).
//
// With no `client` the job is this one process: it writes every part and
// the manifest itself, without votes, whatever `committer` says, and
// returns its first error as it is (model/checkpoint_commit.h's
// CommitOneProcessCheckpoint). `voters`: the processes that write parts and
// vote (an elastic job's servers, or a job of regions', write the
// workers' parts too). A voter lost since the job formed has an empty
// share: when it is one of `writers` ([i]: voter i in scope order; empty:
// every voter), its parts are missing, and every voter abandons the
// checkpoint alike (no manifest; OK is returned); the others are no
// concern (a job of regions' servers of regions lost before). `named`:
// the voters by member index, when they are not every member of `voters`
// that takes part (a job of regions' servers, as regions come and go).
Status CommitCheckpoint(CoordinatorClient* client, const std::string& step_dir, int64_t step,
                        const config::JobConfig& config, bool committer, const std::vector<std::string>& parts,
                        const std::function<Status()>& write_parts, wire::Scope voters = wire::EVERYONE,
                        const std::vector<bool>& writers = {}, const Voters& named = {});

// Checkpoint commits on a thread of their own, one at a time, so that
// training goes on while a checkpoint is written. Whatever a commit reads
// must stay as it was until it ends: the caller hands it a snapshot.
// Destroying it waits for the commit in progress; it must go before the
// CoordinatorClient its commits vote through.
class BackgroundCommit {
 public:
  BackgroundCommit() = default;
  ~BackgroundCommit();
  BackgroundCommit(const BackgroundCommit&) = delete;
  BackgroundCommit& operator=(const BackgroundCommit&) = delete;

  // Starts `commit` (a CommitCheckpoint call) on the thread. REQUIRES: no
  // commit in progress (Wait first: a checkpoint never overtakes the one
  // before it).
  void Start(std::function<Status()> commit);
  // Waits for the commit in progress, if any, raising it from idle to
  // normal priority meanwhile; returns how the last one ended (OK when none
  // has run).
  Status Wait();

 private:
  std::thread thread_;
  Status result_;  // written by thread_, read after joining it
};

}  // namespace herd::transport
