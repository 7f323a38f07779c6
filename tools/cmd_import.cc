// herd import DIR --out CHECKPOINT [--step N]
// Reads a HuggingFace Llama directory (F32, BF16 or F16 tensors) and writes a
// new herd checkpoint step directory CHECKPOINT: a job config whose model is
// the imported one (everything else default), one shard holding the whole
// flat parameter space, AdamW moments zero, optimizer step N (default 0).
//
// The step directory is built under a temporary sibling name and renamed
// into place, so a failure leaves nothing at CHECKPOINT.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/config.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "model/checkpoint_commit.h"
#include "model/checkpoint_format.h"
#include "model/hf_io.h"
#include "model/param_layout.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace herd::tools {
namespace {

Status Import(const std::string& hf_dir, std::string out, int64_t step) {
  while (out.size() > 1 && out.ends_with('/')) out.pop_back();
  if (PathExists(out)) {
    return Status::InvalidArgument(out + ": already exists; import writes a new checkpoint directory "
                                   "(choose another --out)");
  }
  if (!IsHfDirectory(hf_dir)) {
    return Status::InvalidArgument(hf_dir + ": not a HuggingFace model directory (no config.json)");
  }
  HERD_ASSIGN_OR_RETURN(HfModel hf, ReadHfDirectory(hf_dir));

  config::JobConfig job;
  *job.mutable_model() = hf.model;
  // The checkpoint's config is a complete job: its train.seq_len (a
  // default here) stays within the model's positions.
  const int max_positions = hf.model.max_position_embeddings();
  if (max_positions > 0 && job.train().seq_len() > max_positions) job.mutable_train()->set_seq_len(max_positions);
  HERD_RETURN_IF_ERROR(ValidateJobConfig(job).WithContext(hf_dir + ": "));
  const ParamLayout layout(LlamaShape::FromConfig(hf.model));
  ShardState shard;
  shard.begin = 0;
  shard.end = layout.size();
  shard.step = step;
  shard.weights = std::move(hf.params);
  shard.m.assign(layout.size(), 0.0f);
  shard.v.assign(layout.size(), 0.0f);

  HERD_RETURN_IF_ERROR(WriteNewDirectory(out, [&](const std::string& tmp) {
    return WriteSingleShardCheckpoint(tmp, job, shard.view());
  }));
  std::printf("imported %s (%lld parameters, %s embeddings) into checkpoint %s at step %lld\n", hf_dir.c_str(),
              static_cast<long long>(layout.num_parameters()), hf.model.tie_word_embeddings() ? "tied" : "untied",
              out.c_str(), static_cast<long long>(step));
  return Status::OK();
}

}  // namespace

int RunImport(int argc, char** argv) {
  Args args({"out", "step"}, {});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("import: "));
  if (args.positional().size() != 1 || !args.Has("out") || args.Get("out").empty()) {
    return ReportError(Status::InvalidArgument("usage: herd import DIR --out CHECKPOINT [--step N]"));
  }
  auto step = args.GetInt("step", 0, 0);
  if (!step.ok()) return ReportError(step.status());
  st = Import(args.positional()[0], args.Get("out"), *step);
  return st.ok() ? 0 : ReportError(st);
}

}  // namespace herd::tools
