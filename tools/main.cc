// herd: one binary, subcommands in the style of git/torchrun.
#include <cstdio>
#include <cstring>
#include <string>

#include "common/logging.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* usage;
};

const Command kCommands[] = {
    {"launch", herd::tools::RunLaunch,
     "launch CONFIG [--set path=value ...] [--resume [--allow-global-batch-change] | --overwrite] [--stop-at STEP] "
     "[--max-restarts N]   train a job"},
    {"eval", herd::tools::RunEval,
     "eval MODEL --data FILE [--seq-len T] [--batch-size B] [--batches N] [--threads N]   held-out loss (JSON)"},
    {"prepare", herd::tools::RunPrepare,
     "prepare TEXT... --out FILE [--val-out FILE] [--val-fraction F] [--tokenizer tokenizer.json] ...   "
     "tokenize text into a token file"},
    {"plan", herd::tools::RunPlan,
     "plan CONFIG [--set ...] [--mem BYTES] [--gpu-mem BYTES] [--frontier] [--json]   bytes each process will hold; "
     "largest model that fits"},
    {"trace", herd::tools::RunTrace,
     "trace merge DIR --out trace.json   one Perfetto/Chrome trace from a job's log.trace files"},
    {"export", herd::tools::RunExport, "export CHECKPOINT --out DIR [--tokenizer tokenizer.json]   write a HuggingFace directory"},
    {"import", herd::tools::RunImport, "import DIR --out CHECKPOINT [--step N]   read a HuggingFace directory"},
    {"coordinator", herd::tools::RunCoordinator,
     "coordinator [CONFIG] --listen HOST:PORT [--token-file F] [--port-file F] [--max-restarts N]   rendezvous "
     "service for multi-process jobs"},
    {"bench", herd::tools::RunBench,
     "bench train|transport|compare|allreduce|gpu ...   throughput (JSON; each one's flags: docs/commands.md)"},
    {"version", herd::tools::RunVersion, "version   versions of herd and its libraries (JSON)"},
};

void PrintUsage(std::FILE* out) {
  std::fprintf(out, "usage: herd COMMAND [ARGS]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  herd %s\n", c.usage);
}

}  // namespace

int main(int argc, char** argv) {
  herd::InitLogging(argv[0]);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      (!std::strcmp(argv[1], "help") && argc == 2)) {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  // "herd help COMMAND" and "herd COMMAND --help": that command's line.
  const bool help = !std::strcmp(argv[1], "help");
  const char* name = help && argc > 2 ? argv[2] : argv[1];
  for (const Command& c : kCommands) {
    if (std::strcmp(name, c.name) != 0) continue;
    if (help || herd::tools::AsksForHelp(argc - 1, argv + 1)) {
      std::printf("usage: herd %s\n(every flag, and what each error means: docs/commands.md)\n", c.usage);
      return 0;
    }
    return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "herd: error: unknown command '%s'\n", name);
  PrintUsage(stderr);
  return 2;
}
