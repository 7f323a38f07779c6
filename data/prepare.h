// Text to token files with the byte-level tokenizer (each UTF-8 byte is a
// token id 0..255; vocab 256).
//
// Inputs are split into documents — fortune files (lines holding only "%")
// into their fortunes, any other file is one document — and whole
// documents go to the validation file, deterministically by a hash of
// their index, so that about val_fraction of the text is held out.
// Binary files (containing NUL bytes) and paths that resolve to a file
// already read (symlinks such as fortunes' *.u8) are skipped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/herd.pb.h"

namespace herd {

struct PrepareOptions {
  std::vector<std::string> inputs;  // file paths
  std::string train_out;
  std::string val_out;  // empty: everything goes to train_out
  double val_fraction = 0.05;
};

struct PrepareSummary {
  int64_t files = 0, skipped = 0, documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
};

Status PrepareText(const PrepareOptions& options, PrepareSummary* summary);

// For `herd launch`: when data.train does not exist and data.prepare_from
// names text files (globs), prepares data.train (and data.val) from them.
Status EnsurePrepared(const config::DataConfig& data);

}  // namespace herd
