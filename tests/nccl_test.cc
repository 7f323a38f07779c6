// NCCL collectives with one rank on one GPU (NCCL refuses two ranks on one
// device; multi-rank behaviour is the ring's, tested in
// collectives_test.cc). Skipped, and reported as skipped, without a GPU or
// without NCCL in the build.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#if HERD_HAVE_NCCL
#include <cuda_runtime.h>

#include "transport/coordinator.h"
#include "transport/coordinator_client.h"
#include "transport/nccl_collectives.h"
#endif

namespace herd::transport {
namespace {

TEST(NcclCollectives, OneRankOnOneGpu) {
#if !HERD_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  if (NcclCollectives::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  JobConfig config;
  config.mutable_cluster()->set_sync(config::ClusterConfig::ALLREDUCE);
  config.mutable_cluster()->set_workers(1);
  CoordinatorOptions co = CoordinatorOptions::FromConfig(config);
  co.listen = "127.0.0.1:0";
  co.token = "nccl-test-token";
  auto coordinator = Coordinator::Start(co);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().message();
  std::thread run([&] { (void)(*coordinator)->Run(); });
  JoinOptions jo = JoinOptions::FromConfig(config);
  jo.coordinator = "127.0.0.1:" + std::to_string((*coordinator)->port());
  jo.token = co.token;
  jo.role = wire::WORKER;
  jo.rank = 0;
  auto client = CoordinatorClient::Join(jo);
  ASSERT_TRUE(client.ok()) << client.status().message();
  {
    auto nccl = NcclCollectives::Create(**client);
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
  }
  EXPECT_TRUE((*client)->Leave().ok());
  client->reset();
  run.join();
#endif
}

}  // namespace
}  // namespace herd::transport
