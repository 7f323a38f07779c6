// Token files, the distributed sampler and text preparation.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "common/file_util.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "data/token_file.h"

namespace herd {
namespace {

std::string TempPath(const std::string& name) {
  static std::string dir = [] {
    std::string d = ::testing::TempDir() + "herd_data_XXXXXX";
    return std::string(::mkdtemp(d.data()));
  }();
  return dir + "/" + name;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::vector<int32_t> Iota(int n, int mod) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = i % mod;
  return v;
}

TEST(TokenFileTest, RoundTripsAllFormats) {
  for (const char* name : {"a.bin", "a.u16", "a.u32"}) {
    const std::string path = TempPath(name);
    std::vector<int32_t> tokens = Iota(1000, 256);
    ASSERT_TRUE(WriteTokenFile(path, tokens).ok());
    auto f = TokenFile::Open(path, 256);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_EQ(f->size(), 1000);
    std::vector<int32_t> back(1000);
    f->Read(0, 1000, back.data());
    EXPECT_EQ(back, tokens) << name;
  }
  // Ids beyond uint16 switch the llm.c file to the uint32 variant.
  const std::string big = TempPath("big.bin");
  ASSERT_TRUE(WriteTokenFile(big, {1, 70000, 3}).ok());
  auto f = TokenFile::Open(big, 0);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->width(), 4);
  EXPECT_EQ((*f)[1], 70000);
}

TEST(TokenFileTest, BadFilesNameTheFileAndTheProblem) {
  const std::string good = TempPath("good.bin");
  ASSERT_TRUE(WriteTokenFile(good, Iota(100, 50)).ok());
  std::string bytes = *ReadFile(good);

  auto expect = [](const std::string& path, int vocab, const std::string& needle) {
    auto f = TokenFile::Open(path, vocab);
    ASSERT_FALSE(f.ok()) << path;
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().message();
    EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status().message();
  };
  expect(TempPath("missing.bin"), 0, "no such file");
  WriteBytes(TempPath("short.bin"), bytes.substr(0, 100));
  expect(TempPath("short.bin"), 0, "shorter than the 1024-byte header");
  WriteBytes(TempPath("trunc.bin"), bytes.substr(0, bytes.size() - 2));
  expect(TempPath("trunc.bin"), 0, "header says 100 tokens");
  WriteBytes(TempPath("long.bin"), bytes + "xx");
  expect(TempPath("long.bin"), 0, "header says 100 tokens");
  std::string magic = bytes;
  magic[0] = 1;
  WriteBytes(TempPath("magic.bin"), magic);
  expect(TempPath("magic.bin"), 0, "magic");
  std::string version = bytes;
  version[4] = 9;
  WriteBytes(TempPath("version.bin"), version);
  expect(TempPath("version.bin"), 0, "version");
  expect(good, 40, "token 40 at position 40 is >= vocab_size 40");
  WriteBytes(TempPath("odd.u16"), "abc");
  expect(TempPath("odd.u16"), 0, "whole number");
  WriteBytes(TempPath("empty.u32"), "");
  expect(TempPath("empty.u32"), 0, "empty");
}

// Sequence index of a batch row: its first token (tokens are 0..n-1).
std::multiset<int32_t> Batch(DistributedSampler& s, int B, int T) {
  std::vector<int32_t> in(B * T), tg(B * T);
  s.NextBatch(B, in.data(), tg.data());
  std::multiset<int32_t> starts;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) EXPECT_EQ(tg[b * T + t], in[b * T + t] + 1);  // targets are shifted inputs
    starts.insert(in[b * T] / T);
  }
  return starts;
}

TEST(SamplerTest, RanksUnionEqualsOneProcessWithTheGlobalBatch) {
  const int T = 4;
  const std::string path = TempPath("seq.u32");
  ASSERT_TRUE(WriteTokenFile(path, Iota(4 * 101 + 1, 1 << 30)).ok());  // 101 sequences
  auto file = TokenFile::Open(path, 0);
  ASSERT_TRUE(file.ok());
  for (int W : {2, 3}) {
    const int B = 4;
    auto single = DistributedSampler::Create(*file, T, 1, 0, 42);
    ASSERT_TRUE(single.ok());
    std::vector<DistributedSampler> ranks;
    for (int r = 0; r < W; ++r) ranks.push_back(std::move(*DistributedSampler::Create(*file, T, W, r, 42)));
    for (int step = 0; step < 40; ++step) {  // several epochs
      std::multiset<int32_t> global = Batch(*single, W * B, T), together;
      std::set<int32_t> seen;
      for (auto& s : ranks) {
        for (int32_t seq : Batch(s, B, T)) {
          together.insert(seq);
          EXPECT_TRUE(seen.insert(seq).second) << "ranks overlap at step " << step;
        }
      }
      ASSERT_EQ(global, together) << "W=" << W << " step " << step;
      EXPECT_EQ(single->epoch(), ranks[0].epoch());
    }
    EXPECT_GT(single->epoch(), 2);
  }
}

TEST(SamplerTest, ReshufflesEachEpochDeterministicallyAndResumes) {
  const int T = 3;
  const std::string path = TempPath("shuf.u16");
  ASSERT_TRUE(WriteTokenFile(path, Iota(3 * 50 + 1, 60000)).ok());
  auto file = TokenFile::Open(path, 0);
  auto a = DistributedSampler::Create(*file, T, 1, 0, 7);
  auto b = DistributedSampler::Create(*file, T, 1, 0, 7);
  auto c = DistributedSampler::Create(*file, T, 1, 0, 8);
  std::vector<std::multiset<int32_t>> epoch0, epoch1;
  std::vector<int32_t> order_a, order_b, order_c;
  for (int i = 0; i < 100; ++i) {  // one sequence per batch: the order itself
    order_a.push_back(*Batch(*a, 1, T).begin());
    order_b.push_back(*Batch(*b, 1, T).begin());
    order_c.push_back(*Batch(*c, 1, T).begin());
  }
  EXPECT_EQ(order_a, order_b);
  EXPECT_NE(order_a, order_c);
  std::vector<int32_t> first(order_a.begin(), order_a.begin() + 50), second(order_a.begin() + 50, order_a.end());
  EXPECT_NE(first, second);
  std::sort(first.begin(), first.end());
  std::sort(second.begin(), second.end());
  EXPECT_EQ(first, second);  // each epoch is a permutation of all sequences

  // Save mid-epoch, restore into a fresh sampler: identical continuation.
  const std::string state = a->SaveState();
  auto d = DistributedSampler::Create(*file, T, 1, 0, 7);
  ASSERT_TRUE(d->RestoreState(state).ok());
  for (int i = 0; i < 60; ++i) EXPECT_EQ(Batch(*a, 1, T), Batch(*d, 1, T));
  auto other = DistributedSampler::Create(*file, T, 2, 1, 7);
  EXPECT_FALSE(other->RestoreState(state).ok());
  EXPECT_FALSE(d->RestoreState("garbage").ok());
}

TEST(SamplerTest, TooSmallDatasetIsAClearError) {
  const std::string path = TempPath("small.u16");
  ASSERT_TRUE(WriteTokenFile(path, Iota(9, 10)).ok());
  auto file = TokenFile::Open(path, 0);
  auto s = DistributedSampler::Create(*file, 4, 1, 0, 1);  // 2 sequences
  ASSERT_TRUE(s.ok());
  Status st = s->CheckBatch(4);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("small.u16"), std::string::npos) << st.message();
  EXPECT_FALSE(DistributedSampler::Create(*file, 4, 3, 0, 1).ok());
}

TEST(PrepareTest, SplitsFortunesSkipsBinariesAndDuplicates) {
  const std::string text = TempPath("fortunes");
  std::string body;
  for (int i = 0; i < 400; ++i) body += "Fortune number " + std::to_string(i) + ".\n%\n";
  WriteBytes(text, body);
  WriteBytes(TempPath("index.dat"), std::string("\0\1\2", 3));
  ::symlink(text.c_str(), TempPath("fortunes.u8").c_str());
  PrepareOptions o;
  o.inputs = {text, TempPath("index.dat"), TempPath("fortunes.u8")};
  o.train_out = TempPath("out/train.bin");
  o.val_out = TempPath("out/val.bin");
  o.val_fraction = 0.1;
  PrepareSummary s;
  ASSERT_TRUE(PrepareText(o, &s).ok());
  EXPECT_EQ(s.files, 1);
  EXPECT_EQ(s.skipped, 2);
  EXPECT_EQ(s.documents, 400);
  const double share = static_cast<double>(s.val_tokens) / (s.train_tokens + s.val_tokens);
  EXPECT_GT(share, 0.05);
  EXPECT_LT(share, 0.15);
  auto train = TokenFile::Open(o.train_out, 256);
  ASSERT_TRUE(train.ok());
  EXPECT_EQ(train->size(), s.train_tokens);
  EXPECT_NE((*train)[0], '%');  // separators are not text
}

TEST(PrepareTest, UnwritableOutputLeavesNothing) {
  const std::string text = TempPath("plain.txt");
  WriteBytes(text, "hello world\n");
  PrepareOptions o;
  o.inputs = {text};
  o.train_out = "/proc/herd_no_such_dir/train.bin";
  PrepareSummary s;
  Status st = PrepareText(o, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/proc/herd_no_such_dir"), std::string::npos) << st.message();
  o.inputs = {TempPath("nope.txt")};
  o.train_out = TempPath("never.bin");
  EXPECT_FALSE(PrepareText(o, &s).ok());
  EXPECT_FALSE(PathExists(o.train_out));
}

TEST(PrepareTest, EnsurePreparedMakesMissingTrainFileOnce) {
  const std::string text = TempPath("doc.txt");
  WriteBytes(text, std::string(5000, 'x'));
  config::DataConfig data;
  data.set_train(TempPath("auto/train.bin"));
  data.set_val(TempPath("auto/val.bin"));
  EXPECT_FALSE(EnsurePrepared(data).ok());  // nothing to prepare from
  data.add_prepare_from(TempPath("doc.*"));
  ASSERT_TRUE(EnsurePrepared(data).ok());
  EXPECT_TRUE(PathExists(data.train()));
  EXPECT_TRUE(PathExists(data.val()));
  data.set_prepare_from(0, TempPath("nothing_matches_*"));
  EXPECT_TRUE(EnsurePrepared(data).ok());  // train exists: nothing to do
}

}  // namespace
}  // namespace herd
