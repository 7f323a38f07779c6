// herd bench allreduce --rank R --world W --coordinator HOST:PORT [--sizes BYTES,...] [--iters N]
//                      [--chunk-kb K]
//   One rank of the ring all-reduce benchmark: joins the coordinator (token
//   from HERD_JOB_TOKEN / HERD_JOB_TOKEN_FILE) as a worker of a W-worker
//   ALLREDUCE job, then times sum all-reduces of fp32 buffers of each size.
//   Rank 0 prints one JSON line per size: median time, algbw and busbw
//   (algbw·2(W−1)/W, as nccl-tests define it), in GB/s of 1e9 bytes.
//   bench/allreduce_bandwidth.py starts the ranks and runs PyTorch's gloo
//   all_reduce next to them.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/strings.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "transport/join.h"
#include "transport/rendezvous.h"
#include "transport/ring_collectives.h"

namespace herd::tools {
namespace {

Status BenchAllReduce(int argc, char** argv) {
  Args args({"rank", "world", "coordinator", "sizes", "iters", "chunk-kb"}, {});
  HERD_RETURN_IF_ERROR(args.Parse(argc, argv).WithContext("bench allreduce: "));
  HERD_ASSIGN_OR_RETURN(int64_t rank, args.GetInt("rank", -1, 0));
  HERD_ASSIGN_OR_RETURN(int64_t world, args.GetInt("world", 2, 1));
  HERD_ASSIGN_OR_RETURN(int64_t iters, args.GetInt("iters", 10, 1));
  HERD_ASSIGN_OR_RETURN(int64_t chunk_kb, args.GetInt("chunk-kb", 512, 1));
  if (!args.Has("coordinator") || rank < 0) {
    return Status::InvalidArgument(
        "usage: herd bench allreduce --rank R --world W --coordinator HOST:PORT "
        "[--sizes BYTES,...] [--iters N] [--chunk-kb K]");
  }
  std::vector<int64_t> sizes;
  for (const std::string& s :
       Split(args.Get("sizes").empty() ? "1MiB,4MiB,16MiB,64MiB,256MiB" : args.Get("sizes"), ',')) {
    const int64_t bytes = ParseByteSize(s);
    if (bytes < 4) return Status::InvalidArgument("--sizes: '" + s + "' is not a size of at least 4 bytes");
    sizes.push_back(bytes / 4 * 4);
  }
  JobConfig config;
  config.mutable_cluster()->set_sync(config::ClusterConfig::ALLREDUCE);
  config.mutable_cluster()->set_workers(static_cast<int>(world));
  HERD_ASSIGN_OR_RETURN(transport::JoinOptions join,
                        transport::JoinOptions::ForProcess(config, wire::WORKER, std::to_string(rank),
                                                           args.Get("coordinator"), ""));

  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<float> buffer(largest / 4, 1.0f);
  HERD_ASSIGN_OR_RETURN(auto transport, transport::UcxTransport::Create({}));
  std::unique_ptr<transport::RingCollectives> ring;
  auto prepare = [&](transport::CoordinatorClient& client) -> Status {
    std::vector<transport::PeerId> peers;
    for (int r = 0; r < client.num_workers(); ++r) peers.push_back(transport::MemberPeerId(client, wire::WORKER, r));
    ring = std::make_unique<transport::RingCollectives>(transport.get(), client.rank(), peers, chunk_kb << 10);
    return Status::OK();
  };
  HERD_ASSIGN_OR_RETURN(auto client, transport::JoinJob(join, transport.get(), {wire::WORKER}, prepare));
  client->OnFailure([&ring](const Status& st) { ring->Fail(st); });
  HERD_RETURN_IF_ERROR(transport->RegisterMemory(buffer.data(), buffer.size() * sizeof(float)));
  float token_value = 0;
  auto sync = [&] { return ring->Wait(ring->AllReduce(&token_value, 1, transport::DType::kFloat32)); };
  for (int64_t bytes : sizes) {
    const int64_t n = bytes / 4;
    for (int w = 0; w < 2; ++w)
      HERD_RETURN_IF_ERROR(ring->Wait(ring->AllReduce(buffer.data(), n, transport::DType::kFloat32)));
    std::vector<double> times;
    for (int64_t i = 0; i < iters; ++i) {
      HERD_RETURN_IF_ERROR(sync());
      Stopwatch sw;
      HERD_RETURN_IF_ERROR(ring->Wait(ring->AllReduce(buffer.data(), n, transport::DType::kFloat32)));
      times.push_back(sw.Seconds());
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    const double algbw = bytes / t / 1e9, busbw = algbw * 2.0 * (world - 1) / world;
    if (rank == 0) {
      std::printf(
          "{\"bench\": \"ring_allreduce\", \"ranks\": %lld, \"bytes\": %lld, \"time_s\": %.6g, "
          "\"algbw_GBps\": %.4g, \"busbw_GBps\": %.4g, \"chunk_kb\": %lld, \"iters\": %lld}\n",
          static_cast<long long>(world), static_cast<long long>(bytes), t, algbw, busbw,
          static_cast<long long>(chunk_kb), static_cast<long long>(iters));
      std::fflush(stdout);
    }
  }
  HERD_RETURN_IF_ERROR(client->Barrier("bench/done"));
  HERD_RETURN_IF_ERROR(client->Leave());
  ring.reset();
  return Status::OK();
}

}  // namespace

int RunBenchAllReduce(int argc, char** argv) {
  Status st = BenchAllReduce(argc, argv);
  return st.ok() ? 0 : ReportError(st);
}

}  // namespace herd::tools
