#include "data/prepare.h"

#include <glog/logging.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "common/file_util.h"
#include "common/rng.h"
#include "data/token_file.h"

namespace herd {
namespace {

// A document is the byte range [begin, end) of the corpus string.
struct Document {
  size_t begin, end;
  bool val = false;
};

std::string N(int64_t v) { return std::to_string(v); }

bool IsFortuneSeparator(std::string_view line) { return line == "%\n" || line == "%" || line == "%\r\n"; }

bool HasText(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") != std::string_view::npos; }

// Appends the documents of one file to `corpus`: the pieces between "%"
// lines (a file without such a line is one piece), each ending in a
// newline; pieces without any text are dropped.
void AppendDocuments(const std::string& text, std::string* corpus, std::vector<Document>* docs) {
  auto flush = [&](size_t from, size_t to) {
    std::string_view piece(text.data() + from, to - from);
    if (!HasText(piece)) return;
    const size_t begin = corpus->size();
    corpus->append(piece);
    if (piece.back() != '\n') corpus->push_back('\n');
    docs->push_back({begin, corpus->size()});
  };
  size_t doc_begin = 0, pos = 0;
  while (pos < text.size()) {
    const size_t eol = text.find('\n', pos);
    const size_t next = eol == std::string::npos ? text.size() : eol + 1;
    if (IsFortuneSeparator(std::string_view(text.data() + pos, next - pos))) {
      flush(doc_begin, pos);
      doc_begin = next;
    }
    pos = next;
  }
  flush(doc_begin, text.size());
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

// Reads the inputs into `corpus` / `docs`, skipping what prepare.h says.
Status ReadInputs(const std::vector<std::string>& inputs, std::string* corpus, std::vector<Document>* docs,
                  PrepareSummary* summary) {
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
    HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    if (text.find('\0') != std::string::npos) {
      ++summary->skipped;
      if (!IsStrfileIndex(path)) LOG(WARNING) << path << ": contains NUL bytes, not text; skipped";
      continue;
    }
    auto [it, fresh] = seen_content.try_emplace({text.size(), HashName(text)}, path);
    if (!fresh) {
      ++summary->skipped;
      LOG(WARNING) << path << ": same bytes as " << it->second << "; skipped";
      continue;
    }
    ++summary->files;
    summary->bytes += static_cast<int64_t>(text.size());
    AppendDocuments(text, corpus, docs);
  }
  return Status::OK();
}

// Hash-assigns documents to val, then makes sure neither side is empty.
Status AssignValidation(const PrepareOptions& options, std::vector<Document>* docs) {
  size_t n_val = 0;
  for (size_t i = 0; i < docs->size(); ++i) {
    const double u = static_cast<double>(Mix64(static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53;
    (*docs)[i].val = u < options.val_fraction;
    n_val += (*docs)[i].val;
  }
  if (docs->size() >= 2) {
    if (n_val == 0) docs->back().val = true;
    if (n_val == docs->size()) docs->front().val = false;
    return Status::OK();
  }
  // One document: hold out its tail.
  const Document d = docs->front();
  const size_t length = d.end - d.begin;
  if (length < 2) {
    return Status::InvalidArgument("prepare: the inputs hold " + N(static_cast<int64_t>(length)) +
                                   " byte(s) of text, too little to split into " + options.train_out + " and " +
                                   options.val_out);
  }
  const size_t tail = std::max<size_t>(1, static_cast<size_t>(static_cast<double>(length) * options.val_fraction));
  docs->front().end = d.end - tail;
  docs->push_back({d.end - tail, d.end, true});
  return Status::OK();
}

// Byte-level token ids of the train and of the val documents, in order.
void EncodeBytes(const std::string& corpus, const std::vector<Document>& docs, std::vector<int32_t>* train,
                 std::vector<int32_t>* val) {
  for (const Document& d : docs) {
    std::vector<int32_t>& tokens = d.val ? *val : *train;
    for (size_t i = d.begin; i < d.end; ++i) tokens.push_back(static_cast<unsigned char>(corpus[i]));
  }
}

// Writes every (path, bytes) to a temporary file first and renames them in
// order only once all are written; on error nothing new is renamed into
// place (the temporaries are removed).
Status WriteAll(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<AtomicFile> writers(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& path = files[i].first;
    HERD_RETURN_IF_ERROR(MakeDirs(DirName(path)).WithContext(path + ": "));
    HERD_RETURN_IF_ERROR(writers[i].Open(path));
    HERD_RETURN_IF_ERROR(writers[i].Append(files[i].second));
  }
  for (AtomicFile& w : writers) HERD_RETURN_IF_ERROR(w.Commit());
  return Status::OK();
}

}  // namespace

Status PrepareText(const PrepareOptions& options, PrepareSummary* summary) {
  *summary = PrepareSummary();
  if (options.inputs.empty()) return Status::InvalidArgument("prepare: no input files");
  if (options.train_out.empty()) return Status::InvalidArgument("prepare: no output file given (--out)");
  const bool has_val = !options.val_out.empty();
  if (has_val && !(options.val_fraction > 0 && options.val_fraction < 1)) {
    return Status::InvalidArgument("prepare: val_fraction must be in (0, 1) to write " + options.val_out + ", got " +
                                   std::to_string(options.val_fraction));
  }
  if (has_val && options.val_out == options.train_out) {
    return Status::InvalidArgument("prepare: " + options.train_out + " is both the train and the val output");
  }

  std::string corpus;
  std::vector<Document> docs;
  HERD_RETURN_IF_ERROR(ReadInputs(options.inputs, &corpus, &docs, summary));
  summary->documents = static_cast<int64_t>(docs.size());
  if (docs.empty()) {
    return Status::InvalidArgument("prepare: no text in the " + N(static_cast<int64_t>(options.inputs.size())) +
                                   " input file(s) (all empty, binary or duplicates)");
  }
  if (has_val) HERD_RETURN_IF_ERROR(AssignValidation(options, &docs));

  std::vector<int32_t> train, val;
  EncodeBytes(corpus, docs, &train, &val);
  // data.train last: EnsurePrepared takes an existing train file as "done".
  std::vector<std::pair<std::string, std::string>> files;
  if (has_val) {
    HERD_ASSIGN_OR_RETURN(std::string bytes, EncodeTokenFile(options.val_out, val));
    files.emplace_back(options.val_out, std::move(bytes));
  }
  HERD_ASSIGN_OR_RETURN(std::string train_bytes, EncodeTokenFile(options.train_out, train));
  files.emplace_back(options.train_out, std::move(train_bytes));
  HERD_RETURN_IF_ERROR(WriteAll(files));

  summary->train_tokens = static_cast<int64_t>(train.size());
  summary->val_tokens = static_cast<int64_t>(val.size());
  for (const Document& d : docs) summary->val_documents += d.val;
  return Status::OK();
}

Status EnsurePrepared(const config::DataConfig& data) {
  if (data.train().empty()) return Status::InvalidArgument("data.train: no token file given");
  if (PathExists(data.train())) return Status::OK();
  if (data.prepare_from().empty()) {
    return Status::NotFound("data.train: " + data.train() +
                            ": no such file (and data.prepare_from names no text to prepare it from)");
  }
  // Preparing writes both files: an existing data.val is a file this job
  // did not make (a mistyped data.train must not replace it).
  if (!data.val().empty() && PathExists(data.val())) {
    return Status::NotFound("data.train: " + data.train() + ": no such file; data.prepare_from would prepare it, but " +
                            "data.val " + data.val() + " exists and would be replaced: herd prepares only when " +
                            "both are missing (check the path, or prepare by hand with herd prepare)");
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
