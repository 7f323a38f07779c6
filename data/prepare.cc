#include "data/prepare.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "common/file_util.h"
#include "common/rng.h"
#include "data/token_file.h"

namespace herd {
namespace {

// Fortune files separate entries with lines holding only "%".
std::vector<std::string> SplitDocuments(const std::string& text) {
  std::vector<std::string> docs;
  std::string current;
  size_t pos = 0;
  bool fortune = false;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    size_t end = eol == std::string::npos ? text.size() : eol + 1;
    std::string_view line(text.data() + pos, end - pos);
    if (line == "%\n" || line == "%") {
      fortune = true;
      if (!current.empty()) docs.push_back(std::move(current));
      current.clear();
    } else {
      current.append(line);
    }
    pos = end;
  }
  if (!current.empty()) docs.push_back(std::move(current));
  if (!fortune && docs.size() > 1) return {text};
  return docs;
}

}  // namespace

Status PrepareText(const PrepareOptions& options, PrepareSummary* summary) {
  *summary = PrepareSummary();
  if (options.inputs.empty()) return Status::InvalidArgument("prepare: no input files");
  if (options.train_out.empty()) return Status::InvalidArgument("prepare: no output file (--out)");
  std::vector<int32_t> train, val;
  std::set<std::string> seen;
  for (const std::string& path : options.inputs) {
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr) {
      return Status::NotFound(path + ": no such file");
    }
    if (!seen.insert(resolved).second) {
      ++summary->skipped;  // e.g. fortunes' *.u8 symlinks to the plain file
      continue;
    }
    HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    if (text.find('\0') != std::string::npos) {
      ++summary->skipped;  // binary (e.g. fortunes' *.dat indexes)
      continue;
    }
    ++summary->files;
    for (const std::string& doc : SplitDocuments(text)) {
      const uint64_t h = Mix64(static_cast<uint64_t>(summary->documents++));
      const bool to_val = !options.val_out.empty() &&
                          static_cast<double>(h >> 11) * 0x1.0p-53 < options.val_fraction;
      std::vector<int32_t>& out = to_val ? val : train;
      for (unsigned char c : doc) out.push_back(c);
      if (doc.back() != '\n') out.push_back('\n');
    }
  }
  if (train.empty()) return Status::InvalidArgument("prepare: no text found in the inputs (all binary or empty)");
  HERD_RETURN_IF_ERROR(MakeDirs(DirName(options.train_out)));
  HERD_RETURN_IF_ERROR(WriteTokenFile(options.train_out, train));
  if (!options.val_out.empty()) {
    if (val.empty()) {  // tiny inputs: hold out the last document's worth
      val.assign(train.end() - std::min<size_t>(train.size() / 2, 4096), train.end());
    }
    HERD_RETURN_IF_ERROR(MakeDirs(DirName(options.val_out)));
    HERD_RETURN_IF_ERROR(WriteTokenFile(options.val_out, val));
  }
  summary->train_tokens = static_cast<int64_t>(train.size());
  summary->val_tokens = static_cast<int64_t>(val.size());
  return Status::OK();
}

Status EnsurePrepared(const config::DataConfig& data) {
  if (PathExists(data.train())) return Status::OK();
  if (data.prepare_from().empty()) {
    return Status::NotFound("data.train: " + data.train() + ": no such file (and no data.prepare_from to make it)");
  }
  PrepareOptions options;
  for (const std::string& pattern : data.prepare_from()) {
    std::vector<std::string> matches = Glob(pattern);
    if (matches.empty()) {
      return Status::NotFound("data.prepare_from: '" + pattern + "' matches no file");
    }
    options.inputs.insert(options.inputs.end(), matches.begin(), matches.end());
  }
  options.train_out = data.train();
  options.val_out = data.val();
  options.val_fraction = data.val_fraction();
  PrepareSummary s;
  HERD_RETURN_IF_ERROR(PrepareText(options, &s).WithContext("preparing data.train: "));
  std::printf("prepared %s (%lld tokens)%s%s from %lld files, %lld documents\n", data.train().c_str(),
              static_cast<long long>(s.train_tokens), data.val().empty() ? "" : " and ", data.val().c_str(),
              static_cast<long long>(s.files), static_cast<long long>(s.documents));
  std::fflush(stdout);
  return Status::OK();
}

}  // namespace herd
