// A server or worker process for the push/pull loopback tests and the
// transport benchmark's data checks: joins a job through the coordinator,
// connects UCX, and either serves an accumulating float32 shard (server) or
// pushes a known pattern over the whole space in pieces, then pulls it back
// and checks every value exactly (worker).
//
//   pushpull_node --role server --config CFG --shard-bytes N
//   pushpull_node --role worker --config CFG --total-bytes N --pieces 1048576,4194304
//                 [--concurrency C] [--slow-ms M] [--describe]
// Common: [--rank R] [--coordinator HOST:PORT]; the token from HERD_JOB_TOKEN.
// Prints one JSON line of UCX statistics on success.
#include <chrono>
#include <cstdio>
#include <deque>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/logging.h"
#include "tools/args.h"
#include "transport/join.h"
#include "transport/push_pull.h"
#include "transport/rendezvous.h"

namespace herd {
namespace {

using transport::PeerId;

float Base(size_t i) { return static_cast<float>(i % 1021 + 1); }

void PrintStats(const char* role, int rank, transport::UcxTransport& t) {
  const transport::UcxStats s = t.stats();
  std::printf("{\"role\": \"%s\", \"rank\": %d, \"messages_received\": %llu, \"rendezvous_received\": %llu, "
              "\"eager_bytes_copied\": %llu, \"cma_bytes_read\": %llu, \"malformed_dropped\": %llu}\n",
              role, rank, static_cast<unsigned long long>(s.messages_received),
              static_cast<unsigned long long>(s.rendezvous_received),
              static_cast<unsigned long long>(s.eager_bytes_copied),
              static_cast<unsigned long long>(s.cma_bytes_read),
              static_cast<unsigned long long>(s.malformed_dropped));
  std::fflush(stdout);
}

Status RunWorker(const tools::Args& args, const transport::JoinOptions& join) {
  HERD_ASSIGN_OR_RETURN(auto total_bytes, args.GetInt("total-bytes", 64 << 20, 4));
  HERD_ASSIGN_OR_RETURN(auto concurrency, args.GetInt("concurrency", 4, 1));
  HERD_ASSIGN_OR_RETURN(auto slow_ms, args.GetInt("slow-ms", 0, 0));
  std::vector<uint64_t> pieces;
  for (const std::string& p : args.GetAll("pieces")) pieces.push_back(std::stoull(p));
  if (pieces.empty()) pieces = {1 << 20, 4 << 20};

  // Buffers first: they must outlive the client, whose destructor stops the
  // transport (and with it any transfer still writing into them).
  const uint64_t total = static_cast<uint64_t>(total_bytes);
  std::vector<float> mine(total / sizeof(float)), result(total / sizeof(float));
  HERD_ASSIGN_OR_RETURN(const transport::UcxOptions ucx, transport::DataPlaneOptions(join));
  HERD_ASSIGN_OR_RETURN(auto t, transport::UcxTransport::Create(ucx));
  auto client = std::make_unique<transport::PushPullClient>(t.get());
  HERD_ASSIGN_OR_RETURN(auto coordinator, transport::JoinJob(join, t.get(), {wire::SERVER}));
  coordinator->OnFailure([&client](const Status& st) { client->Fail(-1, st); });
  const int S = coordinator->num_servers(), W = coordinator->num_workers(), w = coordinator->rank();
  if (args.Has("describe")) {
    std::fprintf(stderr, "endpoint to server 0:\n%s\n",
                 t->DescribeEndpoint(transport::MemberPeerId(*coordinator, wire::SERVER, 0)).c_str());
  }
  const uint64_t shard = static_cast<uint64_t>(total_bytes) / S;
  const size_t n = mine.size();
  for (size_t i = 0; i < n; ++i) mine[i] = static_cast<float>(w + 1) * Base(i);
  HERD_RETURN_IF_ERROR(t->RegisterMemory(mine.data(), total_bytes));
  HERD_RETURN_IF_ERROR(t->RegisterMemory(result.data(), total_bytes));

  // A transfer that fails because another process ended reports that end.
  auto rounds = [&]() -> Status {
    for (size_t round = 0; round < pieces.size(); ++round) {
      const uint64_t piece = pieces[round];
      if (shard % piece != 0) return Status::InvalidArgument("piece size must divide each server's shard");
      // Push everything, at most `concurrency` requests in flight.
      std::deque<transport::PushPullClient::Ticket> in_flight;
      for (uint64_t off = 0; off < static_cast<uint64_t>(total_bytes); off += piece) {
        const PeerId server = transport::MemberPeerId(*coordinator, wire::SERVER, off / shard);
        in_flight.push_back(client->Push(server, transport::RequestKind::kGradients, off % shard, reinterpret_cast<const char*>(mine.data()) + off, piece));
        if (static_cast<long long>(in_flight.size()) >= concurrency) {
          HERD_RETURN_IF_ERROR(client->Wait(in_flight.front()));
          in_flight.pop_front();
        }
        if (slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
      }
      HERD_RETURN_IF_ERROR(client->WaitAll());
      HERD_RETURN_IF_ERROR(coordinator->Barrier("pushed/" + std::to_string(round), wire::WORKERS));
      // Pull it back, last piece first, in batches that complete out of order.
      std::fill(result.begin(), result.end(), -1.0f);
      for (uint64_t end = total_bytes; end > 0;) {
        for (long long c = 0; c < concurrency && end > 0; ++c) {
          end -= piece;
          const PeerId server = transport::MemberPeerId(*coordinator, wire::SERVER, end / shard);
          client->Pull(server, transport::RequestKind::kWeights, end % shard, reinterpret_cast<char*>(result.data()) + end, piece);
        }
        HERD_RETURN_IF_ERROR(client->WaitAll());
      }
      const float factor = static_cast<float>((round + 1) * W * (W + 1) / 2);
      for (size_t i = 0; i < n; ++i) {
        if (result[i] != factor * Base(i)) {
          return Status::Corruption("round " + std::to_string(round) + ": value " + std::to_string(i) + " is " +
                                    std::to_string(result[i]) + ", expected " + std::to_string(factor * Base(i)));
        }
      }
      HERD_RETURN_IF_ERROR(coordinator->Barrier("checked/" + std::to_string(round), wire::WORKERS));
      std::fprintf(stderr, "worker %d: round %zu (%llu-byte pieces): all %zu values exact\n", w, round,
                   static_cast<unsigned long long>(piece), n);
    }
    return Status::OK();
  };
  HERD_RETURN_IF_ERROR(coordinator->Explain(rounds()));
  HERD_RETURN_IF_ERROR(coordinator->Barrier("done"));
  PrintStats("worker", w, *t);
  return coordinator->Leave();
}

Status RunServer(const tools::Args& args, const transport::JoinOptions& join) {
  HERD_ASSIGN_OR_RETURN(auto shard_bytes, args.GetInt("shard-bytes", 32 << 20, 4));
  HERD_ASSIGN_OR_RETURN(const transport::UcxOptions ucx, transport::DataPlaneOptions(join));
  HERD_ASSIGN_OR_RETURN(auto t, transport::UcxTransport::Create(ucx));
  transport::AccumulatingShard shard(shard_bytes);
  HERD_RETURN_IF_ERROR(t->RegisterMemory(shard.data(), shard_bytes));
  auto server = std::make_unique<transport::PushPullServer>(t.get(), &shard);
  HERD_ASSIGN_OR_RETURN(auto coordinator, transport::JoinJob(join, t.get(), {wire::WORKER}));
  HERD_RETURN_IF_ERROR(coordinator->Barrier("done"));
  PrintStats("server", coordinator->rank(), *t);
  return coordinator->Leave();
}

}  // namespace
}  // namespace herd

int main(int argc, char** argv) {
  using namespace herd;
  InitLogging(argv[0]);
  tools::Args args({"role", "config", "rank", "coordinator", "shard-bytes", "total-bytes", "pieces", "concurrency",
                    "slow-ms", "set"},
                   {"describe"});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st);
  auto config = LoadJobConfig(args.Get("config"), args.GetAll("set"));
  if (!config.ok()) return ReportError(config.status());
  const std::string role = args.Get("role");
  if (role != "server" && role != "worker") return ReportError(Status::InvalidArgument("--role server|worker"));
  auto joined = transport::JoinOptions::ForProcess(*config, role == "server" ? wire::SERVER : wire::WORKER,
                                                   args.Get("rank"), args.Get("coordinator"), "");
  if (!joined.ok()) return ReportError(joined.status());
  const transport::JoinOptions& join = *joined;
  st = role == "server" ? RunServer(args, join) : RunWorker(args, join);
  if (!st.ok()) return ReportError(st);
  return 0;
}
