// herd prepare TEXT... --out FILE [--val-out FILE] [--val-fraction F]
//                      [--tokenizer tokenizer.json] [--doc-token TOKEN]
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
  Args args({"out", "val-out", "val-fraction", "tokenizer", "doc-token"}, {});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("prepare: "));
  if (args.positional().empty() || args.Get("out").empty()) {
    return ReportError(
        Status::InvalidArgument("usage: herd prepare TEXT... --out FILE [--val-out FILE] [--val-fraction F] "
                                "[--tokenizer tokenizer.json] [--doc-token TOKEN]"));
  }
  PrepareOptions options;
  options.inputs = args.positional();
  options.train_out = args.Get("out");
  options.val_out = args.Get("val-out");
  options.tokenizer = args.Get("tokenizer");
  options.document_token = args.Get("doc-token");
  options.progress = true;
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
  std::printf(" (vocabulary %d", s.vocab_size);
  if (s.document_token >= 0) std::printf(", documents start with token %d", s.document_token);
  std::printf(")\n");
  return 0;
}

}  // namespace herd::tools
