#include "tools/local_job.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/signals.h"
#include "common/strings.h"
#include "data/prepare.h"
#include "model/hf_io.h"
#include "sharding/shard_plan.h"
#include "transport/coordinator.h"
#include "transport/rendezvous.h"

extern char** environ;

namespace herd::tools {
namespace {

// Placement variables that would contradict the ranks we hand out.
constexpr const char* kPlacementVars[] = {"SLURM_PROCID",     "SLURM_NTASKS",  "RANK",
                                          "WORLD_SIZE",       "MASTER_ADDR",   "MASTER_PORT",
                                          "HERD_COORDINATOR", "HERD_JOB_TOKEN"};

struct Child {
  std::string name;  // "server 0"
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  std::string out_partial, err_partial;
  std::optional<int> exit_code;
};

std::vector<std::string> ChildEnvironment(const std::string& token_file, int threads) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (std::find(std::begin(kPlacementVars), std::end(kPlacementVars), name) != std::end(kPlacementVars)) continue;
    if (name == "HERD_JOB_TOKEN_FILE" || (threads > 0 && name == "OMP_NUM_THREADS")) continue;
    env.push_back(entry);
  }
  env.push_back("HERD_JOB_TOKEN_FILE=" + token_file);
  if (threads > 0) env.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
  return env;
}

Status Spawn(const std::string& binary, const std::vector<std::string>& argv, const std::vector<std::string>& env,
             Child* child) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return Status::IOError("pipe: out of descriptors");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  // The launcher blocks SIGINT/SIGTERM for its signal watcher; children
  // start with default signal handling.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const int rc = ::posix_spawn(&child->pid, binary.c_str(), &actions, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return Status::IOError(binary + ": cannot start: " + std::strerror(rc));
  }
  child->out_fd = out[0];
  child->err_fd = err[0];
  return Status::OK();
}

// Forwards every child's stdout and stderr, line by line, with its name.
class LogForwarder {
 public:
  explicit LogForwarder(std::vector<Child>* children) : children_(children) {
    thread_ = std::thread([this] { Run(); });
  }
  // Returns once every pipe has reached end of file.
  void Join() { thread_.join(); }

 private:
  void Emit(const std::string& name, std::string* partial, const char* data, size_t n, std::FILE* to, bool flush_all) {
    partial->append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = partial->find('\n', start)) != std::string::npos; start = nl + 1) {
      std::fprintf(to, "%s: %.*s\n", name.c_str(), static_cast<int>(nl - start), partial->data() + start);
    }
    partial->erase(0, start);
    if (flush_all && !partial->empty()) {
      std::fprintf(to, "%s: %s\n", name.c_str(), partial->c_str());
      partial->clear();
    }
    std::fflush(to);
  }

  void Run() {
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<std::pair<Child*, bool>> owners;  // (child, is_stderr)
      for (Child& c : *children_) {
        if (c.out_fd >= 0) {
          fds.push_back({c.out_fd, POLLIN, 0});
          owners.emplace_back(&c, false);
        }
        if (c.err_fd >= 0) {
          fds.push_back({c.err_fd, POLLIN, 0});
          owners.emplace_back(&c, true);
        }
      }
      if (fds.empty()) return;
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto [c, is_err] = owners[i];
        char buf[65536];
        const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        int& fd = is_err ? c->err_fd : c->out_fd;
        std::string* partial = is_err ? &c->err_partial : &c->out_partial;
        if (n > 0) {
          Emit(c->name, partial, buf, n, is_err ? stderr : stdout, false);
        } else if (n == 0 || errno != EINTR) {
          Emit(c->name, partial, nullptr, 0, is_err ? stderr : stdout, true);
          ::close(fd);
          fd = -1;
        }
      }
    }
  }

  std::vector<Child>* children_;
  std::thread thread_;
};

}  // namespace

int RunLocalJob(const config::JobConfig& config, const LocalJobOptions& options) {
  const auto& cluster = config.cluster();
  const int S = cluster.servers(), W = cluster.workers();
  // Stop signals become an orderly shutdown; set up before any thread.
  std::atomic<transport::Coordinator*> running{nullptr};
  std::atomic<bool> interrupted{false};
  SignalWatcher signals([&](int signo) {
    interrupted = true;
    if (auto* c = running.load()) c->Stop(signo == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)");
  });

  // What every process would refuse, refused once here.
  auto plan =
      ShardPlan::Create(ParamLayout(LlamaShape::FromConfig(config.model())), ShardPlanOptions::FromConfig(cluster));
  if (!plan.ok()) return ReportError(plan.status().WithContext(options.config_path + ": "));
  if (!options.train.resume) {
    if (Status init = CheckInitFrom(config); !init.ok()) return ReportError(init);
  }
  // Prepared once here (workers would otherwise race to prepare it), and
  // opened: a missing or bad file is one line, before anything starts.
  Status st = OpenJobData(config.data(), config.model().vocab_size()).status();
  if (!st.ok()) return ReportError(st);
  const std::string bin_dir = DirName(ThisExecutable());
  for (const char* name : {"herd-server", "herd-worker"}) {
    if (::access(JoinPath(bin_dir, name).c_str(), X_OK) != 0) {
      return ReportError(Status::NotFound(JoinPath(bin_dir, name) + ": not found (it is built beside herd)"));
    }
  }
  // The job token, in a private directory removed when the job ends.
  TempDir token_dir;
  if (Status made = token_dir.Create("herd-job"); !made.ok()) return ReportError(made);
  const std::string token_file = JoinPath(token_dir.path(), "token");
  auto token = transport::CreateJobToken(token_file);
  if (!token.ok()) return ReportError(token.status());

  transport::CoordinatorOptions coordinator_options = transport::CoordinatorOptions::FromConfig(config);
  coordinator_options.listen = "127.0.0.1:0";
  coordinator_options.token = std::string(Trim(*token));
  auto coordinator = transport::Coordinator::Start(coordinator_options);
  if (!coordinator.ok()) return ReportError(coordinator.status());
  running = coordinator->get();
  Status coordinator_result;
  std::thread coordinator_thread([&] { coordinator_result = (*coordinator)->Run(); });
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());

  // Threads: workers share the cores; servers work while workers wait.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const bool pick_threads = config.train().threads() == 0 && std::getenv("OMP_NUM_THREADS") == nullptr;
  std::printf("launch: coordinator on %s, %d servers, %d workers (%s)\n", address.c_str(), S, W,
              pick_threads ? (std::to_string(std::max(1, cores / W)) + " threads per worker").c_str()
                           : "threads from the config/OMP_NUM_THREADS");
  std::fflush(stdout);

  std::vector<Child> children(S + W);
  for (int i = 0; i < S + W && st.ok(); ++i) {
    const bool server = i < S;
    const int rank = server ? i : i - S;
    Child& c = children[i];
    c.name = (server ? "server " : "worker ") + std::to_string(rank);
    const std::string binary = JoinPath(bin_dir, server ? "herd-server" : "herd-worker");
    std::vector<std::string> argv = {binary, options.config_path};
    for (const std::string& o : options.overrides) argv.insert(argv.end(), {"--set", o});
    argv.insert(argv.end(), {"--rank", std::to_string(rank), "--coordinator", address});
    if (options.train.resume) argv.push_back("--resume");
    if (options.train.stop_at_step > 0)
      argv.insert(argv.end(), {"--stop-at", std::to_string(options.train.stop_at_step)});
    const int threads = pick_threads ? std::max(1, cores / (server ? S : W)) : 0;
    st = Spawn(binary, argv, ChildEnvironment(token_file, threads), &c);
  }
  LogForwarder forwarder(&children);
  if (!st.ok()) (*coordinator)->Stop(st.message());

  // Reap; after the first failure the others have the coordinator's
  // PeerLost to stop on their own, then a grace period before SIGKILL.
  std::optional<int> first_failure;
  std::string first_failed;
  Stopwatch since_failure;
  bool grace_started = false;
  const double grace_s = cluster.heartbeat_timeout_s() + 10;
  for (size_t alive = std::count_if(children.begin(), children.end(), [](const Child& c) { return c.pid > 0; });
       alive > 0;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if ((first_failure || interrupted) && !grace_started) {
        grace_started = true;
        since_failure.Reset();
      }
      if (grace_started && since_failure.Seconds() > grace_s) {
        for (Child& c : children) {
          if (c.pid > 0 && !c.exit_code) ::kill(c.pid, SIGKILL);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (Child& c : children) {
      if (c.pid != pid) continue;
      c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      --alive;
      if (*c.exit_code != 0 && !first_failure) {
        first_failure = c.exit_code;
        first_failed = c.name;
        // Tell everyone now: a process that failed before the job formed
        // leaves the others waiting for it otherwise.
        (*coordinator)->Stop(c.name + " exited with code " + std::to_string(*c.exit_code));
      }
    }
  }
  forwarder.Join();
  if (first_failure || !st.ok()) (*coordinator)->Stop("the job's processes have exited");
  coordinator_thread.join();
  running = nullptr;
  if (!st.ok()) return ReportError(st);
  // Reaping order is not dying order: the coordinator knows who went first.
  for (const Child& c : children) {
    if (c.pid == (*coordinator)->first_lost_pid() && c.exit_code.value_or(0) != 0) {
      first_failure = c.exit_code;
      first_failed = c.name;
    }
  }
  if (first_failure) {
    std::fprintf(stderr, "herd: error: %s failed (exit code %d); the job stopped\n", first_failed.c_str(),
                 *first_failure);
    return *first_failure;
  }
  if (!coordinator_result.ok()) return ReportError(coordinator_result);
  return 0;
}

}  // namespace herd::tools
