#include "worker/evaluate.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "common/rng.h"
#include "common/strings.h"
#include "data/sampler.h"
#include "data/tokenizer.h"

namespace herd {

StatusOr<EvalResult> EvaluateLoss(Model& model, const float* params, const TokenFile& file, int B, int T,
                                  int64_t batches, const Model::NeedUpTo& need) {
  HERD_ASSIGN_OR_RETURN(EvalReader reader, EvalReader::Create(file, T, B, std::max<int64_t>(batches, 0)));
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  double total = 0;
  for (int64_t b = 0; b < reader.num_batches(); ++b) {
    reader.ReadBatch(b, inputs.data(), targets.data());
    total += model.Forward(params, inputs.data(), targets.data(), B, T, need);
  }
  EvalResult r;
  r.loss = total / static_cast<double>(reader.num_batches());
  r.tokens = reader.num_batches() * reader.tokens_per_batch();
  return r;
}

std::vector<int32_t> Generate(Model& model, const float* params, std::vector<int32_t> tokens, int count,
                              double temperature, uint64_t seed, const Model::NeedUpTo& need) {
  Rng rng(seed);
  const int V = model.vocab_size();
  std::vector<double> probs(V);
  if (tokens.empty()) tokens.push_back(0);
  for (int n = 0; n < count; ++n) {
    const int T = std::min<int>(static_cast<int>(tokens.size()), model.max_seq_len());
    const int32_t* context = tokens.data() + tokens.size() - T;
    model.Forward(params, context, nullptr, 1, T, need);
    const float* logits = model.LastLogits(T);
    int32_t next = 0;
    if (temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
    } else {
      const double mx = *std::max_element(logits, logits + V);
      double sum = 0;
      for (int i = 0; i < V; ++i) sum += probs[i] = std::exp((logits[i] - mx) / temperature);
      double u = rng.Uniform() * sum;
      next = V - 1;
      for (int i = 0; i < V; ++i) {
        if ((u -= probs[i]) < 0) {
          next = i;
          break;
        }
      }
    }
    tokens.push_back(next);
  }
  return tokens;
}

double ValidationLoss(Model& model, const float* params, const TokenFile* val, const JobOptions& job,
                      const Model::NeedUpTo& need) {
  if (val == nullptr) return NAN;
  auto r = EvaluateLoss(model, params, *val, job.batch, job.seq_len, job.log.eval_batches, need);
  if (!r.ok()) {
    LOG(WARNING) << "evaluation skipped: " << r.status().message();
    return NAN;
  }
  return r->loss;
}

std::string SampleText(Model& model, const float* params, const JobOptions& job, const Model::NeedUpTo& need) {
  const JobOptions::Log& log = job.log;
  if (log.sample_tokens <= 0) return "";
  // With data.tokenizer the prompt is encoded by it, after the token that
  // starts every prepared document; otherwise the model is byte-level.
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> prompt;
  if (!job.tokenizer.empty()) {
    auto loaded = Tokenizer::Load(job.tokenizer);
    if (!loaded.ok()) {
      LOG(WARNING) << "no text sample: " << loaded.status().message();
      return "";
    }
    tokenizer = std::move(loaded).value();
    if (tokenizer->document_token() >= 0) prompt.push_back(tokenizer->document_token());
    Tokenizer::Cache cache;
    tokenizer->Encode(log.sample_prompt, &cache, &prompt);
  } else {
    if (job.shape.vocab_size < 256) return "";
    for (unsigned char c : log.sample_prompt) prompt.push_back(c);
  }
  const size_t prompt_tokens = prompt.size();
  std::vector<int32_t> out =
      Generate(model, params, prompt, log.sample_tokens, log.sample_temperature, job.seed, need);
  std::string text;
  for (size_t i = 0; i < out.size(); ++i) {
    if (tokenizer == nullptr) {
      text.push_back(static_cast<char>(out[i] & 0xff));
    } else if (i + 1 > prompt_tokens || out[i] != tokenizer->document_token()) {
      text.append(tokenizer->Bytes(out[i]));
    }
  }
  // A model may emit any bytes: what is printed is valid UTF-8.
  char head[64];
  std::snprintf(head, sizeof head, "sample (temperature %.2f):\n", log.sample_temperature);
  return head + PrintableUtf8(text) + "\n";
}

}  // namespace herd
