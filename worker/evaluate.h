// Held-out loss and text generation with a Llama on any device: used at the end of
// training, every log.eval_every steps, and by `herd eval`.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "data/token_file.h"
#include "model/model.h"
#include "sharding/job_options.h"

namespace herd {

struct EvalResult {
  double loss = 0;     // mean cross-entropy, nats per token
  int64_t tokens = 0;  // tokens scored
};

// Mean loss over the first batches*B windows of T+1 tokens of `file`, in
// order, non-overlapping (window w starts at token w*T). batches <= 0 means
// every full batch the file holds. The model must fit B x T.
// `need`, when given, is every forward's (model/model.h): a worker that
// streams its weights brings them in there.
StatusOr<EvalResult> EvaluateLoss(Model& model, const float* params, const TokenFile& file, int B, int T,
                                  int64_t batches, const Model::NeedUpTo& need = nullptr);

// Continues `prompt` (token ids) by `count` tokens: greedy when temperature
// is 0, else sampling from softmax(logits / temperature) with a seeded RNG.
// Uses at most the model's max_seq_len most recent tokens as context.
std::vector<int32_t> Generate(Model& model, const float* params, std::vector<int32_t> prompt, int count,
                              double temperature, uint64_t seed, const Model::NeedUpTo& need = nullptr);

// The training loop's held-out loss (the job's log.eval_batches of its
// B x T from `val`); NaN, with a warning, when there is no val file or it
// is too short.
double ValidationLoss(Model& model, const float* params, const TokenFile* val, const JobOptions& job,
                      const Model::NeedUpTo& need = nullptr);

// The end-of-training text sample (log.sample_tokens from
// log.sample_prompt, encoded with data.tokenizer when the job has one, else
// byte-level), as the lines to print; empty when there is none.
std::string SampleText(Model& model, const float* params, const JobOptions& job,
                       const Model::NeedUpTo& need = nullptr);

}  // namespace herd
