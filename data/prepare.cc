#include "data/prepare.h"

#include <glog/logging.h>
#include <sys/stat.h>

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/rng.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

namespace herd {
namespace {

std::string N(int64_t v) { return std::to_string(v); }

bool IsFortuneSeparator(std::string_view line) { return line == "%\n" || line == "%" || line == "%\r\n"; }

bool HasText(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") != std::string_view::npos; }

using DocumentSink = std::function<Status(std::string&&)>;

// The documents of one text file: the pieces between "%" lines (a file
// without such a line is one piece), each ending in a newline; pieces
// without any text are dropped.
Status SplitDocuments(const std::string& text, const DocumentSink& sink) {
  auto flush = [&](size_t from, size_t to) -> Status {
    std::string piece = text.substr(from, to - from);
    if (!HasText(piece)) return Status::OK();
    if (piece.back() != '\n') piece.push_back('\n');
    return sink(std::move(piece));
  };
  size_t doc_begin = 0, pos = 0;
  while (pos < text.size()) {
    const size_t eol = text.find('\n', pos);
    const size_t next = eol == std::string::npos ? text.size() : eol + 1;
    if (IsFortuneSeparator(std::string_view(text.data() + pos, next - pos))) {
      HERD_RETURN_IF_ERROR(flush(doc_begin, pos));
      doc_begin = next;
    }
    pos = next;
  }
  return flush(doc_begin, text.size());
}

// With --invalid-utf8 replace or skip, a document (or a JSON line) that
// is not UTF-8: mended in place and counted; false when it is to be
// skipped.
bool MendInvalidUtf8(InvalidUtf8 policy, std::string* text, PrepareSummary* summary) {
  if (unicode::FirstInvalidUtf8(*text) == std::string::npos) return true;
  ++summary->invalid_utf8_documents;
  if (policy == InvalidUtf8::kSkip) return false;
  *text = unicode::ReplaceInvalidUtf8(*text);
  return true;
}

Status RefuseInvalidUtf8(const std::string& path, int64_t offset, char byte, const std::string& where) {
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%02x", static_cast<unsigned char>(byte));
  return Status::InvalidArgument(path + ": invalid UTF-8 at byte " + N(offset) + where + " (" + hex +
                                 "); a tokenizer encodes text: --invalid-utf8 replace or skip to go on");
}

// The documents of a JSON Lines file, read a line at a time: each line an
// object whose "text" is the document (blank lines are skipped), with a
// newline added where it has none when `newline`.
Status ReadJsonLines(const std::string& path, bool newline, const InvalidUtf8* invalid, PrepareSummary* summary,
                     const DocumentSink& sink) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError(path + ": cannot read: " + std::strerror(errno));
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    const int64_t line_offset = summary->bytes;
    summary->bytes += static_cast<int64_t>(line.size()) + 1;
    if (!HasText(line)) continue;
    // JSON is UTF-8: the line is mended (or refused, or skipped) before it is parsed.
    if (invalid != nullptr && *invalid == InvalidUtf8::kRefuse) {
      const size_t bad = unicode::FirstInvalidUtf8(line);
      if (bad != std::string::npos) {
        return RefuseInvalidUtf8(path, line_offset + static_cast<int64_t>(bad), line[bad], " (line " + N(number) + ")");
      }
    } else if (invalid != nullptr && !MendInvalidUtf8(*invalid, &line, summary)) {
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument(path + ":" + N(number) + ": not a JSON object (a .jsonl file holds one per line)");
    }
    const auto text = j.find("text");
    if (text == j.end() || !text->is_string()) {
      return Status::InvalidArgument(path + ":" + N(number) + ": no \"text\" string");
    }
    std::string doc = text->get<std::string>();
    if (!HasText(doc)) continue;
    if (newline && doc.back() != '\n') doc.push_back('\n');
    HERD_RETURN_IF_ERROR(sink(std::move(doc)));
  }
  if (in.bad()) return Status::IOError(path + ": read failed: " + std::strerror(errno));
  return Status::OK();
}

// strfile(1) writes NAME.dat, a binary table of entry offsets, next to each
// fortune file NAME; Debian's fortunes package ships them in the same
// directory, so a glob over it picks them up. They are indexes, not text.
bool IsStrfileIndex(const std::string& path) {
  if (!path.ends_with(".dat")) return false;
  struct stat st;
  const std::string text_file = path.substr(0, path.size() - 4);
  return ::stat(text_file.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Calls sink with every document of the inputs, in order, skipping what
// prepare.h says; counts files and bytes into *summary. Documents end with
// a newline when `newline` (text files' always do). `invalid`: what to do
// with bytes that are not UTF-8 (null: keep them, byte-level).
Status ReadInputs(const std::vector<std::string>& inputs, bool newline, const InvalidUtf8* invalid,
                  bool keep_duplicates, PrepareSummary* summary, const DocumentSink& sink) {
  auto mended = [&](std::string&& doc) -> Status {
    return MendInvalidUtf8(*invalid, &doc, summary) ? sink(std::move(doc)) : Status::OK();
  };
  std::set<std::string> seen_paths;
  // (size, FNV-1a of the bytes) -> first path: a 64-bit hash of equal-size
  // files colliding by chance is not a concern for a corpus.
  std::map<std::pair<size_t, uint64_t>, std::string> seen_content;
  for (const std::string& path : inputs) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return Status::NotFound(path + ": no such file");
    if (S_ISDIR(st.st_mode)) return Status::InvalidArgument(path + ": is a directory (expected a text file)");
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr) return Status::NotFound(path + ": no such file");
    if (!seen_paths.insert(resolved).second) {
      ++summary->skipped;
      continue;
    }
    if (path.ends_with(".jsonl")) {
      ++summary->files;
      HERD_RETURN_IF_ERROR(ReadJsonLines(path, newline, invalid, summary, sink));
      continue;
    }
    HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    if (text.find('\0') != std::string::npos) {
      ++summary->skipped;
      if (!IsStrfileIndex(path)) LOG(WARNING) << path << ": contains NUL bytes, not text; skipped";
      continue;
    }
    auto [it, fresh] = seen_content.try_emplace({text.size(), HashName(text)}, path);
    if (!fresh && !keep_duplicates) {
      ++summary->skipped;
      LOG(WARNING) << path << ": same bytes as " << it->second << "; skipped (--keep-duplicates reads it)";
      continue;
    }
    // Refused on the whole file (the offset is the file's); mended or
    // skipped document by document.
    const bool refuse = invalid != nullptr && *invalid == InvalidUtf8::kRefuse;
    if (refuse) {
      const size_t bad = unicode::FirstInvalidUtf8(text);
      if (bad != std::string::npos) return RefuseInvalidUtf8(path, static_cast<int64_t>(bad), text[bad], "");
    }
    ++summary->files;
    summary->bytes += static_cast<int64_t>(text.size());
    HERD_RETURN_IF_ERROR(SplitDocuments(text, invalid == nullptr || refuse ? sink : DocumentSink(mended)));
  }
  return Status::OK();
}

// Text to ids, a batch of documents at a time on every core.
class Encoder {
 public:
  // tokenizer null: byte-level.
  Encoder(const Tokenizer* tokenizer, int32_t document_token)
      : tokenizer_(tokenizer), document_token_(document_token), caches_(std::max(1, omp_get_max_threads())) {}

  // Fills ids[i] with documents[i]'s tokens.
  void Encode(const std::vector<std::string>& documents, std::vector<std::vector<int32_t>>* ids) {
    ids->resize(documents.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < documents.size(); ++i) {
      std::vector<int32_t>& out = (*ids)[i];
      out.clear();
      const std::string& text = documents[i];
      if (tokenizer_ == nullptr) {
        out.assign(text.begin(), text.end());
        for (int32_t& t : out) t &= 0xFF;
        continue;
      }
      out.push_back(document_token_);
      tokenizer_->Encode(text, &caches_[omp_get_thread_num()], &out);
    }
  }

 private:
  const Tokenizer* tokenizer_;
  const int32_t document_token_;
  std::vector<Tokenizer::Cache> caches_;
};

// Progress on stderr: a line redrawn in place twice a second on a
// terminal, else (a job's log) a line of its own every 30 s.
class Progress {
 public:
  Progress(bool enabled, int64_t total_bytes)
      : enabled_(enabled), tty_(::isatty(STDERR_FILENO) != 0), total_(total_bytes), start_(Clock::now()) {}
  ~Progress() {
    if (drawn_ && tty_) std::fprintf(stderr, "\n");
  }
  void Update(int64_t done_bytes) {
    if (!enabled_) return;
    const double t = std::chrono::duration<double>(Clock::now() - start_).count();
    if (t - last_ < (tty_ ? 0.5 : 30.0)) return;
    last_ = t;
    drawn_ = true;
    const double rate = done_bytes / std::max(t, 1e-9);
    const double left = rate > 0 ? (total_ - done_bytes) / rate : 0;
    std::fprintf(stderr, "%sprepare: %.1f / %.1f MB (%3.0f%%) | %.1f MB/s | eta %dm%02ds%s", tty_ ? "\r" : "",
                 done_bytes / 1e6, total_ / 1e6, 100.0 * done_bytes / std::max<int64_t>(total_, 1), rate / 1e6,
                 static_cast<int>(left) / 60, static_cast<int>(left) % 60, tty_ ? "   " : "\n");
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  const bool enabled_, tty_;
  const int64_t total_;
  const Clock::time_point start_;
  double last_ = 0;
  bool drawn_ = false;
};

// Sends each document to the train or the val file, by a hash of its
// index, and encodes them a batch at a time. The last document is held
// back, and so is every one while none has gone to train, so that at the
// end neither file can be left empty (prepare.h).
class DocumentRouter {
 public:
  DocumentRouter(const PrepareOptions& options, Encoder* encoder, Progress* progress, TokenFileWriter* train,
                 TokenFileWriter* val, PrepareSummary* summary)
      : options_(options),
        has_val_(!options.val_out.empty()),
        encoder_(encoder),
        progress_(progress),
        train_(train),
        val_(val),
        summary_(summary) {}

  // The next document of the inputs.
  Status Add(std::string&& text) {
    const uint64_t i = static_cast<uint64_t>(summary_->documents++);
    const bool is_val = has_val_ && static_cast<double>(Mix64(i) >> 11) * 0x1.0p-53 < options_.val_fraction;
    n_val_ += is_val;
    any_train_ = any_train_ || !is_val;
    held_.push_back({std::move(text), is_val});
    while (held_.size() > 1 && any_train_) HERD_RETURN_IF_ERROR(Release());
    return Status::OK();
  }

  // After the last document (there was at least one): gives each file at
  // least one, and writes out what is held and batched.
  Status Finish() {
    if (has_val_ && summary_->documents == 1) {
      HERD_RETURN_IF_ERROR(HoldOutTail());
    } else if (has_val_) {
      if (n_val_ == 0) held_.back().val = true;
      if (n_val_ == summary_->documents) held_.front().val = false;
    }
    while (!held_.empty()) HERD_RETURN_IF_ERROR(Release());
    return EncodeBatch();
  }

 private:
  // One document: its tail becomes the val file's.
  Status HoldOutTail() {
    Held& d = held_.front();
    const size_t length = d.text.size();
    if (length < 2) {
      return Status::InvalidArgument("prepare: the inputs hold " + N(static_cast<int64_t>(length)) +
                                     " byte(s) of text, too little to split into " + options_.train_out + " and " +
                                     options_.val_out);
    }
    const size_t tail = std::max<size_t>(1, static_cast<size_t>(static_cast<double>(length) * options_.val_fraction));
    held_.push_back({d.text.substr(length - tail), true});
    d.text.resize(length - tail);
    d.val = false;
    return Status::OK();
  }

  // Moves the oldest held document into the batch.
  Status Release() {
    batch_bytes_ += held_.front().text.size();
    batch_.push_back(std::move(held_.front().text));
    batch_val_.push_back(held_.front().val);
    held_.pop_front();
    return batch_bytes_ >= kBatchBytes ? EncodeBatch() : Status::OK();
  }

  Status EncodeBatch() {
    encoder_->Encode(batch_, &ids_);
    for (size_t i = 0; i < batch_.size(); ++i) {
      TokenFileWriter& w = batch_val_[i] ? *val_ : *train_;
      HERD_RETURN_IF_ERROR(w.Append(ids_[i].data(), ids_[i].size()));
      summary_->val_documents += batch_val_[i];
    }
    batch_.clear();
    batch_val_.clear();
    batch_bytes_ = 0;
    progress_->Update(summary_->bytes);
    return Status::OK();
  }

  static constexpr size_t kBatchBytes = 32 << 20;
  struct Held {
    std::string text;
    bool val;
  };
  const PrepareOptions& options_;
  const bool has_val_;
  Encoder* const encoder_;
  Progress* const progress_;
  TokenFileWriter* const train_;
  TokenFileWriter* const val_;
  PrepareSummary* const summary_;
  std::deque<Held> held_;
  std::vector<std::string> batch_;
  std::vector<bool> batch_val_;
  std::vector<std::vector<int32_t>> ids_;
  size_t batch_bytes_ = 0;
  int64_t n_val_ = 0;
  bool any_train_ = false;
};

Status CheckOutputs(const PrepareOptions& options) {
  if (options.train_out.empty()) return Status::InvalidArgument("prepare: no output file given (--out)");
  const bool has_val = !options.val_out.empty();
  if (has_val && !(options.val_fraction > 0 && options.val_fraction < 1)) {
    return Status::InvalidArgument("prepare: val_fraction must be in (0, 1) to write " + options.val_out + ", got " +
                                   std::to_string(options.val_fraction));
  }
  if (has_val && options.val_out == options.train_out) {
    return Status::InvalidArgument("prepare: " + options.train_out + " is both the train and the val output");
  }
  return Status::OK();
}

// The tokenizer (null: byte-level), with summary's vocab_size and
// document_token set to what the files will be written with.
StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const PrepareOptions& options, PrepareSummary* summary) {
  std::unique_ptr<Tokenizer> tokenizer;
  int32_t document_token = -1;
  summary->vocab_size = 256;
  if (!options.tokenizer.empty()) {
    HERD_ASSIGN_OR_RETURN(tokenizer, Tokenizer::Load(options.tokenizer));
    summary->vocab_size = tokenizer->vocab_size();
    if (!options.document_token.empty()) {
      document_token = tokenizer->Find(options.document_token);
      if (document_token < 0) {
        return Status::InvalidArgument("prepare: --doc-token '" + options.document_token + "' is no token of " +
                                       options.tokenizer);
      }
    } else {
      document_token = tokenizer->document_token();
      if (document_token < 0) {
        return Status::InvalidArgument("prepare: " + options.tokenizer +
                                       " names no end-of-text token to put between documents; name one with "
                                       "--doc-token TOKEN");
      }
    }
  } else if (!options.document_token.empty()) {
    return Status::InvalidArgument("prepare: --doc-token needs --tokenizer");
  }
  summary->document_token = document_token;
  return tokenizer;
}

// What the progress line counts up to: the inputs' sizes on disk.
int64_t TotalBytes(const std::vector<std::string>& inputs) {
  int64_t total_bytes = 0;
  for (const std::string& path : inputs) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) total_bytes += st.st_size;
  }
  return total_bytes;
}

}  // namespace

Status PrepareText(const PrepareOptions& options, PrepareSummary* summary) {
  *summary = PrepareSummary();
  if (options.inputs.empty()) return Status::InvalidArgument("prepare: no input files");
  HERD_RETURN_IF_ERROR(CheckOutputs(options));
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(options, summary));

  // Outputs: written to temporaries, renamed only once both are complete.
  const bool has_val = !options.val_out.empty();
  std::vector<std::string> outs = {options.train_out};
  if (has_val) outs.push_back(options.val_out);
  for (const std::string& path : outs) HERD_RETURN_IF_ERROR(MakeDirs(DirName(path)).WithContext(path + ": "));
  TokenFileWriter train, val;
  HERD_RETURN_IF_ERROR(train.Open(options.train_out, summary->vocab_size - 1, summary->vocab_size));
  if (has_val) HERD_RETURN_IF_ERROR(val.Open(options.val_out, summary->vocab_size - 1, summary->vocab_size));

  Progress progress(options.progress, TotalBytes(options.inputs));
  Encoder encoder(tokenizer.get(), summary->document_token);
  DocumentRouter router(options, &encoder, &progress, &train, &val, summary);
  const InvalidUtf8* invalid = tokenizer != nullptr ? &options.invalid_utf8 : nullptr;
  HERD_RETURN_IF_ERROR(ReadInputs(options.inputs, tokenizer == nullptr, invalid, options.keep_duplicates, summary,
                                  [&](std::string&& text) { return router.Add(std::move(text)); }));
  if (summary->documents == 0) {
    return Status::InvalidArgument("prepare: no text in the " + N(static_cast<int64_t>(options.inputs.size())) +
                                   " input file(s) (all empty, binary or duplicates)");
  }
  HERD_RETURN_IF_ERROR(router.Finish());

  summary->train_tokens = train.tokens();
  summary->val_tokens = val.tokens();
  // data.train last: EnsurePrepared takes an existing train file as "done".
  if (has_val) HERD_RETURN_IF_ERROR(val.Commit());
  return train.Commit();
}

Status EnsurePrepared(const config::DataConfig& data) {
  if (data.train().empty()) return Status::InvalidArgument("data.train: no token file given");
  if (PathExists(data.train())) return Status::OK();
  if (data.prepare_from().empty()) {
    return Status::InvalidArgument("data.train: " + data.train() +
                                   ": no such file (and data.prepare_from names no text to prepare it from)");
  }
  // Preparing writes both files: an existing data.val is a file this job
  // did not make (a mistyped data.train must not replace it).
  if (!data.val().empty() && PathExists(data.val())) {
    return Status::InvalidArgument("data.train: " + data.train() +
                                   ": no such file; data.prepare_from would prepare it, but data.val " + data.val() +
                                   " exists and would be replaced: herd prepares only when both are missing (check "
                                   "the path, or prepare by hand with herd prepare)");
  }
  PrepareOptions options;
  for (const std::string& pattern : data.prepare_from()) {
    size_t found = 0;
    for (const std::string& path : Glob(pattern)) {
      // A glob over a directory of texts may match sub-directories; those
      // are not inputs (and not an error).
      struct stat st;
      if (::stat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
      options.inputs.push_back(path);
      ++found;
    }
    if (found == 0) {
      const bool fortunes = pattern.starts_with("/usr/share/games/fortunes");
      return Status::NotFound("data.prepare_from: '" + pattern + "' matches no file, and data.train " + data.train() +
                              " does not exist" +
                              (fortunes ? " (install Debian's fortunes package: apt-get install fortunes)" : ""));
    }
  }
  options.train_out = data.train();
  options.val_out = data.val();
  options.val_fraction = data.val_fraction();
  options.tokenizer = data.tokenizer();
  PrepareSummary s;
  HERD_RETURN_IF_ERROR(PrepareText(options, &s).WithContext("preparing data.train " + data.train() + ": "));
  std::printf("prepared %s (%lld tokens)", data.train().c_str(), static_cast<long long>(s.train_tokens));
  if (!data.val().empty())
    std::printf(" and %s (%lld tokens)", data.val().c_str(), static_cast<long long>(s.val_tokens));
  std::printf(" from %lld documents in %lld files (%lld skipped) of data.prepare_from\n",
              static_cast<long long>(s.documents), static_cast<long long>(s.files), static_cast<long long>(s.skipped));
  std::fflush(stdout);
  return Status::OK();
}

StatusOr<JobData> OpenJobData(const config::DataConfig& data, int vocab_size) {
  HERD_RETURN_IF_ERROR(EnsurePrepared(data));
  HERD_ASSIGN_OR_RETURN(TokenFile train, TokenFile::Open(data.train(), vocab_size));
  JobData out{std::move(train), nullptr};
  if (!data.val().empty()) {
    HERD_ASSIGN_OR_RETURN(TokenFile val, TokenFile::Open(data.val(), vocab_size));
    out.val = std::make_unique<TokenFile>(std::move(val));
  }
  return out;
}

}  // namespace herd
