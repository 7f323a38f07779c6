// The herd subcommands. Each lives in tools/cmd_NAME.cc, parses its own
// arguments and returns the process exit code (0 ok, 2 bad usage/input,
// 1 other failure), printing one "herd: error: ..." line on failure.
#pragma once

namespace herd::tools {

int RunLaunch(int argc, char** argv);
int RunEval(int argc, char** argv);
int RunPrepare(int argc, char** argv);
int RunExport(int argc, char** argv);
int RunImport(int argc, char** argv);
int RunVersion(int argc, char** argv);
int RunBench(int argc, char** argv);
int RunCoordinator(int argc, char** argv);
int RunPlan(int argc, char** argv);
int RunTrace(int argc, char** argv);
// herd bench transport (tools/cmd_bench_transport.cc), dispatched by RunBench.
int RunBenchTransport(int argc, char** argv);
// herd bench allreduce (tools/cmd_bench_allreduce.cc): one rank of the ring benchmark.
int RunBenchAllReduce(int argc, char** argv);
// herd bench compare (tools/cmd_bench_compare.cc): PS vs all-reduce vs ZeRO-1 on one job.
int RunBenchCompare(int argc, char** argv);
// herd bench gpu (tools/cmd_bench_gpu.cc): one GPU, herd next to PyTorch.
int RunBenchGpu(int argc, char** argv);
// herd bench memory (tools/cmd_bench_memory.cc): STREAM's copy and triad.
int RunBenchMemory(int argc, char** argv);

}  // namespace herd::tools
