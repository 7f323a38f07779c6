// NCCL collectives with one rank on one GPU (NCCL refuses two ranks on one
// device), and, on the emulated device (transport/nccl_emulation.cc), with
// several ranks: threads of this process, each its own worker of a job,
// and a forked process whose exit its peer must notice. Skipped, and
// reported as skipped, without a GPU or without NCCL in the build.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#if HERD_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>

#include "transport/coordinator.h"
#include "transport/coordinator_client.h"
#include "transport/nccl_collectives.h"
#endif

namespace herd::transport {
namespace {

#if HERD_HAVE_NCCL
// W workers of one job, as threads: each joins, makes its communicator(s)
// and runs `body(rank, client)`.
void OnWorkers(int W, const std::function<void(int, CoordinatorClient&)>& body) {
  JobConfig config;
  config.mutable_cluster()->set_sync(config::ClusterConfig::ALLREDUCE);
  config.mutable_cluster()->set_workers(W);
  CoordinatorOptions co = CoordinatorOptions::FromConfig(config);
  co.listen = "127.0.0.1:0";
  co.token = "nccl-test-token";
  auto coordinator = Coordinator::Start(co);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().message();
  std::thread run([&] { (void)(*coordinator)->Run(); });
  std::vector<std::thread> workers;
  for (int r = 0; r < W; ++r) {
    workers.emplace_back([&, r] {
      JoinOptions jo = JoinOptions::FromConfig(config);
      jo.coordinator = "127.0.0.1:" + std::to_string((*coordinator)->port());
      jo.token = co.token;
      jo.role = wire::WORKER;
      jo.rank = r;
      auto client = CoordinatorClient::Join(jo);
      ASSERT_TRUE(client.ok()) << client.status().message();
      body(r, **client);
      EXPECT_TRUE((*client)->Leave().ok());
    });
  }
  for (std::thread& t : workers) t.join();
  run.join();
}

#endif

TEST(NcclCollectives, OneRankOnOneGpu) {
#if !HERD_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  if (NcclCollectives::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  OnWorkers(1, [](int, CoordinatorClient& client) {
    auto nccl = NcclCollectives::Create(client);
    ASSERT_TRUE(nccl.ok()) << nccl.status().message();
    const int n = 1000;
    std::vector<float> host(n);
    for (int i = 0; i < n; ++i) host[i] = 0.5f * i;
    float* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    Collectives& c = **nccl;
    EXPECT_TRUE(c.Wait(c.AllReduce(dev, n, DType::kFloat32)).ok());
    EXPECT_TRUE(c.Wait(c.ReduceScatter(dev, {n})).ok());
    EXPECT_TRUE(c.Wait(c.AllGather(dev, {n})).ok());
    EXPECT_TRUE(c.Wait(c.Broadcast(dev, n, 0)).ok());
    std::vector<float> back(n);
    ASSERT_EQ(cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, host);  // one rank: every collective is the identity
    Status bad = c.Wait(c.ReduceScatter(dev, {n / 2, n / 2}));
    EXPECT_FALSE(bad.ok());
    cudaFree(dev);
  });
#endif
}

#if HERD_HAVE_NCCL && HERD_CUDA_EMULATION
// Every collective against the sums it must give: rank r's element i is
// a value whose sums in different orders differ in their last bits, and
// the emulation adds in rank order.
TEST(NcclCollectives, EmulatedRanksSumInRankOrder) {
  constexpr int W = 3;
  const int n = 300001;  // more than one chunk of the segment's slots
  auto value = [](int r, int i) { return 1.0f / (1 + i % 97) + 1e-3f * r + (r == 1 ? 1e4f : 0.0f); };
  OnWorkers(W, [&](int rank, CoordinatorClient& client) {
    auto nccl = NcclCollectives::Create(client);
    ASSERT_TRUE(nccl.ok()) << nccl.status().message();
    Collectives& c = **nccl;
    EXPECT_EQ(c.rank(), rank);
    EXPECT_EQ(c.size(), W);
    std::vector<float> host(n), sum(n);
    for (int i = 0; i < n; ++i) {
      host[i] = value(rank, i);
      sum[i] = value(0, i) + value(1, i) + value(2, i);
    }
    float* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, n * sizeof(float)), cudaSuccess);
    auto load = [&] { ASSERT_EQ(cudaMemcpy(dev, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess); };
    auto back = [&] {
      std::vector<float> out(n);
      EXPECT_EQ(cudaMemcpy(out.data(), dev, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      return out;
    };
    load();
    ASSERT_TRUE(c.Wait(c.AllReduce(dev, n, DType::kFloat32)).ok());
    EXPECT_EQ(back(), sum);
    // Unequal parts, one empty: each rank's part holds the sum, the rest its own.
    const Partition parts = {n / 2, 0, n - n / 2};
    load();
    ASSERT_TRUE(c.Wait(c.ReduceScatter(dev, parts)).ok());
    std::vector<float> out = back();
    const int64_t lo = rank == 0 ? 0 : (rank == 1 ? n / 2 : n / 2), hi = rank == 0 ? n / 2 : (rank == 1 ? n / 2 : n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], i >= lo && i < hi ? sum[i] : host[i]) << "rank " << rank << " " << i;
    // The gather brings every rank's part from its rank.
    ASSERT_TRUE(c.Wait(c.AllGather(dev, parts)).ok());
    EXPECT_EQ(back(), sum);
    load();
    ASSERT_TRUE(c.Wait(c.Broadcast(dev, n, 1)).ok());
    out = back();
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], value(1, i));
    cudaFree(dev);
  });
}

// Two communicators of one job (the grid's groups: {0, 2} and {1} of one
// name, {0, 1, 2} of another).
TEST(NcclCollectives, EmulatedGroupsOfTheGrid) {
  OnWorkers(3, [&](int rank, CoordinatorClient& client) {
    const std::vector<int> members = rank == 1 ? std::vector<int>{1} : std::vector<int>{0, 2};
    auto pair = NcclCollectives::Create(client, members, "pairs");
    ASSERT_TRUE(pair.ok()) << pair.status().message();
    auto all = NcclCollectives::Create(client, {}, "all");
    ASSERT_TRUE(all.ok()) << all.status().message();
    EXPECT_EQ((*pair)->size(), rank == 1 ? 1 : 2);
    EXPECT_EQ((*pair)->rank(), rank == 2 ? 1 : 0);
    double* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, sizeof(double)), cudaSuccess);
    const double mine = 1.5 + rank;
    ASSERT_EQ(cudaMemcpy(d, &mine, 8, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE((*pair)->Wait((*pair)->AllReduce(d, 1, DType::kFloat64)).ok());
    double got = 0;
    ASSERT_EQ(cudaMemcpy(&got, d, 8, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, rank == 1 ? 2.5 : 1.5 + 3.5);
    cudaFree(d);
  });
}

// Every rank sends to the next and receives from the one before, more
// than a mailbox's chunk, in one group: it must not deadlock, and each
// gets its neighbour's bytes.
TEST(NcclCollectives, EmulatedSendsBothWaysInOneGroup) {
  constexpr int W = 3, n = 100000;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < W; ++rank) {
    ranks.emplace_back([&, rank] {
      ncclComm_t comm;
      ASSERT_EQ(ncclCommInitRank(&comm, W, id, rank), ncclSuccess);
      std::vector<float> out(n), in(n, -1.0f);
      for (int i = 0; i < n; ++i) out[i] = rank * 1000.0f + i;
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      EXPECT_EQ(ncclSend(out.data(), n, ncclFloat32, (rank + 1) % W, comm, nullptr), ncclSuccess);
      EXPECT_EQ(ncclRecv(in.data(), n, ncclFloat32, (rank + W - 1) % W, comm, nullptr), ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
      for (int i = 0; i < n; ++i) ASSERT_EQ(in[i], ((rank + W - 1) % W) * 1000.0f + i) << "rank " << rank;
      ncclCommDestroy(comm);
    });
  }
  for (std::thread& t : ranks) t.join();
}

// A peer process that exits mid-job: the collective that waits for it
// fails in seconds with NCCL's remote error, it does not hang.
TEST(NcclCollectives, EmulatedPeerExitFailsTheCollective) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ncclComm_t comm;
    const bool joined = ncclCommInitRank(&comm, 2, id, 1) == ncclSuccess;
    float x = 1;
    if (joined) (void)ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr);
    usleep(200 * 1000);  // the peer is waiting in the next one by now
    _exit(joined && x == 3 ? 0 : 1);  // one collective done, then gone
  }
  ncclComm_t comm;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclSuccess);
  float x = 2;
  ASSERT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(x, 3);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr), ncclRemoteError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclRemoteError);
  ncclCommDestroy(comm);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
#endif

}  // namespace
}  // namespace herd::transport
