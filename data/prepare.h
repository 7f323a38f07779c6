// Text to token files. With a tokenizer (a HuggingFace tokenizer.json,
// data/tokenizer.h) each document is its document token (end-of-text,
// or the beginning-of-text token its post-processor adds) followed by its
// ids, as llm.c's data scripts write them; without one, every byte of the
// (UTF-8) text is one token id 0..255 (a vocabulary of 256) and every
// document ends with a newline. The files record the vocabulary size
// (TokenFileWriter).
//
// Inputs are split into documents — a JSON Lines file (*.jsonl) into the
// "text" of each line, read a line at a time; fortune files (entries
// separated by lines holding only "%", which are dropped) into their
// entries; any other file is one document — and each document goes whole
// to the validation
// file or to the training file, decided by a hash of its index, so that
// about val_fraction of the documents (and so, roughly, of the text) is
// held out. The split is deterministic: the same inputs in the same order
// give the same files. Every document ends with a newline in the output.
//
// Skipped, and counted in PrepareSummary::skipped: a path that resolves to
// a file already read (e.g. fortunes' *.u8 symlinks to the plain files), a
// text file whose bytes equal an earlier input's (unless keep_duplicates:
// the same text twice, on purpose), and binary files (any NUL
// byte): strfile indexes (NAME.dat next to NAME, as fortunes ships)
// quietly, others with a LOG(WARNING) naming them. Documents without any
// non-blank character are dropped.
//
// Memory: documents are encoded 32 MiB at a time on every core (OpenMP),
// so it is bounded by that, the largest text file (read whole) and the
// largest document, whatever the corpus size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/token_file.h"
#include "proto/herd.pb.h"

namespace herd {

// With a tokenizer, what becomes of bytes that are not UTF-8 (HuggingFace's
// `tokenizers` takes only text, so no pipeline of theirs gives ids for
// them): refuse the input in one line naming the file and the byte's
// offset; replace each ill-formed sequence by U+FFFD as Python's
// errors="replace" does (the ids `tokenizers` gives for that text); or skip
// the document that holds them. Byte-level preparation keeps every byte.
enum class InvalidUtf8 { kRefuse, kReplace, kSkip };

struct PrepareOptions {
  std::vector<std::string> inputs;  // paths of text files
  std::string train_out;            // token file (format from its name)
  std::string val_out;              // empty: everything goes to train_out
  double val_fraction = 0.05;       // in (0, 1) when val_out is set
  std::string tokenizer;            // tokenizer.json; empty: byte-level
  std::string document_token;       // overrides Tokenizer::document_token()
  InvalidUtf8 invalid_utf8 = InvalidUtf8::kRefuse;  // with a tokenizer
  bool keep_duplicates = false;     // read a text file even when its bytes equal an earlier one's
  bool progress = false;            // progress lines on stderr (data/prepare.cc's Progress)
};

struct PrepareSummary {
  int64_t files = 0;      // text files read
  int64_t skipped = 0;    // inputs skipped (see above)
  int64_t bytes = 0;      // bytes of text read from those files
  int64_t documents = 0;  // documents found in them
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t val_documents = 0;
  int64_t invalid_utf8_documents = 0;  // with a tokenizer: documents replaced in, or skipped
  int vocab_size = 0;           // 256 byte-level, else the tokenizer's
  int32_t document_token = -1;  // with a tokenizer
};

// Reads the inputs and writes train_out (and val_out). Both files are
// written atomically and neither is renamed into place until both are
// fully written, so a failure (bad input, a bad tokenizer, unwritable
// directory) leaves no new file behind. When the hash puts no document on one side, one
// document is moved over (or, with a single document, its tail is held
// out) so that neither file is empty.
Status PrepareText(const PrepareOptions& options, PrepareSummary* summary);

// For `herd launch`: nothing when data.train exists. Otherwise, when
// data.prepare_from names text files (glob patterns; directories among the
// matches are skipped) and data.val (when set) does not exist either,
// prepares data.train (and data.val) from them with data.val_fraction and
// prints one line saying so; fails naming data.train when there is nothing
// to prepare from, or when data.val exists (it is never replaced).
Status EnsurePrepared(const config::DataConfig& data);

// A training job's token files: data.train, and data.val when set, opened
// (after EnsurePrepared) and checked against the vocabulary.
struct JobData {
  TokenFile train;
  std::unique_ptr<TokenFile> val;  // null without data.val
};
StatusOr<JobData> OpenJobData(const config::DataConfig& data, int vocab_size);

}  // namespace herd
