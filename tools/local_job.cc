#include "tools/local_job.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <glog/logging.h>

#include "common/clock.h"
#include "common/descriptors.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/run_lock.h"
#include "common/signals.h"
#include "common/strings.h"
#include "data/prepare.h"
#include "model/checkpoint_run.h"
#include "sharding/grid.h"
#include "sharding/memory_plan.h"
#include "sharding/pipeline_plan.h"
#include "sharding/shard_plan.h"
#include "transport/coordinator.h"
#include "transport/rendezvous.h"
#include "transport/ucx_transport.h"

extern char** environ;

namespace herd::tools {
namespace {

// Placement variables that would contradict the ranks we hand out.
constexpr const char* kPlacementVars[] = {"SLURM_PROCID",     "SLURM_NTASKS",  "RANK",
                                          "WORLD_SIZE",       "MASTER_ADDR",   "MASTER_PORT",
                                          "HERD_COORDINATOR", "HERD_JOB_TOKEN"};

struct Child {
  std::string name;  // "server 0"
  std::string place;  // where it sits in a pipeline or a tensor group, for failure lines: " (pipeline stage 1)"; else empty
  bool worker = false;
  pid_t pid = -1;
  // Read by the forwarder while the reaper may start a child in a free
  // slot (an elastic job's replacement worker).
  std::atomic<int> out_fd{-1}, err_fd{-1};
  std::string out_partial, err_partial;
  // Its own "herd: error: ..." line, which the launcher's last line quotes
  // (written by the forwarder, read after it has joined).
  std::string error_line;
  std::optional<int> exit_code;
  int exit_order = -1;  // 0 for the first to exit, ...
  bool killed_after_grace = false;  // by the launcher: a consequence, not a cause
  bool dropped = false;             // a worker an elastic job (or a region a job of regions) went on without
  bool replaced = false;            // ... and another has been started to join in its place
  bool rejoins = false;             // started with --join in place of a lost region's process
};

// The rank in a child's name ("server 3" -> 3).
int RankOf(const Child& c) { return std::stoi(c.name.substr(c.name.rfind(' ') + 1)); }

// `passive_wait`: the child's idle OpenMP threads sleep rather than spin
// (OMP_WAIT_POLICY=PASSIVE) unless the environment says otherwise. A
// job's processes share this machine's cores, and threads that spin
// between parallel regions take them from the others: on a 16-core GPU
// node, a parameter server's sum of squares and the GPU worker's gradient
// adds ran 10x slower beside spinning threads and the step took 1.9x as
// long. CPU workers keep spinning: their compute is many short regions.
std::vector<std::string> ChildEnvironment(const std::string& token_file, int threads, bool passive_wait) {
  std::vector<std::string> env;
  if (passive_wait && std::getenv("OMP_WAIT_POLICY") == nullptr) env.push_back("OMP_WAIT_POLICY=PASSIVE");
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (std::find(std::begin(kPlacementVars), std::end(kPlacementVars), name) != std::end(kPlacementVars)) continue;
    if (name == "HERD_JOB_TOKEN_FILE" || (threads > 0 && name == "OMP_NUM_THREADS")) continue;
    if (name == kRunLockedByVariable) continue;
    env.push_back(entry);
  }
  env.push_back("HERD_JOB_TOKEN_FILE=" + token_file);
  env.push_back(RunLockedByThisProcessVariable());
  if (threads > 0) env.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
  return env;
}

// Starts a child that cannot outlive the launcher: the kernel SIGKILLs it
// when the launcher dies (PR_SET_PDEATHSIG), however the launcher dies. It
// runs in a process group of its own, so a terminal's Ctrl-C reaches the
// launcher alone, which then stops the job in order. Between fork and exec
// the child calls only async-signal-safe functions (the launcher has
// threads).
Status Spawn(const std::string& binary, const std::vector<std::string>& argv, const std::vector<std::string>& env,
             Child* child) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::IOError("pipe: " + std::string(std::strerror(errno)));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return Status::IOError("pipe: " + std::string(std::strerror(errno)));
  }
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl
    ::setpgid(0, 0);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    CloseOnExecAboveStdio();  // the coordinator's socket, the other children's pipes, UCX's files
    // The launcher blocks SIGINT/SIGTERM for its signal watcher; the child
    // starts with them deliverable and at their defaults.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGINT, &dfl, nullptr);
    ::sigaction(SIGTERM, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(binary.c_str(), cargv.data(), cenv.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  if (devnull >= 0) ::close(devnull);
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    return Status::IOError(binary + ": cannot start: " + std::strerror(fork_errno));
  }
  child->pid = pid;
  child->out_fd = out[0];
  child->err_fd = err[0];
  return Status::OK();
}

// Forwards every child's stdout, line by line, with its name; its stderr
// (its log lines) goes to the launcher's log file the same way (LogLine),
// so that a failure reads as one line on the launcher's stderr. A child's
// "herd: error:" line is kept too, for the launcher's last line.
class LogForwarder {
 public:
  explicit LogForwarder(std::vector<Child>* children) : children_(children) {
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
    thread_ = std::thread([this] { Run(); });
  }
  ~LogForwarder() {
    for (int fd : wake_) {
      if (fd >= 0) ::close(fd);
    }
  }
  // A child was started in a free slot: its pipes are read from now on.
  void Wake() {
    if (wake_[1] >= 0) (void)!::write(wake_[1], "w", 1);
  }
  // Once no child is started any more: returns when every pipe has
  // reached end of file.
  void Join() {
    done_ = true;
    Wake();
    thread_.join();
  }

 private:
  void Line(Child* c, std::string_view line, bool is_err) {
    constexpr std::string_view kError = "herd: error: ";
    if (is_err && line.starts_with(kError)) c->error_line = std::string(line.substr(kError.size()));
    if (is_err) return LogLine(c->name + ": " + std::string(line));
    std::fprintf(stdout, "%s: %.*s\n", c->name.c_str(), static_cast<int>(line.size()), line.data());
  }

  void Emit(Child* c, std::string* partial, const char* data, size_t n, bool is_err, bool flush_all) {
    partial->append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = partial->find('\n', start)) != std::string::npos; start = nl + 1) {
      Line(c, std::string_view(*partial).substr(start, nl - start), is_err);
    }
    partial->erase(0, start);
    if (flush_all && !partial->empty()) {
      Line(c, *partial, is_err);
      partial->clear();
    }
    std::fflush(stdout);
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
      const size_t children_fds = fds.size();
      if (children_fds == 0 && (done_ || wake_[0] < 0)) return;
      if (wake_[0] >= 0) fds.push_back({wake_[0], POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds.size() > children_fds && fds.back().revents != 0) {
        char drain[64];
        while (::read(wake_[0], drain, sizeof drain) > 0) {
        }
      }
      for (size_t i = 0; i < children_fds; ++i) {
        if (fds[i].revents == 0) continue;
        auto [c, is_err] = owners[i];
        char buf[65536];
        const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        std::atomic<int>& fd = is_err ? c->err_fd : c->out_fd;
        std::string* partial = is_err ? &c->err_partial : &c->out_partial;
        if (n > 0) {
          Emit(c, partial, buf, n, is_err, false);
        } else if (n == 0 || errno != EINTR) {
          Emit(c, partial, nullptr, 0, is_err, true);
          ::close(fd);
          fd = -1;
        }
      }
    }
  }

  std::vector<Child>* children_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// How long processes have to stop in order after SIGINT/SIGTERM.
constexpr double kStopGraceSeconds = 5;

std::string SignalName(int signo) {
  switch (signo) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    default: return "signal " + std::to_string(signo);
  }
}

// The process whose failure stopped the job: of those that failed on their
// own (not with kExitStoppedByJob, the code of processes that stopped
// because of another, nor after the launcher was told to stop, the
// `stop_order`-th exit on), the one the coordinator saw lost first, else
// the first to exit. Null when every failure was a consequence.
const Child* RootCause(const std::vector<Child>& children, int64_t first_lost_pid, int stop_order) {
  const Child* root = nullptr;
  for (const Child& c : children) {
    if (!c.exit_code || *c.exit_code == 0 || *c.exit_code == kExitStoppedByJob || c.killed_after_grace) continue;
    if (c.dropped && c.pid != first_lost_pid) continue;
    if (c.exit_order >= stop_order) continue;
    if (c.pid == first_lost_pid) return &c;
    if (root == nullptr || c.exit_order < root->exit_order) root = &c;
  }
  return root;
}

// How one start of the job's processes ended.
struct Outcome {
  int exit_code = 0;  // 0: the job finished
  // What stopped the job, for "herd: error: <cause>; the job stopped".
  std::string cause;
  bool setup_error = false;  // the job could not be started: the cause alone
  bool formed = false;     // every process had joined
  bool stopped = false;    // by SIGINT/SIGTERM to the launcher
  bool bad_input = false;  // the cause is a process's bad input (exit code 2): it would recur
  int replaced = 0;        // elastic: workers started to join in place of lost ones (restarts spent)
};

const char* StopReason(int signo) { return signo == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)"; }

// One start of the job's processes: the coordinator (on a thread of its
// own), every process, the forwarder of their output, the reaper and, in an
// elastic job with restarts left, the replacer of lost workers. Members in
// the order they are made; they go in the reverse order: the forwarder
// before the children it reads, the coordinator (its thread joined by Run)
// before the token's directory.
class JobAttempt {
 public:
  // `replacements`: workers an elastic job may start with --join in place
  // of lost ones. `stopped_by` (the stop signal, 0 while none) and
  // `running` (where the signal watcher finds the coordinator) are the
  // launcher's.
  JobAttempt(const config::JobConfig& config, const LocalJobOptions& options, const TrainOptions& train,
             int replacements, const std::string& bin_dir, std::atomic<int>* stopped_by,
             std::atomic<transport::Coordinator*>* running);

  // Starts the coordinator and every process, reaps them, and says how
  // the attempt ended.
  Outcome Run();

 private:
  // The job token in a private directory, and the coordinator, running.
  Status StartCoordinator();
  transport::CoordinatorOptions CoordinatorOptionsForJob(const std::string& token);
  // Starts the process of `rank` in slot `c`; one joining a job under way
  // (`join`) takes a lost worker's place.
  Status SpawnChild(Child& c, bool server, int rank, bool join);
  // Reaps every process; after the first failure the others have the
  // coordinator's PeerLost or Shutdown to stop on their own, then a grace
  // period before SIGKILL.
  void Reap();
  void OnExit(Child& c, int status);
  void KillAfterGrace();
  // Elastic: whether the job goes on without a failed child (another
  // worker runs), and starting workers in place of those it went on
  // without.
  bool GoesOnWithout(const Child& c) const;
  // Whether the job is ending: a worker has finished its run.
  bool Finishing() const;
  void ReplaceDropped();
  void RestartDroppedRegions();
  // The attempt's outcome once every process has exited.
  Outcome Conclude(const Status& spawned);
  Outcome SetupFailure(const Status& st);

  // Constant after construction.
  const config::JobConfig& config_;
  const LocalJobOptions& options_;
  const TrainOptions train_;
  const int replacements_;
  const std::string bin_dir_;
  const int servers_, workers_;
  const Grid grid_;  // names a worker by its place in the grid
  const bool replaces_;  // elastic, with restarts left
  const int cores_;
  const bool pick_threads_;  // no train.threads nor OMP_NUM_THREADS: workers share the cores
  std::atomic<int>& stopped_by_;
  std::atomic<transport::Coordinator*>& running_;

  // Shared with the coordinator's thread (its callbacks) and the forwarder.
  std::atomic<bool> formed_{false};
  // Pids the coordinator may report lost; only these are ever signalled.
  Mutex spawned_mu_;
  std::set<pid_t> spawned_ GUARDED_BY(spawned_mu_);
  std::set<pid_t> dropped_by_job_ GUARDED_BY(spawned_mu_);  // workers the elastic job went on without

  // Owned by the thread that calls Run; in lifetime order.
  Outcome out_;
  TempDir token_dir_;
  std::string token_file_;
  // Slots for every process, and for the workers an elastic job may start
  // in place of lost ones (they never move: the forwarder reads them).
  std::vector<Child> children_;
  std::unique_ptr<transport::Coordinator> coordinator_;
  Status coordinator_result_;
  std::thread coordinator_thread_;
  std::string address_;
  std::optional<LogForwarder> forwarder_;
  std::optional<int> first_failure_;
  Stopwatch since_failure_;
  bool grace_started_ = false;
  double grace_s_;
  int exits_ = 0;
  int stop_order_;  // the exits from this one on followed a stop signal
  size_t next_slot_;
  size_t alive_ = 0;
};

// The launcher's state across restarts: the signal watcher and where the
// coordinator of the running attempt is, for it.
class LocalJob {
 public:
  LocalJob(const config::JobConfig& config, const LocalJobOptions& options)
      : config_(config), options_(options), signals_([this](int signo) {
          if (stopped_by_ == 0) stopped_by_ = signo;
          if (auto* c = running_.load()) c->Stop(StopReason(signo));
        }) {}

  int Run();

 private:
  const config::JobConfig& config_;
  const LocalJobOptions& options_;
  std::string bin_dir_;
  std::atomic<transport::Coordinator*> running_{nullptr};
  std::atomic<int> stopped_by_{0};
  // Stop signals become an orderly shutdown; set up before any thread.
  SignalWatcher signals_;
};

int LocalJob::Run() {
  const auto& cluster = config_.cluster();
  const int S = cluster.servers(), W = cluster.workers();
  // What every process would refuse, refused once here, before anything is
  // written or started.
  auto plan = ParameterServerPlan(config_);  // a pipeline's schedule and split checked too
  if (!plan.ok()) return ReportError(plan.status().WithContext(options_.config_path + ": "));
  Status st = CheckJobFitsHere(config_, options_.config_path + ": the job's " + std::to_string(S) + " servers and " +
                                            std::to_string(W) + " workers (herd plan)");
  if (!st.ok()) return ReportError(st);
  // The run's checkpoint folder and metrics file are this launcher's for
  // the whole job, restarts included; its processes find them held.
  RunLocks locks;
  st = locks.Take(config_.checkpoint().dir(), config_.log().metrics(), true, true);
  if (!st.ok()) return ReportError(st);
  // Log lines, the launcher's (the coordinator's above all) and its
  // processes', go to a file: its stderr is for the one line that says why
  // a job failed.
  LogToFile(options_.log_file);
  st = CheckRunCanStart(config_, options_.train);
  if (!st.ok()) return ReportError(st);
  // Prepared once here (workers would otherwise race to prepare it), and
  // opened: a missing or bad file is one line, before anything starts.
  st = OpenJobData(config_.data(), config_.model().vocab_size()).status();
  if (!st.ok()) return ReportError(st);
  bin_dir_ = DirName(ThisExecutable());
  for (const char* name : {"herd-server", "herd-worker"}) {
    if (::access(JoinPath(bin_dir_, name).c_str(), X_OK) != 0) {
      return ReportError(Status::NotFound(JoinPath(bin_dir_, name) + ": not found (it is built beside herd)"));
    }
  }
  TrainOptions train = options_.train;
  for (int restarts = 0;; ++restarts) {
    const Outcome out = JobAttempt(config_, options_, train, options_.max_restarts - restarts, bin_dir_, &stopped_by_,
                                   &running_)
                            .Run();
    restarts += out.replaced;
    if (out.exit_code == 0) return 0;
    // A failure before every process had joined is a setup problem, and a
    // bad input fails the same way again: neither is retried.
    if (restarts >= options_.max_restarts || !out.formed || out.stopped || out.bad_input) {
      const std::string log = LogFileWritten();
      std::fprintf(stderr, "herd: error: %s%s%s\n", out.cause.c_str(), out.setup_error ? "" : "; the job stopped",
                   log.empty() ? "" : (" (the launcher's log: " + log + ")").c_str());
      return out.exit_code;
    }
    // The newest complete checkpoint, else the start (the failed attempt's
    // unfinished step directories are removed then).
    const std::string& dir = config_.checkpoint().dir();
    auto latest = dir.empty() ? StatusOr<VerifiedCheckpoint>(Status::NotFound("")) : LatestVerifiedCheckpoint(dir);
    train.resume = latest.ok();
    train.overwrite = !latest.ok();
    const std::string from =
        latest.ok() ? "resuming from " + latest->dir + " (step " + std::to_string(latest->manifest.step) + ")"
                    : std::string("starting over (no complete checkpoint yet)");
    std::printf("launch: restart %d of %d after %s; %s\n", restarts + 1, options_.max_restarts, out.cause.c_str(),
                from.c_str());
    std::fflush(stdout);
    if (!train.resume) {
      if (Status fresh = CheckFreshRun(dir, /*overwrite=*/true); !fresh.ok()) return ReportError(fresh);
    }
  }
}

JobAttempt::JobAttempt(const config::JobConfig& config, const LocalJobOptions& options, const TrainOptions& train,
                       int replacements, const std::string& bin_dir, std::atomic<int>* stopped_by,
                       std::atomic<transport::Coordinator*>* running)
    : config_(config),
      options_(options),
      train_(train),
      replacements_(replacements),
      bin_dir_(bin_dir),
      servers_(config.cluster().servers()),
      workers_(config.cluster().workers()),
      grid_(Grid::FromConfig(config)),
      replaces_((config.cluster().elastic() || Regions(config) > 1) && replacements > 0),
      cores_(std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      pick_threads_(config.train().threads() == 0 && std::getenv("OMP_NUM_THREADS") == nullptr),
      stopped_by_(*stopped_by),
      running_(*running),
      // A region's every process starts again; an elastic job's one worker.
      children_(servers_ + workers_ +
                (replaces_ ? replacements * (Regions(config) > 1 ? (servers_ + workers_) / Regions(config) : 1) : 0)),
      grace_s_(config.cluster().heartbeat_timeout_s() + 10),
      stop_order_(servers_ + workers_),
      next_slot_(servers_ + workers_) {}

Outcome JobAttempt::SetupFailure(const Status& st) {
  out_.cause = st.message();
  out_.setup_error = true;
  out_.exit_code = ExitCode(st);
  return out_;
}

transport::CoordinatorOptions JobAttempt::CoordinatorOptionsForJob(const std::string& token) {
  transport::CoordinatorOptions o = transport::CoordinatorOptions::FromConfig(config_);
  o.listen = "127.0.0.1:0";
  o.token = token;
  // A worker that joins later needs the token too.
  o.on_formed = [this] {
    if (!replaces_) ::unlink(token_file_.c_str());
    formed_ = true;
  };
  o.on_member_dropped = [this](int64_t pid) {
    MutexLock lock(&spawned_mu_);
    dropped_by_job_.insert(static_cast<pid_t>(pid));
  };
  // A process declared lost for silence (stopped, hung) is killed now
  // rather than after the grace period.
  o.on_silent = [this](int64_t pid) {
    MutexLock lock(&spawned_mu_);
    if (spawned_.count(static_cast<pid_t>(pid))) ::kill(static_cast<pid_t>(pid), SIGKILL);
  };
  return o;
}

Status JobAttempt::StartCoordinator() {
  if (const int stale = transport::RemoveStaleUcxShmFiles(); stale > 0) {
    std::printf("launch: removed %d stale UCX shared-memory file(s) of processes that no longer exist\n", stale);
  }
  // The job token, in a private directory; removed once every process has
  // joined (nobody needs it after that), and in any case when the job ends.
  TempDir::RemoveStale("herd-job");  // of launchers that were killed
  HERD_RETURN_IF_ERROR(token_dir_.Create("herd-job"));
  token_file_ = JoinPath(token_dir_.path(), "token");
  HERD_ASSIGN_OR_RETURN(const std::string token, transport::CreateJobToken(token_file_));
  HERD_ASSIGN_OR_RETURN(coordinator_, transport::Coordinator::Start(CoordinatorOptionsForJob(std::string(Trim(token)))));
  running_ = coordinator_.get();
  if (stopped_by_ != 0) coordinator_->Stop(StopReason(stopped_by_));
  coordinator_thread_ = std::thread([this] { coordinator_result_ = coordinator_->Run(); });
  address_ = "127.0.0.1:" + std::to_string(coordinator_->port());
  // Threads: workers share the cores; servers work while workers wait.
  std::printf("launch: coordinator on %s, %d servers, %d workers (%s); log lines to %s\n", address_.c_str(), servers_,
              workers_,
              pick_threads_ ? (std::to_string(std::max(1, cores_ / workers_)) + " threads per worker").c_str()
                            : "threads from the config/OMP_NUM_THREADS",
              options_.log_file.c_str());
  std::fflush(stdout);
  return Status::OK();
}

Status JobAttempt::SpawnChild(Child& c, bool server, int rank, bool join) {
  c.name = (server ? "server " : "worker ") + std::to_string(rank);
  if (!server) c.place = grid_.PlaceName(rank);
  c.worker = !server;
  const std::string binary = JoinPath(bin_dir_, server ? "herd-server" : "herd-worker");
  std::vector<std::string> argv = {binary, options_.config_path};
  for (const std::string& o : options_.overrides) argv.insert(argv.end(), {"--set", o});
  argv.insert(argv.end(), {"--rank", std::to_string(rank), "--coordinator", address_});
  if (join) {
    argv.push_back("--join");
  } else {
    if (train_.resume) argv.push_back("--resume");
    if (train_.resume && train_.allow_global_batch_change) argv.push_back("--allow-global-batch-change");
  }
  if (train_.stop_at_step > 0) argv.insert(argv.end(), {"--stop-at", std::to_string(train_.stop_at_step)});
  const int threads = pick_threads_ ? std::max(1, cores_ / (server ? servers_ : workers_)) : 0;
  MutexLock lock(&spawned_mu_);
  const bool passive_wait = server || config_.device().kind() == config::DeviceConfig::CUDA;
  Status started = Spawn(binary, argv, ChildEnvironment(token_file_, threads, passive_wait), &c);
  if (started.ok()) spawned_.insert(c.pid);
  return started;
}

bool JobAttempt::GoesOnWithout(const Child& c) const {
  if (!formed_) return false;
  if (Regions(config_) > 1) {
    // A job of regions goes on without the child's region while another
    // region has a process running.
    auto region = [this](const Child& x) { return RegionOf(config_, !x.worker, RankOf(x)); };
    for (const Child& other : children_) {
      if (other.pid > 0 && !other.exit_code && region(other) != region(c)) return true;
    }
    return false;
  }
  if (!config_.cluster().elastic() || !c.worker) return false;
  for (const Child& other : children_) {
    if (&other != &c && other.worker && other.pid > 0 && !other.exit_code) return true;
  }
  return false;
}

bool JobAttempt::Finishing() const {
  return std::any_of(children_.begin(), children_.end(), [](const Child& c) { return c.worker && c.exit_code == 0; });
}

// Elastic, with restarts left: a worker the job went on without (the
// coordinator has dropped it, so its place is free) is replaced by one
// that joins, unless the job is ending (a worker has finished).
void JobAttempt::ReplaceDropped() {
  if (Regions(config_) > 1) return RestartDroppedRegions();
  for (size_t i = 0; i < next_slot_ && next_slot_ < children_.size(); ++i) {
    Child& c = children_[i];
    if (!c.dropped || c.replaced || first_failure_ || stopped_by_ != 0) continue;
    {
      MutexLock lock(&spawned_mu_);
      if (Finishing() || !dropped_by_job_.count(c.pid)) continue;
    }
    c.replaced = true;
    const int rank = RankOf(c);
    Child& fresh = children_[next_slot_++];
    if (Status started = SpawnChild(fresh, false, rank, true); !started.ok()) {
      std::printf("launch: cannot start a worker to join in place of %s: %s\n", c.name.c_str(),
                  started.message().c_str());
      continue;
    }
    ++out_.replaced;
    ++alive_;
    std::printf("launch: a new worker %d joins in place of the lost one (restart %d of %d)\n", rank,
                options_.max_restarts - replacements_ + out_.replaced, options_.max_restarts);
    std::fflush(stdout);
    forwarder_->Wake();
  }
}

// A job of regions, with restarts left: a region the job went on without
// whose every process has exited (the coordinator has let each go) starts
// again, each process with --join in its place, unless the job is ending
// (a worker has finished).
void JobAttempt::RestartDroppedRegions() {
  const int R = Regions(config_);
  const size_t region_size = static_cast<size_t>((servers_ + workers_) / R);
  for (int k = 0; k < R; ++k) {
    if (first_failure_ || stopped_by_ != 0 || Finishing() || next_slot_ + region_size > children_.size()) return;
    std::vector<Child*> dropped;
    bool running = false;
    for (size_t i = 0; i < next_slot_; ++i) {
      Child& c = children_[i];
      if (RegionOf(config_, !c.worker, RankOf(c)) != k || c.replaced) continue;
      running |= c.pid > 0 && !c.exit_code;
      if (c.dropped) dropped.push_back(&c);
    }
    if (running || dropped.size() != region_size) continue;
    {
      MutexLock lock(&spawned_mu_);
      bool all_let_go = true;
      for (const Child* c : dropped) all_let_go &= dropped_by_job_.count(c->pid) > 0;
      if (!all_let_go) continue;
    }
    ++out_.replaced;
    std::printf("launch: region %d starts again, its %zu processes with --join (restart %d of %d)\n", k,
                region_size, options_.max_restarts - replacements_ + out_.replaced, options_.max_restarts);
    std::fflush(stdout);
    for (Child* c : dropped) {
      c->replaced = true;
      Child& fresh = children_[next_slot_++];
      fresh.rejoins = true;
      if (Status started = SpawnChild(fresh, !c->worker, RankOf(*c), true); !started.ok()) {
        std::printf("launch: cannot start %s again: %s\n", c->name.c_str(), started.message().c_str());
        continue;
      }
      ++alive_;
    }
    forwarder_->Wake();
  }
}

void JobAttempt::OnExit(Child& c, int status) {
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.exit_order = exits_++;
  --alive_;
  if (*c.exit_code == 0 || first_failure_) return;
  if (c.rejoins && Finishing()) {
    // The coordinator stopped it: the run ended before its region was
    // admitted at an outer step.
    std::printf("launch: %s exited (exit code %d): the job finished before its region rejoined\n", c.name.c_str(),
                *c.exit_code);
    std::fflush(stdout);
    return;
  }
  if (GoesOnWithout(c)) {
    c.dropped = true;
    const std::string without = Regions(config_) > 1
                                    ? "its region " + std::to_string(RegionOf(config_, !c.worker, RankOf(c))) +
                                          " (cluster.diloco)"
                                    : "it (cluster.elastic)";
    std::printf("launch: %s exited (%s); the job goes on without %s\n", c.name.c_str(),
                *c.exit_code > 128 ? ("killed by " + SignalName(*c.exit_code - 128)).c_str()
                                   : ("exit code " + std::to_string(*c.exit_code)).c_str(),
                without.c_str());
    std::fflush(stdout);
    return;
  }
  first_failure_ = c.exit_code;
  // Tell everyone now: a process that failed before the job formed
  // leaves the others waiting for it otherwise.
  coordinator_->Stop(c.name + " exited with code " + std::to_string(*c.exit_code));
}

// After a failure or a stop signal: the grace period starts (shorter after
// a stop signal: whoever has not joined yet never hears the coordinator's
// Shutdown), and what outlives it is killed.
void JobAttempt::KillAfterGrace() {
  if ((first_failure_ || stopped_by_ != 0) && !grace_started_) {
    grace_started_ = true;
    since_failure_.Reset();
    if (!first_failure_) grace_s_ = kStopGraceSeconds;
  }
  if (!grace_started_ || since_failure_.Seconds() <= grace_s_) return;
  for (Child& c : children_) {
    if (c.pid > 0 && !c.exit_code && !c.killed_after_grace) {
      ::kill(c.pid, SIGKILL);
      c.killed_after_grace = true;
    }
  }
}

void JobAttempt::Reap() {
  alive_ = std::count_if(children_.begin(), children_.end(), [](const Child& c) { return c.pid > 0; });
  while (alive_ > 0) {
    int status = 0;
    if (stopped_by_ != 0) stop_order_ = std::min(stop_order_, exits_);
    if (replaces_) ReplaceDropped();
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      KillAfterGrace();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (Child& c : children_) {
      if (c.pid == pid) OnExit(c, status);
    }
  }
}

Outcome JobAttempt::Run() {
  if (Status started = StartCoordinator(); !started.ok()) {
    // Nothing runs yet but, perhaps, the coordinator's thread.
    if (coordinator_thread_.joinable()) {
      coordinator_->Stop(started.message());
      coordinator_thread_.join();
      running_ = nullptr;
    }
    return SetupFailure(started);
  }
  // A stop signal ends the spawning at once.
  Status st;
  for (int i = 0; i < servers_ + workers_ && st.ok() && stopped_by_ == 0; ++i) {
    st = SpawnChild(children_[i], i < servers_, i < servers_ ? i : i - servers_, false);
  }
  forwarder_.emplace(&children_);
  if (!st.ok()) coordinator_->Stop(st.message());
  Reap();
  forwarder_->Join();
  coordinator_->Stop("the job's processes have exited");
  coordinator_thread_.join();
  running_ = nullptr;
  return Conclude(st);
}

Outcome JobAttempt::Conclude(const Status& spawned) {
  out_.formed = formed_;
  out_.stopped = stopped_by_ != 0;
  if (!spawned.ok()) return SetupFailure(spawned);
  // The launcher's last line names the cause: the process that failed on its
  // own (reaping order is not dying order: the coordinator knows who went
  // first), with its own message.
  const Child* root = RootCause(children_, coordinator_->first_lost_pid(), stop_order_);
  // A crash is never hidden behind the cause, even while the job stopped.
  for (const Child& c : children_) {
    const int code = c.exit_code.value_or(0);
    if (&c == root || c.killed_after_grace || code <= 128) continue;
    const int signo = code - 128;
    if (signo == SIGKILL || signo == SIGTERM || signo == SIGINT) continue;
    LOG(ERROR) << "launch: " << c.name << " crashed (" << SignalName(signo) << ")"
               << (c.error_line.empty() ? "" : ": " + c.error_line);
  }
  if (stopped_by_ != 0 && root == nullptr) {
    out_.cause = StopReason(stopped_by_);
    out_.exit_code = 128 + stopped_by_;
    return out_;
  }
  if (root != nullptr) {
    const int code = *root->exit_code;
    // A process that said nothing (killed, stopped) is described by what the
    // coordinator saw of it, else by how it died.
    const bool lost_first = root->pid == coordinator_->first_lost_pid() && !coordinator_result_.ok();
    std::string what = !root->error_line.empty() ? root->error_line
                       : lost_first              ? coordinator_result_.message()
                       : code > 128              ? "killed by " + SignalName(code - 128)
                                                 : "no message";
    out_.cause = root->name + root->place + " failed (exit code " + std::to_string(code) + "): " + what;
    out_.exit_code = stopped_by_ != 0 ? 128 + stopped_by_ : code;
    out_.bad_input = code == kExitBadInput;
    return out_;
  }
  if (first_failure_) {
    // Every process stopped because of something outside them all.
    out_.cause = coordinator_result_.ok() ? std::string("the job's processes stopped") : coordinator_result_.message();
    out_.exit_code = *first_failure_;
    return out_;
  }
  if (!coordinator_result_.ok()) return SetupFailure(coordinator_result_);
  return out_;
}

}  // namespace

int RunLocalJob(const config::JobConfig& config, const LocalJobOptions& options) {
  LocalJobOptions with_log = options;
  if (with_log.log_file.empty()) with_log.log_file = LaunchLogPath(config);
  return LocalJob(config, with_log).Run();
}

std::string LaunchLogPath(const config::JobConfig& config) {
  if (!config.checkpoint().dir().empty()) return JoinPath(config.checkpoint().dir(), "launch.log");
  const char* tmp = std::getenv("TMPDIR");
  return JoinPath(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "herd-launch-" + std::to_string(::getpid()) + ".log");
}

}  // namespace herd::tools
