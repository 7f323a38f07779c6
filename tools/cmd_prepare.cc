// herd prepare TEXT... --out FILE [--val-out FILE] [--val-fraction F]
//                      [--tokenizer tokenizer.json] [--doc-token TOKEN]
//                      [--invalid-utf8 refuse|replace|skip] [--keep-duplicates]
//
// Text files (plain, fortune, or JSON Lines) into token files, byte-level
// or with a HuggingFace tokenizer (see data/prepare.h); prints one summary
// line, and a progress line on a terminal.
#include <cstdio>
#include <cstdlib>

#include "common/logging.h"
#include "data/prepare.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace herd::tools {

int RunPrepare(int argc, char** argv) {
  Args args({"out", "val-out", "val-fraction", "tokenizer", "doc-token", "invalid-utf8"}, {"keep-duplicates"});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("prepare: "));
  if (args.positional().empty() || args.Get("out").empty()) {
    return ReportError(
        Status::InvalidArgument("usage: herd prepare TEXT... --out FILE [--val-out FILE] [--val-fraction F] "
                                "[--tokenizer tokenizer.json] [--doc-token TOKEN] [--invalid-utf8 refuse|replace|skip] "
                                "[--keep-duplicates]"));
  }
  PrepareOptions options;
  options.inputs = args.positional();
  options.train_out = args.Get("out");
  options.val_out = args.Get("val-out");
  options.tokenizer = args.Get("tokenizer");
  options.document_token = args.Get("doc-token");
  options.progress = true;
  options.keep_duplicates = args.Has("keep-duplicates");
  if (args.Has("invalid-utf8")) {
    const std::string policy = args.Get("invalid-utf8");
    if (options.tokenizer.empty()) {
      return ReportError(Status::InvalidArgument(
          "prepare: --invalid-utf8 needs --tokenizer (byte-level preparation keeps every byte)"));
    }
    if (policy == "refuse") {
      options.invalid_utf8 = InvalidUtf8::kRefuse;
    } else if (policy == "replace") {
      options.invalid_utf8 = InvalidUtf8::kReplace;
    } else if (policy == "skip") {
      options.invalid_utf8 = InvalidUtf8::kSkip;
    } else {
      return ReportError(Status::InvalidArgument("prepare: --invalid-utf8: expected refuse, replace or skip, got '" +
                                                 policy + "'"));
    }
  }
  if (args.Has("val-fraction")) {
    if (options.val_out.empty()) {
      return ReportError(Status::InvalidArgument("prepare: --val-fraction needs --val-out FILE to hold the text"));
    }
    const std::string text = args.Get("val-fraction");
    char* end = nullptr;
    options.val_fraction = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(options.val_fraction > 0 && options.val_fraction < 1)) {
      return ReportError(
          Status::InvalidArgument("prepare: --val-fraction: expected a number in (0, 1), got '" + text + "'"));
    }
  }
  PrepareSummary s;
  st = PrepareText(options, &s);
  if (!st.ok()) return ReportError(st);
  std::printf("prepared %lld documents (%lld bytes) from %lld files (%lld skipped): %s %lld tokens",
              static_cast<long long>(s.documents), static_cast<long long>(s.bytes), static_cast<long long>(s.files),
              static_cast<long long>(s.skipped), options.train_out.c_str(), static_cast<long long>(s.train_tokens));
  if (!options.val_out.empty()) {
    std::printf(", %s %lld tokens (%lld documents)", options.val_out.c_str(), static_cast<long long>(s.val_tokens),
                static_cast<long long>(s.val_documents));
  }
  if (s.invalid_utf8_documents > 0) {
    std::printf(", %lld documents with invalid UTF-8 %s", static_cast<long long>(s.invalid_utf8_documents),
                options.invalid_utf8 == InvalidUtf8::kSkip ? "skipped" : "replaced");
  }
  std::printf(" (vocabulary %d", s.vocab_size);
  if (s.document_token >= 0) std::printf(", documents start with token %d", s.document_token);
  std::printf(")\n");
  return 0;
}

}  // namespace herd::tools
