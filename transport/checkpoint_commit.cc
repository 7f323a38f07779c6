#include "transport/checkpoint_commit.h"

#include "model/checkpoint_commit.h"
#include "model/checkpoint_format.h"
#include "transport/join.h"

namespace herd::transport {
namespace {

// One phase's vote: everyone reports how its part went; OK when all
// succeeded, else the first failure, naming its process.
Status AllSucceeded(CoordinatorClient& client, const std::string& name, const Status& mine) {
  HERD_ASSIGN_OR_RETURN(std::vector<std::string> all, client.AllGather(name, mine.ok() ? "" : mine.message()));
  if (!mine.ok()) return mine;  // this process's own failure, not a consequence
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].empty()) return Status::Aborted(DescribeMember(client.members()[i]) + ": " + all[i]);
  }
  return Status::OK();
}

}  // namespace

Status CommitCheckpoint(CoordinatorClient* client, const std::string& step_dir, int64_t step,
                        const config::JobConfig& config, bool committer, const std::vector<std::string>& parts,
                        const std::function<Status()>& write_parts) {
  if (client == nullptr) return CommitOneProcessCheckpoint(step_dir, step, config, parts, write_parts);
  Status part = BeginCheckpointPart(step_dir);
  if (part.ok() && committer) part = WriteConfigPart(step_dir, config);
  if (part.ok()) part = write_parts();
  const std::string where = "checkpoint " + step_dir + ": ";
  HERD_RETURN_IF_ERROR(AllSucceeded(*client, "herd/checkpoint/" + std::to_string(step), part).WithContext(where));
  Status committed;
  if (committer) committed = WriteManifest(step_dir, step, parts);
  return AllSucceeded(*client, "herd/committed/" + std::to_string(step), committed).WithContext(where);
}

}  // namespace herd::transport
