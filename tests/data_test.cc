// data/: token file formats and their bad inputs, the distributed sampler's
// promises (disjoint ranks, union over ranks = the one-process batch,
// per-epoch reshuffle, exact resume), the in-order evaluation reader, and
// text preparation (fortune splitting, skipped inputs, the val split,
// nothing half-written, EnsurePrepared, `herd prepare`), and tokenizers
// (the split-pattern regex engine, BPE merges, what is refused; parity with
// HuggingFace's tokenizers is tests/tokenizer_parity_test.py).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "data/token_regex.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

namespace herd {
namespace {

// Each test gets its own scratch directory, removed afterwards.
class ScratchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = ::testing::TempDir() + "herd_data_test_XXXXXX";
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    dir_ = t;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Write(const std::string& name, const std::string& bytes) const {
    std::ofstream(Path(name), std::ios::binary) << bytes;
    return Path(name);
  }
  std::set<std::string> Listing() const {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) names.insert(e.path().string());
    return names;
  }

  std::string dir_;
};

std::vector<int32_t> Iota(int64_t n) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i);
  return v;
}

std::string Le32(std::initializer_list<int32_t> values) {
  std::string s;
  for (int32_t v : values) s.append(reinterpret_cast<const char*>(&v), 4);
  return s;
}

// An error is one line that starts with the file's path.
void ExpectNamesFile(const Status& st, const std::string& path, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << path;
  EXPECT_EQ(st.message().rfind(path + ": ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find(needle), std::string::npos) << "'" << needle << "' not in: " << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
}

// ---------------------------------------------------------------- TokenFile

class DataTokenFileTest : public ScratchTest {};

TEST_F(DataTokenFileTest, RoundTripsEveryFormat) {
  struct Case {
    const char* name;
    std::vector<int32_t> tokens;
    int width;
    int64_t file_bytes;
  };
  std::vector<int32_t> small = Iota(700), u16 = Iota(700), wide = Iota(700);
  for (int32_t& t : small) t %= 256;
  u16[5] = 65535;
  wide[5] = 70000;
  std::vector<int32_t> wide32 = wide;
  wide32[6] = (1 << 30) + 7;
  const std::vector<Case> cases = {
      {"small.bin", small, 2, 1024 + 2 * 700}, {"u16.bin", u16, 2, 1024 + 2 * 700},
      {"wide.bin", wide, 4, 1024 + 4 * 700},   {"raw.u16", u16, 2, 2 * 700},
      {"raw.u32", wide32, 4, 4 * 700},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = Path(c.name);
    ASSERT_TRUE(WriteTokenFile(path, c.tokens).ok());
    auto bytes = ReadFile(path);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(static_cast<int64_t>(bytes->size()), c.file_bytes);
    if (std::string(c.name).ends_with(".bin")) {
      int32_t header[3];
      std::memcpy(header, bytes->data(), sizeof(header));
      EXPECT_EQ(header[0], c.width == 2 ? 20240520 : 20240801);
      EXPECT_EQ(header[1], c.width == 2 ? 1 : 7);
      EXPECT_EQ(header[2], 700);
    }
    auto f = TokenFile::Open(path, 0);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->size(), 700);
    EXPECT_EQ(f->width(), c.width);
    EXPECT_EQ(f->path(), path);
    std::vector<int32_t> all(700), part(9);
    f->Read(0, 700, all.data());
    EXPECT_EQ(all, c.tokens);
    f->Read(3, 9, part.data());
    EXPECT_EQ(part, std::vector<int32_t>(c.tokens.begin() + 3, c.tokens.begin() + 12));
    for (int64_t i : {0, 5, 6, 699}) EXPECT_EQ((*f)[i], c.tokens[i]);
    // The vocabulary check passes at max id + 1.
    const int32_t max_id = *std::max_element(c.tokens.begin(), c.tokens.end());
    EXPECT_TRUE(TokenFile::Open(path, max_id + 1).ok());
  }
}

TEST_F(DataTokenFileTest, MovesKeepTheMapping) {
  ASSERT_TRUE(WriteTokenFile(Path("a.bin"), {1, 2, 3}).ok());
  ASSERT_TRUE(WriteTokenFile(Path("b.u32"), {7, 8}).ok());
  auto a = TokenFile::Open(Path("a.bin"), 256);
  auto b = TokenFile::Open(Path("b.u32"), 256);
  ASSERT_TRUE(a.ok() && b.ok());
  TokenFile moved(std::move(*a));
  EXPECT_EQ(a->size(), 0);
  EXPECT_EQ(moved.size(), 3);
  EXPECT_EQ(moved[2], 3);
  moved = std::move(*b);  // releases a.bin's mapping
  EXPECT_EQ(moved.size(), 2);
  EXPECT_EQ(moved.width(), 4);
  EXPECT_EQ(moved[1], 8);
  EXPECT_EQ(moved.path(), Path("b.u32"));
}

TEST_F(DataTokenFileTest, EachBadFileIsOneLineNamingIt) {
  std::vector<int32_t> tokens(100, 65);
  tokens[12] = 300;
  ASSERT_TRUE(WriteTokenFile(Path("good.bin"), tokens).ok());
  const std::string good = *ReadFile(Path("good.bin"));  // 1024 + 200 bytes

  auto expect = [&](const std::string& path, int vocab, const std::string& needle) {
    SCOPED_TRACE(path);
    auto f = TokenFile::Open(path, vocab);
    ExpectNamesFile(f.status(), path, needle);
  };
  expect(Path("missing.bin"), 0, "no such file");
  expect(Write("short.bin", good.substr(0, 100)), 0, "100 bytes is shorter than the 1024-byte header");
  expect(Write("text.bin", "Once upon a time\n"), 0, "looks like text");
  expect(Write("trunc.bin", good.substr(0, good.size() - 2)), 0,
         "header says 100 tokens (1224 bytes) but the file has 1222 bytes");
  expect(Write("long.bin", good + "xx"), 0, "header says 100 tokens (1224 bytes) but the file has 1226 bytes");
  expect(Write("magic.bin", Le32({12345}) + good.substr(4)), 0, "magic 12345, expected 20240520 or 20240801");
  expect(Write("v16.bin", Le32({20240520, 7}) + good.substr(8)), 0,
         "magic 20240520 (uint16 tokens) needs version 1, got version 7");
  expect(Write("v32.bin", Le32({20240801, 1, 1}) + good.substr(12, 1012) + std::string(4, 'a')), 0,
         "magic 20240801 (uint32 tokens) needs version 7, got version 1");
  expect(Write("zero.bin", Le32({20240520, 1, 0}) + std::string(1012, '\0')), 0, "header says 0 tokens");
  expect(Write("negative.bin", Le32({20240520, 1, -4}) + std::string(1012, '\0')), 0, "header says -4 tokens");
  expect(Path("good.bin"), 256, "token 300 at position 12 is >= vocab_size 256");
  EXPECT_EQ(TokenFile::Open(Path("good.bin"), 256).status().message(),
            Path("good.bin") + ": token 300 at position 12 is >= vocab_size 256");
  EXPECT_TRUE(TokenFile::Open(Path("good.bin"), 301).ok());
  ASSERT_TRUE(WriteTokenFile(Path("big.u16"), tokens).ok());
  expect(Path("big.u16"), 256, "token 300 at position 12 is >= vocab_size 256");
  expect(Write("huge.u32", Le32({1, 2, -1})), 0, "token 4294967295 at position 2 is >= 2^31");
  expect(Write("empty.u16", ""), 0, "empty token file");
  expect(Write("odd.u32", "123456"), 0, "6 bytes is not a whole number of uint32 tokens");
  ASSERT_EQ(::mkdir(Path("dir.bin").c_str(), 0755), 0);
  expect(Path("dir.bin"), 0, "not a regular file");
}

TEST_F(DataTokenFileTest, WriteRefusesWhatItCannotStoreAndLeavesNothing) {
  const auto before = Listing();
  ExpectNamesFile(WriteTokenFile(Path("x.u16"), {1, 70000}), Path("x.u16"), "70000 does not fit uint16");
  ExpectNamesFile(WriteTokenFile(Path("x.bin"), {1, -2}), Path("x.bin"), "negative token id -2 at position 1");
  ExpectNamesFile(WriteTokenFile(Path("x.bin"), {}), Path("x.bin"), "no tokens");
  Write("plainfile", "x");
  EXPECT_FALSE(WriteTokenFile(Path("plainfile/x.bin"), {1}).ok());
  EXPECT_EQ(Listing().size(), before.size() + 1);  // only plainfile
  // Rewriting replaces the file whole, with no temporary left behind.
  ASSERT_TRUE(WriteTokenFile(Path("y.bin"), Iota(50)).ok());
  ASSERT_TRUE(WriteTokenFile(Path("y.bin"), {9, 9}).ok());
  auto f = TokenFile::Open(Path("y.bin"), 0);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->size(), 2);
  EXPECT_EQ(Listing().size(), before.size() + 2);
}

// ------------------------------------------------------- DistributedSampler

class DataSamplerTest : public ScratchTest {
 protected:
  // A file whose token i is i, so that a row's first input names its
  // sequence: sequence s starts with token s * T.
  const TokenFile& Counting(int64_t tokens) {
    const std::string path = Path("count" + std::to_string(files_.size()) + ".u32");
    EXPECT_TRUE(WriteTokenFile(path, Iota(tokens)).ok());
    files_.push_back(std::make_unique<TokenFile>(std::move(*TokenFile::Open(path, 0))));
    return *files_.back();
  }
  std::vector<std::unique_ptr<TokenFile>> files_;
};

// The sequence index of each row, checking that each row is the window of
// the file at that sequence (inputs, then targets shifted by one).
std::vector<int64_t> Rows(DistributedSampler& s, int B, int T) {
  std::vector<int32_t> in(B * T, -1), tg(B * T, -1);
  s.NextBatch(B, in.data(), tg.data());
  std::vector<int64_t> seqs;
  for (int b = 0; b < B; ++b) {
    const int32_t start = in[b * T];
    EXPECT_EQ(start % T, 0);
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(in[b * T + t], start + t);
      EXPECT_EQ(tg[b * T + t], start + t + 1);
    }
    seqs.push_back(start / T);
  }
  return seqs;
}

std::multiset<int64_t> Multiset(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

TEST_F(DataSamplerTest, RanksAreDisjointWithinAnEpochAndDropTheSameTail) {
  const int T = 4, W = 3;
  const TokenFile& file = Counting(103 * T + 2);  // 103 sequences, 34 per rank, 1 dropped
  std::vector<DistributedSampler> ranks;
  for (int r = 0; r < W; ++r) ranks.push_back(*DistributedSampler::Create(file, T, W, r, 5));
  EXPECT_EQ(ranks[0].num_sequences(), 103);
  EXPECT_EQ(ranks[0].per_rank(), 34);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    for (int step = 0; step < 34; ++step) {
      for (auto& s : ranks) {
        for (int64_t q : Rows(s, 1, T)) EXPECT_TRUE(seen.insert(q).second) << "sequence " << q << " twice";
        EXPECT_EQ(s.epoch(), epoch);
      }
    }
    EXPECT_EQ(seen.size(), 102u);
    EXPECT_LT(*seen.rbegin(), 103);
  }
}

TEST_F(DataSamplerTest, UnionOverRanksIsTheOneProcessBatchAcrossEpochs) {
  const int T = 3;
  const TokenFile& file = Counting(101 * T + 1);  // 101 sequences
  for (int W : {2, 3}) {
    for (int B : {1, 4, 7}) {
      SCOPED_TRACE("W=" + std::to_string(W) + " B=" + std::to_string(B));
      auto single = DistributedSampler::Create(file, T, 1, 0, 11);
      ASSERT_TRUE(single.ok());
      ASSERT_TRUE(single->CheckBatch(W * B).ok());
      std::vector<DistributedSampler> ranks;
      for (int r = 0; r < W; ++r) {
        ranks.push_back(*DistributedSampler::Create(file, T, W, r, 11));
        ASSERT_TRUE(ranks.back().CheckBatch(B).ok());
      }
      const int steps = 5 * (101 / (W * B)) + 3;  // five epochs and a bit
      for (int step = 0; step < steps; ++step) {
        std::multiset<int64_t> together;
        for (auto& s : ranks) {
          for (int64_t q : Rows(s, B, T)) together.insert(q);
        }
        ASSERT_EQ(Multiset(Rows(*single, W * B, T)), together) << "step " << step;
        for (auto& s : ranks) ASSERT_EQ(s.epoch(), single->epoch()) << "step " << step;
      }
      EXPECT_EQ(single->epoch(), 5);
    }
  }
}

TEST_F(DataSamplerTest, ReshufflesEachEpochFromSeedAndEpoch) {
  const int T = 2, n = 60;
  const TokenFile& file = Counting(n * T + 1);
  auto order = [&](uint64_t seed, int epochs) {
    auto s = DistributedSampler::Create(file, T, 1, 0, seed);
    std::vector<std::vector<int64_t>> out(epochs);
    for (int e = 0; e < epochs; ++e) out[e] = Rows(*s, n, T);  // one batch = one epoch
    return out;
  };
  const auto a = order(42, 4);
  std::vector<int64_t> identity(n);
  for (int i = 0; i < n; ++i) identity[i] = i;
  for (int e = 0; e < 4; ++e) {
    std::vector<int64_t> sorted = a[e];
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity) << "epoch " << e;
    if (e > 0) {
      EXPECT_NE(a[e], a[e - 1]) << "epoch " << e << " repeats the order of the one before";
    }
  }
  EXPECT_NE(a[0], identity);  // shuffled at all
  EXPECT_EQ(order(42, 4), a);
  EXPECT_NE(order(43, 1)[0], a[0]);
}

TEST_F(DataSamplerTest, SaveAndRestoreContinueIdentically) {
  const int T = 5, W = 3, B = 4;
  const TokenFile& file = Counting(97 * T + 1);  // 32 per rank: 8 batches, no tail
  for (int stop : {3, 8, 13}) {                  // mid-epoch, at the boundary, in epoch 1
    SCOPED_TRACE("stop after " + std::to_string(stop));
    for (int r = 0; r < W; ++r) {
      auto a = DistributedSampler::Create(file, T, W, r, 9);
      for (int i = 0; i < stop; ++i) Rows(*a, B, T);
      const std::string state = a->SaveState();
      EXPECT_EQ(state.back(), '\n');
      EXPECT_EQ(std::count(state.begin(), state.end(), '\n'), 1);
      auto b = DistributedSampler::Create(file, T, W, r, 9);
      ASSERT_TRUE(b->RestoreState(state).ok());
      EXPECT_EQ(b->epoch(), a->epoch());
      EXPECT_EQ(b->taken(), a->taken());
      for (int i = 0; i < 20; ++i) ASSERT_EQ(Rows(*a, B, T), Rows(*b, B, T)) << "step " << stop + i;
      EXPECT_EQ(b->SaveState(), a->SaveState());
    }
  }
}

TEST_F(DataSamplerTest, RestoreRejectsOtherRunsAndGarbageAndChangesNothing) {
  const int T = 4;
  const TokenFile& file = Counting(50 * T + 1);
  const TokenFile& other_file = Counting(60 * T + 1);
  auto saved = DistributedSampler::Create(file, T, 2, 1, 3);
  Rows(*saved, 2, T);
  const std::string state = saved->SaveState();

  auto expect = [&](const TokenFile& f, int seq_len, int W, int r, const std::string& text, const std::string& needle) {
    auto s = DistributedSampler::Create(f, seq_len, W, r, 3);
    ASSERT_TRUE(s.ok());
    auto twin = DistributedSampler::Create(f, seq_len, W, r, 3);
    Rows(*s, 1, seq_len);
    Rows(*twin, 1, seq_len);
    Status st = s->RestoreState(text);
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
    EXPECT_EQ(Rows(*s, 1, seq_len), Rows(*twin, 1, seq_len)) << "a failed restore moved the sampler";
  };
  expect(file, T + 1, 2, 1, state, "seq_len 4, seed 3; this run has 201 tokens (" + file.path() + "), seq_len 5");
  expect(other_file, T, 2, 1, state, "saved for 201 tokens");
  expect(file, T, 2, 1, "", "malformed");
  expect(file, T, 2, 1, "garbage", "malformed: 'garbage'");
  expect(file, T, 2, 1, state + "extra", "malformed");
  expect(file, T, 2, 1, "epoch 0 taken 0 tokens 201 seq_len 4", "malformed");  // no seed
  expect(file, T, 2, 1, "epoch -1 taken 0 tokens 201 seq_len 4 seed 3", "out of range");
  expect(file, T, 2, 1, "epoch 0 taken 51 tokens 201 seq_len 4 seed 3", "out of range");
  // The older form: a rank's position and its world size.
  expect(file, T, 2, 1, "epoch 0 position 0 tokens 201 seq_len 4 world_size 2 rank 1", "malformed");  // no seed
  expect(file, T, 2, 1, "epoch -1 position 0 tokens 201 seq_len 4 world_size 2 rank 1 seed 3", "out of range");
  expect(file, T, 2, 1, "epoch 0 position 26 tokens 201 seq_len 4 world_size 2 rank 1 seed 3", "out of range");
  expect(file, T, 2, 1, "epoch 0 position 1 tokens 201 seq_len 4 world_size 2 rank 2 seed 3", "out of range");
  auto reseeded = DistributedSampler::Create(file, T, 2, 1, 4);
  Status st = reseeded->RestoreState(state);
  EXPECT_NE(st.message().find("seed 3; this run has"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("seed 4"), std::string::npos) << st.message();
  auto s = DistributedSampler::Create(file, T, 2, 1, 3);
  EXPECT_TRUE(s->RestoreState(state).ok());
  auto three = DistributedSampler::Create(file, T, 3, 2, 3);  // any rank of any count
  EXPECT_TRUE(three->RestoreState(state).ok());
  EXPECT_EQ(three->taken(), 4);
  auto old_form = DistributedSampler::Create(file, T, 3, 2, 3);
  EXPECT_TRUE(old_form->RestoreState("epoch 0 position 2 tokens 201 seq_len 4 world_size 2 rank 1 seed 3").ok());
  EXPECT_EQ(old_form->taken(), 4);
}

// The state is the epoch's global position: a run that changes its number
// of workers (keeping the global batch) goes on taking exactly the
// sequences one process would, none skipped and none repeated, across
// epochs.
TEST_F(DataSamplerTest, AnotherWorkerCountContinuesTheGlobalOrder) {
  const int T = 3, G = 12;
  const TokenFile& file = Counting(101 * T + 1);  // 101 sequences: 8 steps an epoch, 5 dropped
  for (const auto& [w1, w2] : std::vector<std::pair<int, int>>{{2, 3}, {3, 1}, {1, 4}, {4, 2}}) {
    for (int stop : {3, 8, 11}) {  // mid-epoch, at the boundary, in epoch 1
      SCOPED_TRACE("W " + std::to_string(w1) + " -> " + std::to_string(w2) + " after " + std::to_string(stop));
      auto single = DistributedSampler::Create(file, T, 1, 0, 11);
      auto make = [&](int W) {
        std::vector<DistributedSampler> ranks;
        for (int r = 0; r < W; ++r) ranks.push_back(*DistributedSampler::Create(file, T, W, r, 11));
        return ranks;
      };
      std::vector<DistributedSampler> ranks = make(w1);
      std::map<int64_t, std::multiset<int64_t>> taken;  // per epoch: every sequence taken
      for (int step = 0; step < 24; ++step) {
        if (step == stop) {
          const std::string state = ranks[w1 - 1].SaveState();  // any rank's
          ranks = make(w2);
          for (auto& s : ranks) ASSERT_TRUE(s.RestoreState(state).ok());
        }
        const int W = static_cast<int>(ranks.size());
        std::multiset<int64_t> together;
        for (auto& s : ranks) {
          for (int64_t q : Rows(s, G / W, T)) together.insert(q);
        }
        ASSERT_EQ(Multiset(Rows(*single, G, T)), together) << "step " << step;
        taken[ranks[0].epoch()].insert(together.begin(), together.end());
      }
      for (const auto& [epoch, seqs] : taken) {
        EXPECT_EQ(std::set<int64_t>(seqs.begin(), seqs.end()).size(), seqs.size())
            << "a sequence taken twice in epoch " << epoch;
        EXPECT_EQ(seqs.size(), 96u) << "epoch " << epoch << ": sequences skipped";
      }
    }
  }
}

// Another global batch too (--allow-global-batch-change): the workers,
// however many and with whatever batch, take the positions right after
// the ones taken before the change; across the change and the epochs that
// follow, every step is exactly what one process takes with that global
// batch, and no sequence is skipped or taken twice in an epoch.
TEST_F(DataSamplerTest, AnotherGlobalBatchContinuesRightAfterTheLastSequence) {
  const int T = 3;
  const TokenFile& file = Counting(96 * T + 1);  // 96 sequences: every world size here divides them
  struct Split {
    int W, B;
  };
  for (const auto& [before, after] : std::vector<std::pair<Split, Split>>{
           {{3, 4}, {2, 3}}, {{4, 2}, {3, 6}}, {{2, 6}, {4, 5}}, {{1, 12}, {8, 1}}, {{6, 1}, {1, 7}}}) {
    for (int stop : {3, 8, 13}) {
      SCOPED_TRACE("W x B " + std::to_string(before.W) + "x" + std::to_string(before.B) + " -> " +
                   std::to_string(after.W) + "x" + std::to_string(after.B) + " after step " + std::to_string(stop));
      auto single = DistributedSampler::Create(file, T, 1, 0, 5);
      auto make = [&](int W) {
        std::vector<DistributedSampler> ranks;
        for (int r = 0; r < W; ++r) ranks.push_back(*DistributedSampler::Create(file, T, W, r, 5));
        return ranks;
      };
      std::vector<DistributedSampler> ranks = make(before.W);
      Split split = before;
      std::map<int64_t, std::multiset<int64_t>> taken;  // per epoch
      for (int step = 0; step < 30; ++step) {
        if (step == stop) {
          const std::string state = ranks.back().SaveState();
          ranks = make(after.W);
          for (auto& s : ranks) ASSERT_TRUE(s.RestoreState(state).ok());
          split = after;
        }
        std::multiset<int64_t> together;
        for (auto& s : ranks) {
          for (int64_t q : Rows(s, split.B, T)) together.insert(q);
        }
        ASSERT_EQ(Multiset(Rows(*single, split.W * split.B, T)), together) << "step " << step;
        taken[ranks[0].epoch()].insert(together.begin(), together.end());
      }
      for (const auto& [epoch, seqs] : taken) {
        EXPECT_EQ(std::set<int64_t>(seqs.begin(), seqs.end()).size(), seqs.size())
            << "a sequence taken twice in epoch " << epoch;
      }
    }
  }
}

// One sampler taking the shares of several ranks takes what their own
// samplers would, step after step and across epochs.
TEST_F(DataSamplerTest, OneSamplerTakesTheSharesOfSeveralRanks) {
  const int T = 3, W = 4, B = 2;
  const TokenFile& file = Counting(50 * T + 1);  // 12 per rank: 6 steps an epoch
  std::vector<DistributedSampler> ranks;
  for (int r = 0; r < W; ++r) ranks.push_back(*DistributedSampler::Create(file, T, W, r, 3));
  auto standing_in = DistributedSampler::Create(file, T, W, 0, 3);
  const std::vector<int> shares = {1, 3, 0};
  std::vector<int32_t> in(shares.size() * B * T), tg(in.size());
  for (int step = 0; step < 14; ++step) {
    standing_in->NextBatches(B, shares, in.data(), tg.data());
    std::vector<std::vector<int64_t>> own(W);
    for (int r = 0; r < W; ++r) own[r] = Rows(ranks[r], B, T);
    for (size_t i = 0; i < shares.size(); ++i) {
      for (int b = 0; b < B; ++b) {
        EXPECT_EQ(in[(i * B + b) * T] / T, own[shares[i]][b]) << "step " << step << ", share of rank " << shares[i];
      }
    }
    EXPECT_EQ(standing_in->SaveState(), ranks[0].SaveState());
  }
}

TEST_F(DataSamplerTest, TooSmallDatasetIsAClearError) {
  const int T = 8;
  const TokenFile& file = Counting(5 * T + 1);  // 5 sequences
  auto too_many_workers = DistributedSampler::Create(file, T, 6, 0, 1);
  ExpectNamesFile(too_many_workers.status(), file.path(), "fewer than the 6 workers (needs at least 49 tokens)");
  auto s = DistributedSampler::Create(file, T, 2, 1, 1);  // 2 per rank
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->CheckBatch(2).ok());
  ExpectNamesFile(s->CheckBatch(3), file.path(), "fewer than one batch of 3 (needs at least 49 tokens)");
  EXPECT_FALSE(s->CheckBatch(0).ok());
  EXPECT_FALSE(DistributedSampler::Create(file, 0, 1, 0, 1).ok());
  EXPECT_FALSE(DistributedSampler::Create(file, T, 2, 2, 1).ok());
  EXPECT_FALSE(DistributedSampler::Create(file, T, 2, -1, 1).ok());
  std::vector<int32_t> in(3 * T), tg(3 * T);
  EXPECT_DEATH(s->NextBatch(3, in.data(), tg.data()), "CheckBatch");
}

// --------------------------------------------------------------- EvalReader

class DataEvalReaderTest : public DataSamplerTest {};

TEST_F(DataEvalReaderTest, ReadsNonOverlappingWindowsInOrder) {
  const int T = 4, B = 3;
  const TokenFile& file = Counting(5 * B * T + 1);
  auto r = EvalReader::Create(file, T, B, 5);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_batches(), 5);
  EXPECT_EQ(r->tokens_per_batch(), B * T);
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int64_t b = 0; b < 5; ++b) {
    r->ReadBatch(b, in.data(), tg.data());
    for (int j = 0; j < B; ++j) {
      for (int t = 0; t < T; ++t) {
        EXPECT_EQ(in[j * T + t], (b * B + j) * T + t);
        EXPECT_EQ(tg[j * T + t], (b * B + j) * T + t + 1);
      }
    }
  }
  auto all = EvalReader::Create(file, T, 2, 0);  // 0: every full batch
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->num_batches(), (5 * B * T) / (2 * T));
}

TEST_F(DataEvalReaderTest, TooFewTokensNamesTheFileAndTheNeed) {
  const int T = 4, B = 3;
  const TokenFile& file = Counting(5 * B * T);  // one token short of 5 batches
  ExpectNamesFile(EvalReader::Create(file, T, B, 5).status(), file.path(), "60 tokens, but 5 batches of 3x4 need 61");
  EXPECT_TRUE(EvalReader::Create(file, T, B, 4).ok());
  const TokenFile& tiny = Counting(5);
  ExpectNamesFile(EvalReader::Create(tiny, T, B, 0).status(), tiny.path(), "1 batch of 3x4 need 13");
  EXPECT_FALSE(EvalReader::Create(file, 0, B, 1).ok());
}

// ------------------------------------------------------------------ Prepare

class DataPrepareTest : public ScratchTest {
 protected:
  std::string Text(const std::string& token_file) {
    auto f = TokenFile::Open(token_file, 256);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return "";
    std::string s;
    for (int64_t i = 0; i < f->size(); ++i) s.push_back(static_cast<char>((*f)[i]));
    return s;
  }
  Status Prepare(std::vector<std::string> inputs, const std::string& train, const std::string& val = "",
                 double fraction = 0.05) {
    PrepareOptions o;
    o.inputs = std::move(inputs);
    o.train_out = train;
    o.val_out = val;
    o.val_fraction = fraction;
    return PrepareText(o, &summary_);
  }
  PrepareSummary summary_;
};

TEST_F(DataPrepareTest, SplitsFortuneFilesAndKeepsOtherFilesWhole) {
  const std::string fortunes = Write("fortunes",
                                     "%\n"
                                     "First.\n"
                                     "%\n"
                                     "Second,\n  two lines.\n"
                                     "%\r\n"
                                     "   \n"
                                     "%\n"
                                     "Third, no final newline");
  const std::string plain = Write("plain.txt", "100%\n%%\nnot a separator\n");
  ASSERT_TRUE(Prepare({fortunes, plain}, Path("train.bin")).ok());
  EXPECT_EQ(summary_.files, 2);
  EXPECT_EQ(summary_.documents, 4);  // the blank entry is dropped
  EXPECT_EQ(summary_.bytes, static_cast<int64_t>(ReadFile(fortunes)->size() + ReadFile(plain)->size()));
  EXPECT_EQ(Text(Path("train.bin")),
            "First.\nSecond,\n  two lines.\nThird, no final newline\n100%\n%%\nnot a separator\n");
  EXPECT_EQ(summary_.train_tokens, static_cast<int64_t>(Text(Path("train.bin")).size()));
  EXPECT_EQ(summary_.val_tokens, 0);
}

TEST_F(DataPrepareTest, SkipsBinariesLinksAndDuplicateTextsCountingThem) {
  const std::string jokes = Write("jokes", "A joke.\n%\nAnother.\n%\n");
  Write("jokes.dat", std::string("\x00\x00\x00\x02\x00", 5));  // strfile index of `jokes`
  ASSERT_EQ(::symlink("jokes", Path("jokes.u8").c_str()), 0);
  Write("copy", *ReadFile(jokes));
  Write("blob", std::string("MZ\x00\x01", 4));
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(Prepare({jokes, Path("jokes.dat"), Path("jokes.u8"), Path("copy"), Path("blob")}, Path("t.bin")).ok());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(summary_.files, 1);
  EXPECT_EQ(summary_.skipped, 4);
  EXPECT_EQ(summary_.documents, 2);
  EXPECT_EQ(Text(Path("t.bin")), "A joke.\nAnother.\n");
  EXPECT_NE(log.find(Path("blob") + ": contains NUL bytes"), std::string::npos) << log;
  EXPECT_NE(log.find(Path("copy") + ": same bytes as " + jokes), std::string::npos) << log;
  EXPECT_EQ(log.find("jokes.dat"), std::string::npos) << "strfile indexes are skipped quietly: " << log;

  // keep_duplicates: a text file with an earlier one's bytes is read again
  // (the same path, through a link, still once).
  summary_ = {};
  PrepareOptions o;
  o.inputs = {jokes, Path("jokes.u8"), Path("copy")};
  o.train_out = Path("kept.bin");
  o.keep_duplicates = true;
  ASSERT_TRUE(PrepareText(o, &summary_).ok());
  EXPECT_EQ(summary_.files, 2);
  EXPECT_EQ(summary_.skipped, 1);
  EXPECT_EQ(Text(Path("kept.bin")), "A joke.\nAnother.\nA joke.\nAnother.\n");
}

TEST_F(DataPrepareTest, HoldsOutAboutTheFractionDeterministicallyAndWholeDocuments) {
  std::string body;
  std::set<std::string> docs;
  for (int i = 0; i < 2000; ++i) {
    std::string doc = "doc " + std::to_string(i) + " " + std::string(10 + (i * 37) % 50, 'a' + i % 26) + "\n";
    docs.insert(doc);
    body += doc + "%\n";
  }
  const std::string input = Write("corpus", body);
  ASSERT_TRUE(Prepare({input}, Path("a/train.bin"), Path("a/val.u16"), 0.2).ok());
  EXPECT_EQ(summary_.documents, 2000);
  const double share = static_cast<double>(summary_.val_tokens) / (summary_.train_tokens + summary_.val_tokens);
  EXPECT_GT(share, 0.16);
  EXPECT_LT(share, 0.24);
  EXPECT_GT(summary_.val_documents, 320);
  EXPECT_LT(summary_.val_documents, 480);
  // Every document lands whole on exactly one side.
  auto lines = [](const std::string& text) {
    std::multiset<std::string> out;
    for (size_t pos = 0; pos < text.size();) {
      const size_t eol = text.find('\n', pos);
      out.insert(text.substr(pos, eol + 1 - pos));
      pos = eol + 1;
    }
    return out;
  };
  std::multiset<std::string> train = lines(Text(Path("a/train.bin"))), val = lines(Text(Path("a/val.u16")));
  EXPECT_EQ(static_cast<int64_t>(val.size()), summary_.val_documents);
  std::multiset<std::string> both = train;
  both.insert(val.begin(), val.end());
  EXPECT_EQ(both, std::multiset<std::string>(docs.begin(), docs.end()));
  // The same inputs give the same files.
  ASSERT_TRUE(Prepare({input}, Path("b/train.bin"), Path("b/val.u16"), 0.2).ok());
  EXPECT_EQ(*ReadFile(Path("a/train.bin")), *ReadFile(Path("b/train.bin")));
  EXPECT_EQ(*ReadFile(Path("a/val.u16")), *ReadFile(Path("b/val.u16")));
}

TEST_F(DataPrepareTest, NeitherSideIsEverEmpty) {
  // One document: its tail is held out; together the files are the text.
  const std::string one = Write("one.txt", "hello world, this is all the text there is\n");
  ASSERT_TRUE(Prepare({one}, Path("t1.bin"), Path("v1.bin"), 0.25).ok());
  EXPECT_EQ(Text(Path("t1.bin")) + Text(Path("v1.bin")), *ReadFile(one));
  EXPECT_EQ(summary_.val_tokens, static_cast<int64_t>(ReadFile(one)->size() / 4));
  // Two documents that the hash keeps in train: the last one moves over.
  const std::string two = Write("two", "first\n%\nsecond\n");
  ASSERT_TRUE(Prepare({two}, Path("t2.bin"), Path("v2.bin"), 1e-12).ok());
  EXPECT_EQ(Text(Path("t2.bin")), "first\n");
  EXPECT_EQ(Text(Path("v2.bin")), "second\n");
  // And when it sends everything to val, the first one comes back.
  ASSERT_TRUE(Prepare({two}, Path("t3.bin"), Path("v3.bin"), 1 - 1e-12).ok());
  EXPECT_EQ(Text(Path("t3.bin")), "first\n");
  EXPECT_EQ(Text(Path("v3.bin")), "second\n");
}

TEST_F(DataPrepareTest, BadArgumentsAndInputsAreClearErrors) {
  const std::string text = Write("text", "some text\n");
  auto expect = [&](Status st, const std::string& needle) {
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  };
  const auto before = Listing();
  expect(Prepare({}, Path("t.bin")), "no input files");
  expect(Prepare({text}, ""), "no output file");
  expect(Prepare({text}, Path("t.bin"), Path("v.bin"), 0), "val_fraction must be in (0, 1)");
  expect(Prepare({text}, Path("t.bin"), Path("v.bin"), 1), "val_fraction must be in (0, 1)");
  expect(Prepare({text}, Path("t.bin"), Path("t.bin"), 0.5), "both the train and the val output");
  expect(Prepare({text, Path("absent.txt")}, Path("t.bin")), Path("absent.txt") + ": no such file");
  expect(Prepare({dir_}, Path("t.bin")), dir_ + ": is a directory");
  expect(Prepare({Write("empty", "")}, Path("t.bin")), "no text in the 1 input file(s)");
  EXPECT_EQ(Listing().size(), before.size() + 1);    // "empty" only
  ASSERT_TRUE(Prepare({text}, Path("t.u16")).ok());  // raw output
  EXPECT_EQ(TokenFile::Open(Path("t.u16"), 256)->width(), 2);
}

TEST_F(DataPrepareTest, UnwritableOutputLeavesNoFileBehind) {
  const std::string text = Write("text", "line one\n%\nline two\n%\nline three\n");
  Write("blocker", "a file where a directory should be");
  const auto before = Listing();
  Status st = Prepare({text}, Path("blocker/train.bin"), Path("val.bin"), 0.3);
  ExpectNamesFile(st, Path("blocker/train.bin"), "blocker");
  // The val file is unwritable: train must not appear either, since
  // EnsurePrepared takes an existing train file as done.
  st = Prepare({text}, Path("train.bin"), Path("blocker/val.bin"), 0.3);
  ExpectNamesFile(st, Path("blocker/val.bin"), "blocker");
  st = Prepare({text}, Path("train.bin"), "/proc/herd_no_such_dir/val.bin", 0.3);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/proc/herd_no_such_dir"), std::string::npos) << st.message();
  EXPECT_EQ(Listing(), before);
}

// ------------------------------------------------------------ EnsurePrepared

class DataEnsurePreparedTest : public DataPrepareTest {
 protected:
  config::DataConfig Config(const std::string& train, const std::string& val) {
    config::DataConfig data;
    data.set_train(train);
    if (!val.empty()) data.set_val(val);
    return data;
  }
};

TEST_F(DataEnsurePreparedTest, ExistingTrainFileIsLeftAlone) {
  ASSERT_TRUE(WriteTokenFile(Path("train.bin"), {1, 2, 3}).ok());
  const std::string bytes = *ReadFile(Path("train.bin"));
  config::DataConfig data = Config(Path("train.bin"), Path("val.bin"));
  data.add_prepare_from(Path("nothing*"));
  EXPECT_TRUE(EnsurePrepared(data).ok());
  EXPECT_EQ(*ReadFile(Path("train.bin")), bytes);
  EXPECT_FALSE(PathExists(Path("val.bin")));
}

TEST_F(DataEnsurePreparedTest, NothingToPrepareFromNamesDataTrain) {
  config::DataConfig data = Config(Path("out/train.bin"), "");
  Status st = EnsurePrepared(data);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("data.train: " + Path("out/train.bin") + ": no such file"), std::string::npos)
      << st.message();
  const std::string pattern = Path("texts/*");
  data.add_prepare_from(pattern);
  st = EnsurePrepared(data);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'" + pattern + "' matches no file"), std::string::npos) << st.message();
  ASSERT_EQ(::mkdir(Path("texts").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(Path("texts/sub").c_str(), 0755), 0);
  st = EnsurePrepared(data);  // a directory is not a match
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("matches no file"), std::string::npos) << st.message();
  EXPECT_FALSE(PathExists(Path("out")));
}

TEST_F(DataEnsurePreparedTest, PreparesTrainAndValOnce) {
  ASSERT_EQ(::mkdir(Path("texts").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(Path("texts/sub").c_str(), 0755), 0);
  std::string body;
  for (int i = 0; i < 300; ++i) body += "Entry " + std::to_string(i) + " of the corpus.\n%\n";
  Write("texts/a", body);
  Write("texts/a.dat", std::string("\0\0\1", 3));
  ASSERT_EQ(::symlink("a", Path("texts/a.u8").c_str()), 0);
  Write("texts/b", "A whole file, one document.\n");
  config::DataConfig data = Config(Path("out/train.bin"), Path("out/val.bin"));
  data.add_prepare_from(Path("texts/*"));
  data.set_val_fraction(0.1);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  Status st = EnsurePrepared(data);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_EQ(out.rfind("prepared " + Path("out/train.bin"), 0), 0u) << out;
  EXPECT_NE(out.find(Path("out/val.bin")), std::string::npos) << out;
  EXPECT_NE(out.find("301 documents in 2 files (2 skipped)"), std::string::npos) << out;
  EXPECT_EQ(err, "");
  auto train = TokenFile::Open(Path("out/train.bin"), 256);
  auto val = TokenFile::Open(Path("out/val.bin"), 256);
  ASSERT_TRUE(train.ok() && val.ok());
  const double share = static_cast<double>(val->size()) / (train->size() + val->size());
  EXPECT_GT(share, 0.04);
  EXPECT_LT(share, 0.2);
  const std::string bytes = *ReadFile(Path("out/train.bin"));
  ::testing::internal::CaptureStdout();
  ASSERT_TRUE(EnsurePrepared(data).ok());
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");  // already there: nothing to do
  EXPECT_EQ(*ReadFile(Path("out/train.bin")), bytes);
}

// Debian's fortunes package: the default job's corpus. Every binary in it
// is a strfile index and every *.u8 a link, so nothing is read twice and
// nothing is warned about.
TEST_F(DataEnsurePreparedTest, DebianFortunesCorpus) {
  const std::string dir = "/usr/share/games/fortunes";
  if (!PathExists(dir + "/fortunes")) GTEST_SKIP() << "Debian's fortunes package is not installed";
  int64_t texts = 0, others = 0, text_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory()) continue;
    const bool text = !e.is_symlink() && !name.ends_with(".dat");
    (text ? texts : others) += 1;
    if (text) text_bytes += static_cast<int64_t>(e.file_size());
  }
  config::DataConfig data = Config(Path("f/train.bin"), Path("f/val.bin"));
  data.add_prepare_from(dir + "/*");
  data.set_val_fraction(0.05);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  Status st = EnsurePrepared(data);
  ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(err, "");
  PrepareSummary s;
  PrepareOptions o;
  o.inputs = Glob(dir + "/*");
  o.train_out = Path("g/train.bin");
  o.val_out = Path("g/val.bin");
  ASSERT_TRUE(PrepareText(o, &s).ok());
  EXPECT_EQ(s.files, texts);
  EXPECT_EQ(s.skipped, others);
  EXPECT_EQ(s.bytes, text_bytes);
  EXPECT_GT(s.documents, 10000);
  EXPECT_EQ(*ReadFile(Path("f/train.bin")), *ReadFile(Path("g/train.bin")));
  const double share = static_cast<double>(s.val_tokens) / (s.train_tokens + s.val_tokens);
  EXPECT_GT(share, 0.04);
  EXPECT_LT(share, 0.06);
}

// ------------------------------------------------------------ herd prepare

class DataPrepareCommandTest : public ScratchTest {
 protected:
  // Runs the herd binary in the scratch directory: exit code and output.
  int Herd(const std::string& args, std::string* out) {
    const std::string cmd = "cd " + dir_ + " && " + herd_ + " " + args + " 2>&1";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    char buf[4096];
    out->clear();
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out->append(buf, n);
    const int status = ::pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string herd_ = std::string(HERD_BINARY_DIR) + "/herd";
};

TEST_F(DataPrepareCommandTest, SummaryLineAndOneLineErrors) {
  if (!PathExists(herd_)) GTEST_SKIP() << herd_ << " is not built";
  Write("a.txt", "alpha\n%\nbeta\n%\ngamma\n%\ndelta\n");
  std::string out;
  ASSERT_EQ(Herd("prepare a.txt --out t.bin --val-out v.bin --val-fraction 0.3", &out), 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("prepared 4 documents (29 bytes) from 1 files (0 skipped): t.bin"), std::string::npos) << out;
  EXPECT_TRUE(TokenFile::Open(Path("v.bin"), 256).ok());
  const auto before = Listing();
  struct Case {
    const char* args;
    const char* needle;
  };
  for (const Case& c :
       {Case{"prepare a.txt", "usage: herd prepare"},
        Case{"prepare a.txt --out x.bin --val-fraction 0.1", "--val-fraction needs --val-out"},
        Case{"prepare a.txt --out x.bin --val-out y.bin --val-fraction 1.5", "expected a number in (0, 1)"},
        Case{"prepare a.txt --out x.bin --val-out y.bin --val-fraction abc", "got 'abc'"},
        Case{"prepare a.txt --out x.bin --bogus 1", "unknown option --bogus"},
        Case{"prepare nope.txt --out x.bin", "nope.txt: no such file"},
        Case{"prepare a.txt --out /proc/herd_x/x.bin", "/proc/herd_x"}}) {
    SCOPED_TRACE(c.args);
    EXPECT_NE(Herd(c.args, &out), 0);
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_EQ(out.rfind("herd: error: ", 0), 0u) << out;
    EXPECT_NE(out.find(c.needle), std::string::npos) << out;
  }
  EXPECT_EQ(Listing(), before);
}


// ---- tokenizers ------------------------------------------------------------

// The pieces `pattern` cuts `text` (UTF-8) into.
std::vector<std::string> Pieces(const std::string& pattern, const std::string& text) {
  auto re = TokenRegex::Compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status().ToString();
  if (!re.ok()) return {};
  std::u32string cps;
  std::vector<size_t> offsets;
  for (size_t i = 0; i < text.size();) {
    int length;
    cps.push_back(unicode::DecodeUtf8(text, i, &length));
    offsets.push_back(i);
    i += static_cast<size_t>(length);
  }
  offsets.push_back(text.size());
  std::vector<std::pair<uint32_t, uint32_t>> found;
  re->FindAll(cps.data(), cps.size(), &found);
  std::vector<std::string> out;
  for (auto [b, e] : found) out.push_back(text.substr(offsets[b], offsets[e] - offsets[b]));
  return out;
}

using Strings = std::vector<std::string>;

TEST(TokenRegex, MatchesAsOnigurumaDoes) {
  const std::string gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  // Leftmost-first alternatives; the lookahead leaves one space to the word.
  EXPECT_EQ(Pieces(gpt2, "He's  here 123!!\n"), (Strings{"He", "'s", " ", " here", " 123", "!!", "\n"}));
  EXPECT_EQ(Pieces(gpt2, "naïve 中文 ٣٤"), (Strings{"naïve", " 中文", " ٣٤"}));
  // Case-insensitive contractions, including the long s Unicode folds to s.
  EXPECT_EQ(Pieces(R"((?i:'s|'ll)|\p{L}+)", "IT'S WE'LL it'ſ"), (Strings{"IT", "'S", "WE", "'LL", "it", "'ſ"}));
  EXPECT_EQ(Pieces(R"(\p{N}{1,3})", "1234567"), (Strings{"123", "456", "7"}));
  EXPECT_EQ(Pieces("a+?", "aaa"), (Strings{"a", "a", "a"}));
  EXPECT_EQ(Pieces("a{2,}", "aaaaa a"), (Strings{"aaaaa"}));
  EXPECT_EQ(Pieces(R"([^\r\n\p{L}\p{N}]?\p{L}+)", "x,yz\nw"), (Strings{"x", ",yz", "w"}));
  EXPECT_EQ(Pieces(R"(\s*[\r\n]+|\S+)", "a \r\n\n b"), (Strings{"a", " \r\n\n", "b"}));
  EXPECT_EQ(Pieces(R"([a-c\x{1F600}-\x{1F64F}]+)", "abd😀😃e"), (Strings{"ab", "😀😃"}));
  EXPECT_EQ(Pieces(R"(\d+|\w+)", "ab_1 ٣"), (Strings{"ab_1", "٣"}));
}

TEST(TokenRegex, RefusesWhatItDoesNotImplementNamingWhere) {
  for (const char* bad : {"^a", "a$", "(a*)*", "a++", R"(\q)", "[a", "(?<=a)b", "(a", "a)", "*a", R"(\p{Xx})",
                          "a{3,1}"}) {
    auto re = TokenRegex::Compile(bad);
    ASSERT_FALSE(re.ok()) << bad;
    EXPECT_NE(re.status().message().find("at offset"), std::string::npos) << re.status().message();
  }
}

// A byte-level BPE tokenizer.json: the 256 byte symbols, the merges given
// (spelled in GPT-2's byte alphabet: Ġ is a space), and their results.
std::string TokenizerJson(const std::vector<std::pair<std::string, std::string>>& merges,
                          const std::string& extra = "", bool ignore_merges = false) {
  nlohmann::json vocab = nlohmann::json::object(), list = nlohmann::json::array();
  int id = 0, extra_chars = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? b : 256 + extra_chars++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[s] = id++;
  }
  for (const auto& [l, r] : merges) {
    if (!vocab.contains(l + r)) vocab[l + r] = id++;
    list.push_back(l + " " + r);
  }
  nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", list}, {"ignore_merges", ignore_merges}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                      {"added_tokens", {{{"id", id}, {"content", "<|endoftext|>"}, {"special", true}}}}};
  if (!extra.empty()) j.merge_patch(nlohmann::json::parse(extra));
  return j.dump();
}

class TokenizerTest : public DataPrepareTest {
 protected:
  std::vector<int32_t> Encode(const std::string& json, const std::string& text) {
    auto t = Tokenizer::Load(Write("tokenizer.json", json));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    Tokenizer::Cache cache;
    std::vector<int32_t> ids;
    (*t)->Encode(text, &cache, &ids);
    return ids;
  }
};

TEST_F(TokenizerTest, MergesLowestRankFirstAndLeftmostAmongEqualRanks) {
  // Ranks: "t h" 0 (id 256), "th e" 1 (257), "Ġ the" 2 (258), "e e" 3 (259).
  const std::string json = TokenizerJson({{"t", "h"}, {"th", "e"}, {"Ġ", "the"}, {"e", "e"}});
  EXPECT_EQ(Encode(json, "the the"), (std::vector<int32_t>{257, 258}));
  // "eee": the leftmost pair merges first.
  EXPECT_EQ(Encode(json, "eee"), (std::vector<int32_t>{259, 'e'}));
  // Any byte, valid UTF-8 or not, has its token (byte b is id b here).
  EXPECT_EQ(Encode(json, "\xff\x01"), (std::vector<int32_t>{0xff, 0x01}));
  // Special tokens written in the text are text.
  EXPECT_GT(Encode(json, "<|endoftext|>").size(), 1u);
}

TEST_F(TokenizerTest, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  // "b c" outranks "a b", so merging leaves a + bc, which no merge joins;
  // "abc" is in the vocabulary all the same.
  const std::string merges_only = TokenizerJson({{"b", "c"}, {"a", "b"}, {"ab", "c"}});
  EXPECT_EQ(Encode(merges_only, "abc").size(), 2u);  // a + bc: no merge makes abc from them
  const std::string ignoring = TokenizerJson({{"b", "c"}, {"a", "b"}, {"ab", "c"}}, "", true);
  EXPECT_EQ(Encode(ignoring, "abc").size(), 1u);
}

TEST_F(TokenizerTest, RefusesWhatWouldEncodeDifferentlyInOneLine) {
  const std::string base = TokenizerJson({{"t", "h"}});
  const std::pair<std::string, std::string> cases[] = {
      {R"({"normalizer": {"type": "NFKC"}})", "normalizer 'NFKC' is not supported"},
      {R"({"model": {"type": "Unigram"}})", "model type 'Unigram'"},
      {R"({"model": {"byte_fallback": true}})", "byte_fallback"},
      {R"({"model": {"dropout": 0.1}})", "BPE dropout"},
      {R"({"pre_tokenizer": {"type": "Metaspace"}})", "pre_tokenizer 'Metaspace' is not supported"},
      {R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "^x"}, "behavior": "Isolated"}})", "an anchor"},
      {R"({"model": {"merges": ["t h", "x yz"]}})", "model.merges[1]"},
      {R"({"added_tokens": [{"id": 300, "content": "<x>", "special": false, "lstrip": true}]})", "sets lstrip"},
  };
  for (const auto& [patch, needle] : cases) {
    nlohmann::json j = nlohmann::json::parse(base);
    j.merge_patch(nlohmann::json::parse(patch));
    auto t = Tokenizer::Load(Write("bad.json", j.dump()));
    ASSERT_FALSE(t.ok()) << patch;
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(Path("bad.json")), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos) << t.status().message();
  }
  auto tiktoken = Tokenizer::Load(Write("tokenizer.model", "IQ== 0\nIg== 1\n"));
  ASSERT_FALSE(tiktoken.ok());
  EXPECT_NE(tiktoken.status().message().find("tiktoken"), std::string::npos) << tiktoken.status().message();
}

TEST_F(TokenizerTest, PrepareStartsEveryDocumentWithTheDocumentTokenAndRecordsTheVocabulary) {
  const std::string json = Write("tokenizer.json", TokenizerJson({{"t", "h"}, {"th", "e"}}));
  const std::string corpus = Write("c.jsonl", "{\"text\": \"the\"}\n\n{\"text\": \"  \"}\n{\"text\": \"the th\"}\n");
  PrepareOptions o;
  o.inputs = {corpus};
  o.train_out = Path("t.bin");
  o.tokenizer = json;
  ASSERT_TRUE(PrepareText(o, &summary_).ok());
  auto f = TokenFile::Open(Path("t.bin"), 0);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->vocab_size(), 259);
  std::vector<int32_t> ids(static_cast<size_t>(f->size()));
  f->Read(0, f->size(), ids.data());
  const int32_t eot = 258, the = 257, th = 256;
  EXPECT_EQ(ids, (std::vector<int32_t>{eot, the, eot, the, ' ', th}));
  EXPECT_EQ(summary_.documents, 2);  // the blank line and the blank document are skipped

  const std::string bad = Write("bad.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"no\"}\n");
  o.inputs = {bad};
  o.train_out = Path("t2.bin");
  const Status st = PrepareText(o, &summary_);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(bad + ":2: no \"text\" string"), std::string::npos) << st.message();
  EXPECT_FALSE(PathExists(Path("t2.bin")));
}

}  // namespace
}  // namespace herd
