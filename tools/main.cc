// herd: one binary, subcommands in the style of git/torchrun.
#include <cstdio>
#include <cstring>
#include <string>

#include "common/logging.h"
#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* usage;
};

const Command kCommands[] = {
    {"launch", herd::tools::RunLaunch, "launch CONFIG [--set path=value ...] [--resume | --overwrite] [--stop-at STEP]   train a job"},
    {"eval", herd::tools::RunEval,
     "eval MODEL --data FILE [--seq-len T] [--batch-size B] [--batches N]   held-out loss (JSON)"},
    {"prepare", herd::tools::RunPrepare, "prepare TEXT... --out FILE   tokenize text into a token file"},
    {"plan", herd::tools::RunPlan,
     "plan CONFIG [--set ...] [--mem BYTES] [--json]   bytes each process will hold; largest model that fits"},
    {"trace", herd::tools::RunTrace,
     "trace merge DIR --out trace.json   one Perfetto/Chrome trace from a job's log.trace files"},
    {"export", herd::tools::RunExport, "export CHECKPOINT --out DIR   write a HuggingFace directory"},
    {"import", herd::tools::RunImport, "import DIR --out CHECKPOINT   read a HuggingFace directory"},
    {"coordinator", herd::tools::RunCoordinator,
     "coordinator [CONFIG] --listen HOST:PORT [--token-file F]   rendezvous service for multi-process jobs"},
    {"bench", herd::tools::RunBench, "bench train CONFIG [--set ...] [--steps N] | bench transport [--sizes ...]   throughput (JSON)"},
    {"version", herd::tools::RunVersion, "version   versions of herd and its libraries (JSON)"},
};

void PrintUsage(std::FILE* out) {
  std::fprintf(out, "usage: herd COMMAND [ARGS]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  herd %s\n", c.usage);
}

}  // namespace

int main(int argc, char** argv) {
  herd::InitLogging(argv[0]);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "herd: error: unknown command '%s'\n", argv[1]);
  PrintUsage(stderr);
  return 2;
}
