// The sync strategies on their own, every process of a job in one test
// process, each with its own UCX worker and thread, over the real
// transport: one process (worker/local_sync), all-reduce (worker/collective_sync, DDP and ZeRO-1
// and -2 over the ring) and parameter servers (worker/parameter_server_sync against
// server/parameter_shard). One step must leave every worker with the
// weights one process gets by stepping the summed gradients, the same
// report (global norm, lr, mean loss) everywhere, and the weights of every
// owner (ZeRO) or server must reach every worker; a ZeRO-2 worker keeps
// only its slices' gradients.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/optim/optimizer_shard.h"
#include "server/parameter_shard.h"
#include "sharding/job_options.h"
#include "transport/push_pull.h"
#include "transport/ring_collectives.h"
#include "worker/elastic_shares.h"
#include "worker/reducers/collective_sync.h"
#include "worker/reducers/local_sync.h"
#include "worker/reducers/parameter_server_sync.h"

namespace herd {
namespace {

using ::testing::HasSubstr;
using transport::PeerId;
using transport::RingCollectives;
using transport::UcxTransport;

config::JobConfig SmallJob(int workers, int zero_stage) {
  config::JobConfig c;
  auto* m = c.mutable_model();
  m->set_vocab_size(61);
  m->set_hidden_size(32);
  m->set_intermediate_size(64);
  m->set_num_hidden_layers(2);
  m->set_num_attention_heads(4);
  m->set_num_key_value_heads(2);
  c.mutable_train()->set_steps(20);
  c.mutable_train()->set_seed(3);
  c.mutable_optimizer()->set_lr(1e-2);
  c.mutable_optimizer()->set_weight_decay(0.1);
  c.mutable_optimizer()->set_clip_norm(1.0);
  auto* cl = c.mutable_cluster();
  cl->set_sync(config::ClusterConfig::ALLREDUCE);
  cl->set_workers(workers);
  cl->set_zero_stage(zero_stage);
  cl->set_bucket_mb(0.004);  // ~1000 floats: several buckets
  return c;
}

// Gradients whose sums over workers are exact in fp32 (multiples of 2^-10
// below 2^8), so any summation order gives the same bits.
std::vector<float> Gradient(int64_t n, int worker) {
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(((i * 7 + worker * 13) % 41) - 20) / 1024.0f;
  return g;
}

// The workers of a job in one test process: their buffers, and one step
// each through a sync strategy on a thread of its own (worker 0's or the
// servers' initial weights in, the worker's gradients out, the next
// weights in).
struct Workers {
  // `paged`: the gradients live in PagedBuffers (ZeRO-2).
  Workers(int W, int64_t P, bool paged = false) : weights(W, std::vector<float>(P, -7.0f)), reports(W), results(W) {
    for (int w = 0; w < W; ++w) grads.push_back(Gradient(P, w));
    for (int w = 0; paged && w < W; ++w) {
      paged_grads.push_back(std::move(PagedBuffer::Reserve(P * sizeof(float), /*guarded=*/false).value()));
      std::memcpy(paged_grads[w].data(), grads[w].data(), P * sizeof(float));
    }
  }
  float* grads_of(size_t w) {
    return paged_grads.empty() ? grads[w].data() : reinterpret_cast<float*>(paged_grads[w].data());
  }
  using Make = std::function<StatusOr<std::unique_ptr<SyncStrategy>>(int worker, float* weights)>;
  // Starts the workers; Join() waits for them.
  void Start(const Make& make) {
    for (size_t w = 0; w < weights.size(); ++w) {
      threads.emplace_back([this, make, w] { results[w] = Step(make(w, weights[w].data()), w); });
    }
  }
  void Join() {
    for (auto& t : threads) t.join();
  }
  Status Step(StatusOr<std::unique_ptr<SyncStrategy>> made, size_t w) {
    HERD_RETURN_IF_ERROR(made.status());
    SyncStrategy& x = **made;
    x.IssueWeights(weights[w].data(), 0);
    HERD_RETURN_IF_ERROR(x.FinishWeights());
    x.BeginStep(grads_of(w), {0, static_cast<int>(w), {}});
    x.FinalFrom(0);  // backward done: every bucket may go
    HERD_RETURN_IF_ERROR(x.FinishStep(/*loss=*/1.0 + w));
    x.IssueWeights(weights[w].data(), 1);
    HERD_RETURN_IF_ERROR(x.FinishWeights());
    reports[w] = x.report();
    return Status::OK();
  }

  std::vector<std::vector<float>> weights, grads;
  std::vector<PagedBuffer> paged_grads;
  std::vector<StepReport> reports;
  std::vector<Status> results;
  std::vector<std::thread> threads;
};

// What one process gets from the same initial weights by stepping the
// workers' summed gradients; every worker must hold it, bitwise, with the
// same report. `what` names the job in failures.
void ExpectOneProcessStep(const config::JobConfig& job, const ParamLayout& layout, const Workers& workers,
                          const std::string& what) {
  const int64_t P = layout.size();
  const int W = static_cast<int>(workers.weights.size());
  const auto& weights = workers.weights;
  const auto& reports = workers.reports;
  for (int w = 0; w < W; ++w) {
    ASSERT_TRUE(workers.results[w].ok()) << "worker " << w << ": " << workers.results[w].message();
  }
  auto reference = JobOptions::FromConfig(job).MakeOptimizer(layout, {0, P}, std::nullopt);
  ASSERT_TRUE(reference.ok());
  std::vector<float> sum(P, 0.0f);
  for (int w = 0; w < W; ++w) {
    const auto g = Gradient(P, w);
    for (int64_t i = 0; i < P; ++i) sum[i] += g[i];
  }
  const double norm = std::sqrt(SumOfSquares(sum.data(), P));
  const OptimizerShard::Scalars k = (*reference)->Step(sum.data(), norm, /*loss=*/0);
  for (int w = 0; w < W; ++w) {
    EXPECT_EQ(0, std::memcmp(weights[w].data(), (*reference)->weights(), P * sizeof(float)))
        << "worker " << w << ", " << what;
    EXPECT_EQ(reports[w].version, 1u);
    EXPECT_EQ(reports[w].lr, k.lr);
    // One sum of every gradient's square, or the owners' partials added:
    // equal to rounding.
    EXPECT_NEAR(reports[w].grad_norm, norm, 1e-12 * norm);
    EXPECT_EQ(reports[w].mean_loss, (W + 1) / 2.0);  // mean of 1, 2, ..., W
  }
}

void RunOneStep(int W, int zero_stage) {
  const config::JobConfig job = SmallJob(W, zero_stage);
  const ParamLayout layout(LlamaShape::FromConfig(job.model()));
  const int64_t P = layout.size();
  auto plan = CollectivePlan(layout, job.cluster(), ShardGroupSize(job.cluster(), W));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_GT(plan->buckets().size(), 2u);

  std::vector<std::unique_ptr<UcxTransport>> transports;
  std::vector<PeerId> peers;
  for (int r = 0; r < W; ++r) {
    transports.push_back(std::move(UcxTransport::Create(transport::UcxOptions(r)).value()));
    peers.push_back(r);
  }
  std::vector<std::unique_ptr<RingCollectives>> rings;
  for (int r = 0; r < W; ++r) rings.push_back(std::make_unique<RingCollectives>(transports[r].get(), r, peers));
  for (int r = 0; r < W; ++r) {
    for (int p = 0; p < W; ++p) {
      if (p == r) continue;
      ASSERT_TRUE(transports[r]->Connect(p, transports[p]->address(), "rank " + std::to_string(p)).ok());
    }
  }

  Workers workers(W, P, /*paged=*/zero_stage == 2);
  const JobOptions options = JobOptions::FromConfig(job);
  workers.Start([&](int r, float* weights) -> StatusOr<std::unique_ptr<SyncStrategy>> {
    CollectiveSyncOptions o;
    o.job = &options;
    o.layout = &layout;
    o.plan = &*plan;
    o.zero_stage = zero_stage;
    o.collectives = rings[r].get();
    if (zero_stage == 2) o.paged_grads = &workers.paged_grads[r];
    HERD_ASSIGN_OR_RETURN(CollectiveSyncParts parts, CreateCollectiveSync(o, weights, std::nullopt));
    return std::move(parts.sync);
  });
  workers.Join();
  ExpectOneProcessStep(job, layout, workers, std::to_string(W) + " ZeRO-" + std::to_string(zero_stage));
  for (int r = 0; zero_stage == 2 && r < W; ++r) {
    // What is left of the gradients: the worker's slices, summed; zero
    // elsewhere (let go).
    std::vector<float> expected(P, 0.0f);
    for (const ParamRange& s : OwnedSlices(*plan, W, r)) {
      for (int64_t i = s.begin; i < s.end; ++i) {
        for (int w = 0; w < W; ++w) expected[i] += workers.grads[w][i];
      }
    }
    EXPECT_EQ(0, std::memcmp(workers.grads_of(r), expected.data(), P * sizeof(float))) << "worker " << r;
  }
  rings.clear();
  transports.clear();
}

TEST(LocalSync, StepsTheLoopsWeightsInPlaceAsOneProcessDoes) {
  const config::JobConfig job = SmallJob(1, 0);
  const ParamLayout layout(LlamaShape::FromConfig(job.model()));
  Workers workers(1, layout.size());
  workers.Start([&](int, float* weights) -> StatusOr<std::unique_ptr<SyncStrategy>> {
    HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerShard> optimizer,
                          JobOptions::FromConfig(job).MakeOptimizer(layout, {0, layout.size()}, std::nullopt));
    return CreateLocalSync(std::move(optimizer), weights);
  });
  workers.Join();
  ExpectOneProcessStep(job, layout, workers, "one process");
}

TEST(LocalSync, ANonFiniteGradientNormIsDivergenceWithAdvice) {
  const config::JobConfig job = SmallJob(1, 0);
  const ParamLayout layout(LlamaShape::FromConfig(job.model()));
  const int64_t P = layout.size();
  std::vector<float> weights(P), grads(P, 0.0f);
  auto optimizer = JobOptions::FromConfig(job).MakeOptimizer(layout, {0, P}, std::nullopt);
  ASSERT_TRUE(optimizer.ok());
  auto local = CreateLocalSync(std::move(*optimizer), weights.data());
  grads[P / 2] = std::numeric_limits<float>::infinity();
  local->BeginStep(grads.data(), {});
  local->FinalFrom(0);
  const Status st = local->FinishStep(1.0);
  EXPECT_THAT(st.message(), HasSubstr("gradient norm is inf"));
  EXPECT_THAT(st.message(), HasSubstr("lower optimizer.lr"));
}

TEST(CollectiveSync, DdpStepEqualsOneProcessOnTheSummedGradients) {
  RunOneStep(2, 0);
  RunOneStep(3, 0);
}

TEST(CollectiveSync, Zero1StepEqualsOneProcessAndGathersEveryRange) {
  RunOneStep(2, 1);
  RunOneStep(3, 1);
}

TEST(CollectiveSync, Zero2StepEqualsOneProcessAndKeepsOnlyItsSlicesGradients) {
  RunOneStep(2, 2);
  RunOneStep(3, 2);
}

// S servers (PeerIds 0..S-1) and W workers (S..S+W-1). `stream`: without
// clipping, servers step buckets as their sums complete and workers pull
// each bucket right after pushing it.
void RunOneParameterServerStep(int S, int W, bool stream = false) {
  config::JobConfig job = SmallJob(W, 0);
  job.mutable_cluster()->set_sync(config::ClusterConfig::PARAMETER_SERVER);
  job.mutable_cluster()->set_servers(S);
  if (stream) job.mutable_optimizer()->set_clip_norm(0);
  const ParamLayout layout(LlamaShape::FromConfig(job.model()));
  const int64_t P = layout.size();
  auto plan = ShardPlan::Create(layout, ShardPlanOptions::FromConfig(job.cluster()));
  ASSERT_TRUE(plan.ok()) << plan.status().message();

  std::vector<std::unique_ptr<UcxTransport>> transports;
  for (int p = 0; p < S + W; ++p) transports.push_back(std::move(UcxTransport::Create(transport::UcxOptions(p)).value()));
  std::vector<std::unique_ptr<ParameterShard>> shards;
  std::vector<std::unique_ptr<transport::PushPullServer>> services;
  for (int s = 0; s < S; ++s) {
    auto optimizer = JobOptions::FromConfig(job).MakeOptimizer(layout, plan->shard(s), std::nullopt);
    ASSERT_TRUE(optimizer.ok());
    ParameterShardOptions o;
    o.layout = &layout;
    o.plan = &*plan;
    o.server = s;
    o.num_workers = W;
    o.first_worker_peer = S;
    o.collects_losses = s == 0;
    o.stream_updates = stream;
    shards.push_back(std::make_unique<ParameterShard>(o, std::move(*optimizer)));
    services.push_back(std::make_unique<transport::PushPullServer>(transports[s].get(), shards[s].get()));
  }
  std::vector<std::unique_ptr<transport::PushPullClient>> clients;
  for (int w = 0; w < W; ++w) {
    clients.push_back(
        std::make_unique<transport::PushPullClient>(transports[S + w].get(), LargestBucketBytes(*plan, 4)));
  }
  for (int a = 0; a < S + W; ++a) {
    for (int b = 0; b < S + W; ++b) {
      if (a != b && (a < S) != (b < S)) {
        ASSERT_TRUE(transports[a]->Connect(b, transports[b]->address(), "peer " + std::to_string(b)).ok());
      }
    }
  }

  // The servers' step: partial norms combined in server order.
  std::vector<double> partials(S);
  std::vector<std::thread> server_threads;
  std::vector<Status> server_results(S);
  std::mutex mu;
  std::condition_variable cv;
  int partials_in = 0;
  double loss0 = 0;
  for (int s = 0; s < S; ++s) {
    server_threads.emplace_back([&, s] {
      ParameterShard::StepHooks hooks;
      hooks.global_scalars = [&, s](int64_t, double partial,
                                    double loss) -> StatusOr<ParameterShard::StepHooks::Global> {
        std::unique_lock<std::mutex> lock(mu);
        partials[s] = partial;
        if (s == 0) loss0 = loss;
        ++partials_in;
        cv.notify_all();
        cv.wait(lock, [&] { return partials_in == S; });
        double total = 0;
        for (double p : partials) total += p;
        return ParameterShard::StepHooks::Global{std::sqrt(total), loss0};
      };
      server_results[s] = shards[s]->ServeSteps(/*last=*/1, hooks);
    });
  }
  Workers workers(W, P);
  workers.Start([&](int w, float*) -> StatusOr<std::unique_ptr<SyncStrategy>> {
    ParameterServerSyncOptions o;
    o.plan = &*plan;
    o.stream = stream;
    o.rank = w;
    o.first_server = 0;
    HERD_ASSIGN_OR_RETURN(ParameterServerSyncParts parts,
                          CreateParameterServerSync(o, transports[S + w].get(), clients[w].get()));
    return std::move(parts.sync);
  });
  workers.Join();
  for (auto& t : server_threads) t.join();
  for (int s = 0; s < S; ++s) ASSERT_TRUE(server_results[s].ok()) << server_results[s].message();
  ExpectOneProcessStep(job, layout, workers, std::to_string(S) + " servers" + (stream ? ", streamed" : ""));
  clients.clear();
  services.clear();
  shards.clear();
  transports.clear();
}

TEST(ParameterServerSync, StepEqualsOneProcessOnTheSummedGradients) {
  RunOneParameterServerStep(1, 2);
  RunOneParameterServerStep(2, 2);
  RunOneParameterServerStep(3, 1);
}

TEST(ParameterServerSync, StreamedStepWithoutClippingEqualsOneProcess) {
  RunOneParameterServerStep(1, 2, /*stream=*/true);
  RunOneParameterServerStep(2, 3, /*stream=*/true);
}

}  // namespace
// Elastic shares: a loss counts at once (its shares go to the live workers
// in turn), a join only for steps dealt at its epoch or later, so that
// every worker deals a step alike whenever it heard of the join; the
// longest-serving live worker leads.
TEST(ElasticShares, LossesCountAtOnceJoinsFromTheirEpoch) {
  transport::WelcomedMembership founding{0, {0, 1, 2}, {0, 0, 0}};
  ElasticShares w0(3, 0, founding), w2(3, 2, founding);
  auto change = [](int epoch, bool joined, int rank, std::vector<int> live) {
    transport::MembershipChange c;
    c.epoch = epoch;
    c.joined = joined;
    c.member.set_role(wire::WORKER);
    c.member.set_rank(rank);
    c.live_workers = std::move(live);
    return c;
  };
  for (ElasticShares* w : {&w0, &w2}) {
    w->Apply(change(1, false, 0, {1, 2}));  // worker 0 lost
    w->Apply(change(2, true, 0, {0, 1, 2}));  // a worker joins as rank 0
  }
  EXPECT_EQ(w2.Mine(0), (std::vector<int>{2}));
  EXPECT_EQ(w2.Mine(1), (std::vector<int>{2}));     // share 0 goes to worker 1
  EXPECT_EQ(w2.Mine(2), (std::vector<int>{2}));
  EXPECT_EQ(w0.Mine(1), (std::vector<int>{}));      // lost, and not yet back
  EXPECT_EQ(w0.Mine(2), (std::vector<int>{0}));
  EXPECT_EQ(w2.leader(), 1);                        // there since the start
  EXPECT_EQ(w2.epoch(), 2);

  // The joiner's own view, from its welcome: the same deals.
  ElasticShares joiner(3, 0, transport::WelcomedMembership{2, {0, 1, 2}, {2, 0, 0}});
  EXPECT_EQ(joiner.joined_at(), 2);
  EXPECT_EQ(joiner.Mine(2), (std::vector<int>{0}));
  EXPECT_EQ(joiner.leader(), 1);
  joiner.Apply(change(3, false, 1, {0, 2}));
  EXPECT_EQ(joiner.Mine(2), (std::vector<int>{0, 1}));  // orphan 1 goes to the first live worker
  EXPECT_EQ(joiner.leader(), 2);
  EXPECT_TRUE(joiner.AwaitEpoch(3, [] { return Status::OK(); }).ok());
  EXPECT_EQ(joiner.AwaitEpoch(4, [] { return Status::Aborted("job over"); }).message(), "job over");
}

}  // namespace herd
