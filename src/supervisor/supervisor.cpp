// The life of one execution. Read top to bottom: launch, I/O, exit, stop, close.
//
// Concurrency model: everything runs on the manager's single-threaded io_context. Each
// asynchronous operation this object starts (reader waits, the stdin writer wait, the exit
// observer, every timer wait) increments pending_ and its handler decrements it first thing.
// An execution is closed only when the root's exit was observed, the tree teardown finished,
// every reader reached EOF (or was closed at its bound), and pending_ is zero — i.e. every
// support task has completed, none is merely abandoned.
//
// Blocking scans never run on the loop thread: the final /proc marker sweep (with the wait for
// unattributed orphans to finish dying) and workspace disk walks go to the manager's worker
// thread with copies of what they need (the marker, options, pidfds, a dup of the workspace fd)
// and post their result back to the loop; each counts in pending_ like any other async task.
#include "supervisor.hpp"

#include <boost/asio/post.hpp>
#include <boost/json/value_from.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <limits>
#include <signal.h>
#include <sys/ioctl.h>
#include <system_error>
#include <unistd.h>
#include <utility>

#include "custos/sys/openat2.hpp"
#include "custos/sys/pty.hpp"
#include "custos/sys/rlimits.hpp"
#include "custos/sys/sampler.hpp"
#include "custos/sys/spawn.hpp"

namespace custos::supervisor {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kGracefulPoll{10};
constexpr milliseconds kKillPoll{2};
// With cgroup.events watched, the timer is only the fallback (a lost notification, the kill
// bound); the tree-empty wake-up comes from inotify.
constexpr milliseconds kKillPollWatched{20};
constexpr milliseconds kExitRetry{10};
// How long unattributed orphans may take to finish dying before they count as survivors.
constexpr milliseconds kOrphanSettle{200};
// Reads per readiness wake-up before yielding to other executions on the loop.
constexpr int kReadsPerWake = 16;
// Pipe size for a stream once it fills whole chunks (the default pipe-max-size for non-root).
constexpr int kBusyPipeBytes = 1 << 20;
constexpr ssize_t kBusyReadBytes = 32 * 1024;
// exec.output returns at most this much per call.
constexpr std::uint64_t kMaxSliceBytes = 16ULL << 20U;

std::uint64_t sat_sub(std::uint64_t a, std::uint64_t b) {
  return a > b ? a - b : 0;
}
std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b
             ? std::numeric_limits<std::uint64_t>::max()
             : a + b;
}

std::string signal_wire(int sig) {
  if (sig == SIGKILL) return "SIGKILL";
  if (auto n = core::signal_name(static_cast<std::uint32_t>(sig))) return std::string{*n};
  return "SIG" + std::to_string(sig);
}

boost::json::object exit_json(core::ExitStatus const& e) {
  boost::json::object o;
  if (e.code)
    o["code"] = *e.code;
  else
    o["code"] = nullptr;
  if (e.signal)
    o["signal"] = *e.signal;
  else
    o["signal"] = nullptr;
  return o;
}

// spawn.failed contexts carry "step=<name>"; the terminal record keeps that name as the code.
std::string step_of(Error const& e, std::string_view fallback) {
  auto pos = e.context.find("step=");
  if (pos == std::string::npos) return std::string{fallback};
  auto end = e.context.find_first_of(" ,;:)", pos + 5);
  return e.context.substr(pos + 5, end == std::string::npos ? std::string::npos : end - pos - 5);
}

core::SpawnFailure failure_from(std::string code, Error const& e) {
  return core::SpawnFailure{std::move(code), e.sys_errno, e.message()};
}

// Our ends of the stdio streams are read and written with plain read(2)/write(2), which must
// never block the loop. Set through asio (one FIONBIO ioctl) rather than fcntl: asio then knows
// the descriptor is non-blocking and does not issue its own ioctl at the first wait, so each
// stream costs one syscall here instead of three (F_GETFL, F_SETFL, then asio's FIONBIO).
void set_nonblocking(boost::asio::posix::stream_descriptor& sd) {
  boost::system::error_code ec;
  // A failure leaves the descriptor to asio's own attempt at its first wait.
  (void)sd.non_blocking(true, ec);
}

// The 0:: entry of /proc/<pid>/cgroup, read by pid; used only as a re-check after a pidfd was
// opened for a pid listed in cgroup.procs (the pidfd pins the process, so a match after the
// open means the pidfd names a member).
std::optional<std::string> cgroup_of(std::int32_t pid) {
  auto dir = sys::open_dir_path("/proc/" + std::to_string(pid));
  if (!dir) return std::nullopt;
  auto text = sys::read_file_at(*dir, "cgroup");
  if (!text) return std::nullopt;
  auto own = sys::parse_own_cgroup(*text);
  if (!own) return std::nullopt;
  return *own;
}

// usage_usec of the cgroup's cpu.stat (it includes exited members).
std::optional<std::uint64_t> cgroup_cpu_usec(sys::CgroupDir const& cg) {
  auto text = sys::read_shown_file_at(cg.fd(), "cpu.stat");
  if (!text) return std::nullopt;
  std::string_view rest = *text;
  constexpr std::string_view kKey = "usage_usec ";
  if (!rest.starts_with(kKey)) {
    auto const at = rest.find("\nusage_usec ");
    if (at == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(at + 1);
  }
  rest.remove_prefix(kKey.size());
  std::uint64_t v = 0;
  auto const [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
  if (ec != std::errc{} || end == rest.data()) return std::nullopt;
  return v;
}

}  // namespace

Supervisor::Supervisor(ExecutionManager& manager, std::string execution_id, LaunchRequest request,
                       PlanView plan, std::string plan_digest)
    : manager_(&manager),
      io_(manager.io_),
      id_(std::move(execution_id)),
      request_(std::move(request)),
      plan_(std::move(plan)),
      plan_digest_(std::move(plan_digest)),
      events_(id_, plan_digest_, manager.config_.retained_event_count,
              static_cast<std::size_t>(plan_.retained_bytes)),
      deadline_(io_),
      stage_timer_(io_),
      poll_timer_(io_),
      drain_timer_(io_),
      sampler_timer_(io_),
      reader_timer_(io_),
      exit_retry_timer_(io_) {
  readers_.reserve(2);
}

// A launch between its staged child and the child's verdict: the child at (or just past) its
// barrier, both ends of its stdio, and — for launch_async — whom to tell, the readiness watch
// of the child's report channel and the bound on that wait.
// A launch's answer waits for its result and for the committed write (either may come first).
struct Supervisor::PendingStart {
  LaunchDone done;
  std::optional<StartResult> result;
  std::optional<Result<>> committed;
  std::function<void()> then;  // the terminal record's publication, held until the answer
};

struct Supervisor::Launching {
  Launching(sys::StagedChild child, boost::asio::io_context& io)
      : staged(std::move(child)), timer(io) {}
  sys::StagedChild staged;
  sys::UniqueFd child_in, child_out, child_err, our_in, our_out, our_err;
  std::optional<sys::Pty> pty;
  LaunchDone done;
  std::optional<boost::asio::posix::stream_descriptor> channel;
  boost::asio::steady_timer timer;
  bool timed_out = false;
};

Supervisor::~Supervisor() = default;

// ------------------------------------------------------------------------------ launch

Result<std::vector<std::string>> Supervisor::build_env() const {
  std::vector<std::string> env;
  env.reserve(plan_.env.size() + 1);
  // Inherited values come from the daemon's snapshot only (see ManagerConfig::inherit_source).
  auto const& source = manager_->config_.inherit_source;
  for (auto const& e : plan_.env) {
    if (e.name == sys::Marker::env_name()) continue;  // the marker is the supervisor's, always
    if (e.value) {
      env.push_back(e.name + "=" + *e.value);
    } else if (source) {
      if (auto it = source->find(e.name); it != source->end()) {
        env.push_back(e.name + "=" + it->second);
      }
    }
  }
  env.push_back(marker_->env_entry());
  return env;
}

StartResult Supervisor::spawn_failed_result(core::SpawnFailure failure) {
  // The caller learns this outcome only once the claim behind it is durable (a sink may
  // commit it without waiting for its fsync; see OwnershipSink::make_durable) — unless the
  // launch awaited that already (and later group commits are not this caller's to wait for).
  if (manager_->config_.sink != nullptr && !claim_durable_) {
    (void)manager_->config_.sink->make_durable(id_);
  }
  fail_spawn(std::move(failure));
  return start_result(0);
}

std::string Supervisor::cgroup_path() const {
  return cgroup_ ? cgroup_->path() : std::string{};
}

StartResult Supervisor::start_result(std::int32_t pid) const {
  StartResult res;
  res.execution_id = id_;
  res.plan_digest = plan_digest_;
  res.phase = life_.phase;
  res.boundary = boundary_;
  res.pid = pid;
  return res;
}

Result<StartResult> Supervisor::launch(Boundary boundary, sys::CgroupDir const* subtree,
                                       std::string const& cgroup_mount, bool nsdelegate,
                                       std::size_t live_executions) {
  auto begun =
      CUSTOS_TRY(begin_launch(boundary, subtree, cgroup_mount, nsdelegate, live_executions));
  if (begun) return std::move(*begun);
  // The claim and the staged ownership reach stable storage before any of the target's code
  // can run: the wait for the claim's fsync overlapped everything since record_authorized.
  if (auto* sink = manager_->config_.sink; sink != nullptr) {
    if (auto r = sink->record_staged(id_, launching_->staged.identity(), boundary_, cgroup_path(),
                                     marker_->env_value());
        !r) {
      launching_.reset();  // kills the staged child at its barrier: no user code ran
      return spawn_failed_result(failure_from("record_staged", r.error()));
    }
    if (auto d = sink->make_durable(id_); !d) {
      launching_.reset();  // kills the staged child at its barrier: no user code ran
      return spawn_failed_result(failure_from("durability", d.error()));
    }
  }
  claim_durable_ = true;
  auto running = std::move(launching_->staged).release();
  return finish_launch(std::move(running));
}

void Supervisor::launch_async(Boundary boundary, sys::CgroupDir const* subtree,
                              std::string const& cgroup_mount, bool nsdelegate,
                              std::size_t live_executions, LaunchDone done) {
  auto* sink = manager_->config_.sink;
  if (sink == nullptr) {
    return launch_authorized(boundary, subtree, cgroup_mount, nsdelegate, live_executions,
                             std::move(done));
  }
  // The claim and the record are committed off the loop; nothing is created for the execution
  // (no cgroup, no child) before they are, exactly as in the blocking launch.
  sink->record_authorized_async(
      id_, request_.identity, request_.plan, plan_digest_,
      [self = shared_from_this(), boundary, subtree, mount = cgroup_mount, nsdelegate,
       live_executions, done = std::move(done)](Result<> authorized) mutable {
        if (self->detached_) return;  // the manager is gone: nobody is left to tell
        if (!authorized) return done(authorized.error());
        self->authorized_ = true;
        self->launch_authorized(boundary, subtree, mount, nsdelegate, live_executions,
                                std::move(done));
      });
}

void Supervisor::launch_authorized(Boundary boundary, sys::CgroupDir const* subtree,
                                   std::string const& cgroup_mount, bool nsdelegate,
                                   std::size_t live_executions, LaunchDone done) {
  auto begun = begin_launch(boundary, subtree, cgroup_mount, nsdelegate, live_executions);
  if (!begun) return done(begun.error());
  if (*begun) return done(std::move(**begun));
  launching_->done = std::move(done);
  // Staged, its verdict pending: the root is this execution's already (the orphan reaper
  // leaves it to the launch), and so is its cgroup.
  manager_->note_child(*this, root_pid_);
  auto* sink = manager_->config_.sink;
  if (sink == nullptr) return on_durable(ok());
  // The staged record is committed off the loop (with other launches' writes); the barrier
  // is released only from its completion, once it is in the WAL and the claim is durable.
  sink->record_staged_async(
      id_, launching_->staged.identity(), boundary_, cgroup_path(), marker_->env_value(),
      [self = shared_from_this()](Result<> staged) {
        if (self->detached_ || !self->launching_) return;  // the manager is gone
        if (!staged) return self->fail_launch(failure_from("record_staged", staged.error()));
        self->manager_->config_.sink->when_durable(self->id_, [self](Result<> d) {
          if (self->detached_ || !self->launching_) return;
          self->on_durable(std::move(d));
        });
      });
}

void Supervisor::on_durable(Result<> durable) {
  if (!durable) return fail_launch(failure_from("durability", durable.error()));
  claim_durable_ = true;
  Launching& l = *launching_;
  // The watch first: until the go byte is sent, a failure here still kills a child that ran
  // nothing of the target.
  auto watch = l.staged.watch_channel();
  if (!watch) return fail_launch(failure_from("barrier", watch.error()));
  try {
    l.channel.emplace(io_, watch->get());
    (void)watch->release();  // the descriptor object owns it now
  } catch (std::exception const& ex) {
    return fail_launch(failure_from(
        "barrier", Error(Errc::sys_error, std::string{"watching the child: "} + ex.what())));
  }
  l.staged.send_go();
  // The same bound release() puts on its wait; a child that neither execs nor reports by
  // then is killed (dropping the StagedChild) and the launch is spawn_failed.
  l.timer.expires_after(l.staged.timeout());
  l.timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->detached_ || !self->launching_ || !self->launching_->channel) return;
    self->launching_->timed_out = true;
    self->launching_->channel->cancel();
  });
  await_verdict();
}

void Supervisor::await_verdict() {
  launching_->channel->async_wait(boost::asio::posix::descriptor_base::wait_read,
                                  [self = shared_from_this()](boost::system::error_code) {
                                    if (self->detached_ || !self->launching_) return;
                                    self->on_verdict();
                                  });
}

void Supervisor::on_verdict() {
  Launching& l = *launching_;
  auto verdict = l.staged.poll_verdict();
  if (verdict && !*verdict) {
    // The "ready" report only, or nothing yet: wait on, unless the bound has passed.
    if (!l.timed_out) return await_verdict();
    return fail_launch(failure_from(
        "execve",
        Error(Errc::spawn_failed, "the child did not finish its setup in time", ETIMEDOUT)));
  }
  // The channel could not be read: the child is killed and reaped before the failure is
  // recorded (as release() does), so the cleanup it reports is true.
  if (!verdict)
    return fail_launch(failure_from(step_of(verdict.error(), "execve"), verdict.error()));
  l.timer.cancel();
  l.channel.reset();
  Result<sys::RunningChild> running = std::move(l.staged).finish();
  // The caller hears of the start once the committed slot (with phase running) is in the WAL:
  // a crash before that is recovered as a launch whose commit was not recorded, and no caller
  // was told otherwise. The transaction runs off the loop; whichever of it and the launch's
  // own result comes second answers.
  auto pending = std::make_shared<PendingStart>();
  pending->done = std::move(l.done);
  CommitDone on_committed;
  if (running && manager_->config_.sink != nullptr) {
    on_committed = [self = shared_from_this(), pending](Result<> committed) {
      if (self->detached_) return;  // the manager is gone: nobody is left to tell
      if (!pending->done) {
        // Answered already (the exception path below): a failure still stops the target.
        if (!committed) self->on_commit_failed(committed.error());
        return;
      }
      pending->committed = std::move(committed);
      self->answer_start(*pending);
    };
  } else {
    pending->committed = ok();
  }
  try {
    pending->result = finish_launch(std::move(running), std::move(on_committed));
  } catch (std::exception const& ex) {
    // A handler of the loop (bad_alloc and the like): the caller is still answered, with what
    // the execution is now; it stays this manager's (and is stopped at shutdown).
    sink_error_ = std::string{"launch: "} + ex.what();
    pending->result = start_result(root_ ? root_pid_ : 0);
    if (!pending->committed) pending->committed = ok();  // answered now, whatever may come
  }
  pending_start_ = pending;
  answer_start(*pending);
}

void Supervisor::answer_start(PendingStart& p) {
  if (!p.result || !p.committed || !p.done) return;
  if (!*p.committed) on_commit_failed(p.committed->error());
  LaunchDone done = std::move(p.done);
  p.done = nullptr;
  done(std::move(*p.result));
  // A terminal record whose completion overtook this one (completions of batches committed by
  // different threads may reach the loop in either order) is published now, after the start.
  if (p.then) {
    auto then = std::move(p.then);
    p.then = nullptr;
    then();
  }
  pending_start_.reset();
}

void Supervisor::on_commit_failed(Error const& e) {
  // The target runs but its ownership is not durable: it is stopped, and the view says why.
  sink_error("record_committed", e);
  (void)offer(core::Trigger::backend_failure, "ownership commit failed: " + e.message());
}

void Supervisor::fail_launch(core::SpawnFailure failure) {
  LaunchDone done = std::move(launching_->done);
  launching_.reset();  // kills the child if it is still staged
  done(spawn_failed_result(std::move(failure)));
}

Result<std::optional<StartResult>> Supervisor::begin_launch(Boundary boundary,
                                                            sys::CgroupDir const* subtree,
                                                            std::string const& cgroup_mount,
                                                            bool nsdelegate,
                                                            std::size_t live_executions) {
  auto const& cfg = manager_->config_;
  started_ = Clock::now();
  started_wall_ = std::chrono::system_clock::now();
  concurrency_ = live_executions + 1;

  if (cfg.sink != nullptr && !authorized_) {
    if (auto r = cfg.sink->record_authorized(id_, request_.identity, request_.plan, plan_digest_);
        !r) {
      return r.error();
    }
  }
  advance(core::event::SpawnRequested{});

  boundary_ = Boundary::marker;
  auto failed = [&](core::SpawnFailure f) -> std::optional<StartResult> {
    return spawn_failed_result(std::move(f));
  };

  auto marker = sys::Marker::generate();
  if (!marker) return failed(failure_from("marker", marker.error()));
  marker_ = *marker;
  auto env = build_env();
  if (!env) return failed(failure_from("environment", env.error()));

  // Credentials: the caller's unless the plan names a user (the manager already refused a
  // non-root caller naming someone else).
  std::uint32_t const run_uid = plan_.user ? plan_.user->uid : request_.caller.uid;
  std::uint32_t const run_gid = plan_.user ? plan_.user->gid : request_.caller.gid;
  std::optional<sys::SpawnCredentials> creds;
  if (run_uid != ::geteuid() || run_gid != ::getegid() || plan_.user) {
    sys::SpawnCredentials c;
    c.uid = run_uid;
    c.gid = run_gid;
    // Without a plan user the caller's supplementary groups are unknown here (SO_PEERCRED has
    // only uid/gid), so they are cleared rather than inheriting the daemon's.
    if (plan_.user) c.groups.assign(plan_.user->groups.begin(), plan_.user->groups.end());
    creds = std::move(c);
  }

  auto ws = sys::open_directory(plan_.workspace_root);
  if (!ws) return failed(failure_from("workspace", ws.error()));
  workspace_fd_ = std::move(*ws);
  if (plan_.disk_bytes) {
    // Disk growth is measured against the workspace as it was before the child ran.
    if (auto d = sys::walk_disk_usage(workspace_fd_, cfg.disk_walk_max_entries)) {
      disk_baseline_ = d->bytes;
      last_disk_sample_ = started_;
    }
  }

  if (boundary == Boundary::cgroup && subtree != nullptr) {
    auto cg = sys::CgroupDir::create(*subtree, id_);
    if (cg) {
      cgroup_ = std::move(*cg);
      boundary_ = Boundary::cgroup;
      if (cgroup_->path().size() > cgroup_mount.size() &&
          cgroup_->path().compare(0, cgroup_mount.size(), cgroup_mount) == 0) {
        cgroup_rel_ = cgroup_->path().substr(cgroup_mount.size());
      }
      // Kernel limits where this host has the controllers; elsewhere the sampler enforces them
      // (fidelity sampled) — sys.unsupported here is expected, not an error.
      if (plan_.memory_bytes)
        memory_hard_ = cgroup_->set_memory_max(*plan_.memory_bytes).has_value();
      if (plan_.processes) pids_hard_ = cgroup_->set_pids_max(*plan_.processes).has_value();
    } else if (cfg.boundary == BoundaryPreference::cgroup) {
      return failed(failure_from("cgroup", cg.error()));
    }
  }
  kernel_enforced_ = boundary_ == Boundary::cgroup && (run_uid != 0 || nsdelegate);

  // stdio: three pipes, or one terminal.
  sys::UniqueFd child_in, child_out, child_err, our_in, our_out, our_err;
  std::optional<sys::Pty> pty;
  if (plan_.pty) {
    auto p = sys::Pty::open(plan_.rows, plan_.cols);
    if (!p) return failed(failure_from("pty", p.error()));
    pty = std::move(*p);
  } else {
    auto in = sys::make_pipe();
    if (!in) return failed(failure_from("pipe", in.error()));
    auto out = sys::make_pipe();
    if (!out) return failed(failure_from("pipe", out.error()));
    auto err = sys::make_pipe();
    if (!err) return failed(failure_from("pipe", err.error()));
    child_in = std::move(in->first);
    our_in = std::move(in->second);
    our_out = std::move(out->first);
    child_out = std::move(out->second);
    our_err = std::move(err->first);
    child_err = std::move(err->second);
  }

  sys::SpawnSpec spec;
  spec.executable = plan_.executable;
  spec.argv = plan_.argv;
  spec.envp = std::move(*env);
  if (pty) {
    spec.pty_slave_fd = pty->slave().get();
    spec.controlling_tty = true;
  } else {
    spec.stdin_fd = child_in.get();
    spec.stdout_fd = child_out.get();
    spec.stderr_fd = child_err.get();
  }
  spec.workspace_root_fd = workspace_fd_.get();
  spec.cwd = plan_.cwd;
  if (plan_.open_files) {
    spec.rlimits.push_back(sys::Rlimit{RLIMIT_NOFILE, *plan_.open_files, *plan_.open_files});
  }
  if (cgroup_) {
    spec.cgroup_fd = cgroup_->fd().get();
    spec.new_cgroup_namespace = true;
  }
  spec.credentials = std::move(creds);
  spec.new_session = true;
  // One wait on the child (in release()) instead of two: the child sets itself up while the
  // staged ownership is recorded. The barrier still holds the target until release(), so the
  // record still precedes any of its code; a setup failure (credentials, limits, tty) becomes
  // spawn_failed with its step from release(), as an execve failure does, after record_staged.
  spec.wait_for_setup = false;

  auto staged = sys::spawn_staged(spec);
  if (!staged) return failed(failure_from(step_of(staged.error(), "clone3"), staged.error()));
  root_pid_ = staged->pid();
  root_start_ticks_ = staged->identity().start_time_ticks;
  // Staged: the rest (its record, durability, release, the verdict) is launch()'s or
  // launch_async()'s.
  launching_ = std::make_unique<Launching>(std::move(*staged), io_);
  launching_->child_in = std::move(child_in);
  launching_->child_out = std::move(child_out);
  launching_->child_err = std::move(child_err);
  launching_->our_in = std::move(our_in);
  launching_->our_out = std::move(our_out);
  launching_->our_err = std::move(our_err);
  launching_->pty = std::move(pty);
  return std::optional<StartResult>{};
}

StartResult Supervisor::finish_launch(Result<sys::RunningChild> running, CommitDone committed) {
  auto const& cfg = manager_->config_;
  // The launch's descriptors close when this returns (ours of the child's ends must go, or
  // EOF would never come).
  std::unique_ptr<Launching> const l = std::move(launching_);
  if (!running) {
    return spawn_failed_result(failure_from(step_of(running.error(), "execve"), running.error()));
  }
  root_ = std::move(*running).take_pidfd();
  sys::UniqueFd our_in = std::move(l->our_in);
  sys::UniqueFd our_out = std::move(l->our_out);
  sys::UniqueFd our_err = std::move(l->our_err);
  std::optional<sys::Pty>& pty = l->pty;

  std::optional<Error> commit_error;
  if (cfg.sink != nullptr) {
    // Before `running` is recorded (advance below): the sink may write both in one change.
    if (committed) {
      cfg.sink->record_committed_async(id_, std::move(committed));
    } else if (auto r = cfg.sink->record_committed(id_); !r) {
      commit_error = r.error();
    }
  }
  advance(core::event::Spawned{});

  // The child has its copies; ours of the child ends must go, or EOF would never come.
  l->child_in.reset();
  l->child_out.reset();
  l->child_err.reset();
  if (pty) {
    auto master_read = pty->master().dup();
    auto master_write = pty->master().dup();
    if (master_read && master_write) {
      our_out = std::move(*master_read);
      our_in = std::move(*master_write);
    }
    pty_ = std::move(pty);
    pty_->close_slave();
  }

  if (our_out.valid()) {
    readers_.push_back(Reader{});
    readers_.back().stream = plan_.pty ? core::Stream::pty : core::Stream::stdout_stream;
    set_nonblocking(readers_.back().sd.emplace(io_, our_out.release()));
  }
  if (our_err.valid()) {
    readers_.push_back(Reader{});
    readers_.back().stream = core::Stream::stderr_stream;
    set_nonblocking(readers_.back().sd.emplace(io_, our_err.release()));
  }
  if (our_in.valid()) {
    set_nonblocking(writer_.sd.emplace(io_, our_in.release()));
  } else {
    writer_.closed = true;
  }

  boost::json::object started;
  started["pid"] = root_pid_;
  started["boundary"] = core::boundary_wire(boundary_);
  started["containment"] = kernel_enforced_ ? "kernel_enforced" : "escapable";
  started["io"] = plan_.pty ? "pty" : "pipes";
  if (cgroup_) started["cgroup"] = cgroup_->path();
  emit("started", std::move(started));

  start_io();
  if (commit_error) on_commit_failed(*commit_error);
  // A cancel accepted while the launch awaited its verdict (launch_async) acts now that the
  // target runs.
  if (cancel_.first() && stage_ == Stage::none && life_.phase == core::Phase::running) {
    begin_stop();
  }

  return start_result(root_pid_);
}

void Supervisor::fail_spawn(core::SpawnFailure failure) {
  spawn_failure_ = failure;
  advance(core::event::SpawnFailed{failure});
  (void)cancel_.observe_exit();
  if (cgroup_) {
    (void)cgroup_->remove();
  }
  // Nothing ran: the staged child (if any) was killed and reaped by sys before it could exec.
  cleanup_ = core::Cleanup::confirmed;
  tree_done_ = true;
  core::ClassifyInput in;
  in.spawn_failed = true;
  in.cleanup = cleanup_;
  auto rec = core::make_terminal_record(in, failure);
  core::TerminalRecord record;
  if (rec) {
    record = std::move(*rec);
  } else {
    record.classification = core::Classification::spawn_failed;
    record.spawn_error = failure;
  }
  record.output = accounting();
  record.resources = resource_report();
  record.tree = core::TreeReport{
      boundary_, cleanup_,
      kernel_enforced_ ? core::Containment::kernel_enforced : core::Containment::escapable};
  record.escalation = core::EscalationReport{false, false};
  // Synchronous: the launch reports this outcome to its caller when it returns.
  finish_terminal(std::move(record), TerminalWrite::now);
}

void Supervisor::start_io() {
  for (std::size_t i = 0; i < readers_.size(); ++i) arm_reader(i);
  if (root_) {
    auto dup = root_->fd().dup();
    if (dup) {
      exit_sd_.emplace(io_, dup->release());
      arm_exit_observer();
    } else {
      // Without readiness the exit is still found by the kill-stage polling; record why.
      sink_error_ = "exit observer: " + dup.error().message();
    }
  }
  arm_deadline();
  arm_sampler();
}

// ------------------------------------------------------------------------------ output

void Supervisor::arm_reader(std::size_t i) {
  Reader& r = readers_[i];
  if (r.eof || !r.sd || r.waiting || detached_) return;
  r.waiting = true;
  ++pending_;
  r.sd->async_wait(asio::posix::descriptor_base::wait_read,
                   [self = shared_from_this(), i](boost::system::error_code ec) {
                     --self->pending_;
                     self->readers_[i].waiting = false;
                     if (!ec && !self->detached_) self->on_readable(i);
                     self->maybe_close();
                   });
}

void Supervisor::on_readable(std::size_t i) {
  Reader& r = readers_[i];
  if (r.eof || !r.sd) return;
  auto& buf = manager_->scratch_;
  std::size_t const chunk = static_cast<std::size_t>(plan_.chunk_bytes);
  // One shared buffer for every execution (single loop thread): an idle execution owns none.
  if (buf.size() < chunk) buf.resize(chunk);
  int const fd = r.sd->native_handle();
  for (int k = 0; k < kReadsPerWake; ++k) {
    ssize_t const n = ::read(fd, buf.data(), chunk);
    if (n >= kBusyReadBytes && !r.pipe_grown) {
      // A stream that delivers half a default pipe per read is busy: a larger pipe lets the writer
      // run ahead while we spool, and each wake-up then drains up to kReadsPerWake chunks instead
      // of one pipe's worth. Done only once data flows, so an idle execution keeps the default
      // pipe. A PTY (not a pipe) or a refusal (pipe-max-size, the user's pipe quota) keeps its
      // size.
      r.pipe_grown = true;
      if (r.stream != core::Stream::pty) (void)::fcntl(fd, F_SETPIPE_SZ, kBusyPipeBytes);
    }
    if (n > 0) {
      handle_chunk(r, buf.data(), static_cast<std::size_t>(n));
      if (r.eof) return;
      continue;
    }
    if (n == 0) {
      reader_eof(r);
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN) break;
    // EIO on a PTY master: every slave end is closed, which is the terminal's EOF. Anything else
    // is a read failure: what was not read is lost, so the stream cannot be complete.
    if (!(errno == EIO && r.stream == core::Stream::pty)) {
      if (auto a = core::account_mark_incomplete(r.acc)) r.acc = *a;
    }
    reader_eof(r);
    return;
  }
  arm_reader(i);
}

void Supervisor::handle_chunk(Reader& r, std::uint8_t const* data, std::size_t n) {
  // Budget 1: limits.output_bytes over all streams. Bytes beyond it are neither spooled nor
  // sent in events. Budget 2: output.spool_bytes per stream file.
  std::uint64_t const room_total =
      plan_.output_bytes ? sat_sub(*plan_.output_bytes, total_observed_allowed_) : n;
  std::uint64_t const allowed = std::min<std::uint64_t>(n, room_total);
  total_observed_allowed_ = sat_add(total_observed_allowed_, allowed);
  std::uint64_t const spool_room = sat_sub(plan_.spool_bytes, r.spool_size);
  std::uint64_t keep = std::min(allowed, spool_room);

  // Write what is kept to the spool first; the accounting then says exactly what is there.
  if (keep > 0) {
    if (!r.spool.valid()) {
      std::error_code ec;
      std::filesystem::create_directories(spool_path(r.stream).parent_path(), ec);
      int const fd = ::open(spool_path(r.stream).c_str(),
                            O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0600);
      if (fd >= 0) r.spool.reset(fd);
    }
    std::uint64_t written = 0;
    while (r.spool.valid() && written < keep) {
      ssize_t const w = ::write(r.spool.get(), data + written, keep - written);
      if (w > 0) {
        written += static_cast<std::uint64_t>(w);
      } else if (w < 0 && errno == EINTR) {
        continue;
      } else {
        break;
      }
    }
    keep = written;  // a failed spool write means those bytes were not retained
  }
  // Stream offset of this chunk. The spool and the event data both keep a prefix of the
  // stream, so for kept bytes this is also their offset in the spool (exec.output).
  std::uint64_t const offset = r.acc.observed;
  auto acc = core::account_chunk(r.acc, n, sat_add(r.acc.retained, keep));
  if (acc) {
    r.acc = *acc;
  } else if (auto inc = core::account_mark_incomplete(r.acc)) {
    r.acc = *inc;
  }
  r.spool_size += keep;

  if (allowed > 0) {
    if (output_events_ < plan_.max_events) {
      ++output_events_;
      boost::json::object f;
      f["stream"] = core::stream_wire(r.stream);
      f["offset"] = offset;
      emit("output", std::move(f), std::vector<std::uint8_t>(data, data + allowed));
    } else if (!max_events_reported_) {
      max_events_reported_ = true;
      boost::json::object f;
      f["limit"] = "max_events";
      f["stream"] = core::stream_wire(r.stream);
      f["action"] = "suppress_events";
      emit("limit", std::move(f));
    }
  }

  bool const output_limit = allowed < n;
  bool const spool_limit = keep < allowed && plan_.spool_bytes > 0;
  if ((output_limit || spool_limit) && !r.limit_reported) {
    r.limit_reported = true;
    boost::json::object f;
    f["limit"] = output_limit ? "output_bytes" : "spool_bytes";
    f["stream"] = core::stream_wire(r.stream);
    f["action"] = plan_.cancel_on_limit ? "cancel" : "truncate";
    emit("limit", std::move(f));
    if (plan_.cancel_on_limit) {
      (void)offer(core::Trigger::output_limit,
                  output_limit ? "limits.output_bytes reached" : "output.spool_bytes reached");
    }
  }
}

void Supervisor::reader_eof(Reader& r) {
  r.eof = true;
  r.sd.reset();
  r.spool.reset();
  if (exit_ && stage_ == Stage::none && all_readers_eof()) {
    drain_timer_.cancel();
    kill_stage();
  }
}

bool Supervisor::all_readers_eof() const noexcept {
  return std::all_of(readers_.begin(), readers_.end(), [](Reader const& r) { return r.eof; });
}

Supervisor::Reader* Supervisor::reader_for(core::Stream s) noexcept {
  for (auto& r : readers_) {
    if (r.stream == s) return &r;
  }
  return nullptr;
}

Supervisor::Reader const* Supervisor::reader_for(core::Stream s) const noexcept {
  for (auto const& r : readers_) {
    if (r.stream == s) return &r;
  }
  return nullptr;
}

std::filesystem::path Supervisor::spool_path(core::Stream s) const {
  return manager_ != nullptr
             ? manager_->config_.state_dir / "spool" / id_ / std::string{core::stream_wire(s)}
             : std::filesystem::path{};
}

void Supervisor::force_close_readers() {
  for (auto& r : readers_) {
    if (r.eof) continue;
    // Something outside the known tree still holds the write end: what it may still write is
    // unknown, so the stream is incomplete and the cleanup cannot be confirmed.
    if (auto a = core::account_mark_incomplete(r.acc)) r.acc = *a;
    r.eof = true;
    r.sd.reset();
    r.spool.reset();
    readers_forced_ = true;
    cleanup_ = core::Cleanup::unconfirmed;
    cleanup_detail_ += std::string(cleanup_detail_.empty() ? "" : "; ") +
                       "a process outside the tree still held " +
                       std::string{core::stream_wire(r.stream)} + " after reader_close_bound";
  }
}

// ------------------------------------------------------------------------------ stdin

Result<std::uint64_t> Supervisor::input(std::span<std::uint8_t const> data, bool eof) {
  if (terminal_ || stage_ == Stage::done) return Error(Errc::exec_not_running, id_);
  if (writer_.closed || writer_.eof_requested) return Error(Errc::exec_input_closed, id_);
  if (plan_.stdin_bytes && sat_add(writer_.accepted, data.size()) > *plan_.stdin_bytes) {
    return Error(Errc::exec_input_limit,
                 "limits.stdin_bytes=" + std::to_string(*plan_.stdin_bytes) +
                     ", already accepted " + std::to_string(writer_.accepted));
  }
  std::size_t const bound = manager_->config_.stdin_queue_bytes;
  std::size_t const room = bound > writer_.queued ? bound - writer_.queued : 0;
  std::size_t const take = std::min(room, data.size());
  if (take > 0) {
    writer_.queue.emplace_back(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(take));
    writer_.queued += take;
    writer_.accepted += take;
  }
  // EOF applies only once everything offered with it was taken; otherwise the caller resends.
  if (eof && take == data.size()) writer_.eof_requested = true;
  kick_writer();
  maybe_close();
  return static_cast<std::uint64_t>(take);
}

void Supervisor::kick_writer() {
  if (writer_.closed || !writer_.sd || writer_.waiting || detached_) return;
  int const fd = writer_.sd->native_handle();
  while (!writer_.queue.empty()) {
    auto& front = writer_.queue.front();
    ssize_t const n =
        ::write(fd, front.data() + writer_.front_offset, front.size() - writer_.front_offset);
    if (n > 0) {
      writer_.front_offset += static_cast<std::size_t>(n);
      writer_.queued -= static_cast<std::size_t>(n);
      if (writer_.front_offset == front.size()) {
        writer_.queue.pop_front();
        writer_.front_offset = 0;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      // Non-blocking: a terminal or pipe nobody reads only leaves this wait pending, and
      // teardown cancels it (close_writer), so it can never hold cleanup.
      writer_.waiting = true;
      ++pending_;
      writer_.sd->async_wait(asio::posix::descriptor_base::wait_write,
                             [self = shared_from_this()](boost::system::error_code ec) {
                               --self->pending_;
                               self->writer_.waiting = false;
                               if (!ec && !self->detached_) self->kick_writer();
                               self->maybe_close();
                             });
      return;
    }
    close_writer("peer_closed");  // EPIPE (SIGPIPE is ignored by the manager), EIO
    return;
  }
  if (writer_.eof_requested) {
    if (plan_.pty) {
      // A terminal has no write-end close: EOF is the VEOF character (^D), which the line
      // discipline turns into a zero-length read in canonical mode.
      std::uint8_t const veof = 0x04;
      (void)::write(fd, &veof, 1);
    }
    close_writer("eof");
  }
}

void Supervisor::close_writer(std::string_view reason) {
  if (writer_.closed) return;
  writer_.closed = true;
  writer_.queue.clear();
  writer_.queued = 0;
  writer_.front_offset = 0;
  writer_.sd.reset();  // cancels a pending write wait
  if (!detached_) {
    boost::json::object f;
    f["reason"] = reason;
    f["accepted_bytes"] = writer_.accepted;
    emit("input_closed", std::move(f));
  }
}

Result<> Supervisor::resize(std::uint16_t rows, std::uint16_t cols) {
  if (!plan_.pty) return Error(Errc::exec_not_pty, id_);
  if (!plan_.resize) return Error(Errc::exec_resize_refused, "the plan has io.resize=false");
  if (terminal_ || !pty_ || stage_ == Stage::done) return Error(Errc::exec_not_running, id_);
  return pty_->resize(rows, cols);
}

// ------------------------------------------------------------------------------ exit

void Supervisor::arm_exit_observer() {
  if (!exit_sd_ || detached_) return;
  ++pending_;
  exit_sd_->async_wait(asio::posix::descriptor_base::wait_read,
                       [self = shared_from_this()](boost::system::error_code ec) {
                         --self->pending_;
                         if (!ec && !self->detached_) self->on_root_exit();
                         self->maybe_close();
                       });
}

void Supervisor::on_root_exit() {
  if (exit_ || !root_) return;
  auto st = root_->try_wait();
  std::optional<sys::ExitStatus> status;
  if (st && *st) {
    status = **st;
  } else if (st) {
    // Ready but not waitable: the root exited while another process ptraces it, and the kernel
    // reports it to the tracer first. Look again shortly instead of spinning on readiness.
    ++pending_;
    exit_retry_timer_.expires_after(kExitRetry);
    exit_retry_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      --self->pending_;
      if (!ec && !self->detached_) self->on_root_exit();
      self->maybe_close();
    });
    return;
  } else if (auto info = root_->get_exit_info(); info && *info) {
    // Someone else reaped it (should not happen: orphan reaping skips our roots); the kernel
    // still tells us how it ended.
    status = **info;
  }
  exit_sd_.reset();
  root_reaped_ = true;
  exited_at_ = Clock::now();
  core::ExitStatus ex;
  if (status) {
    if (status->code) ex.code = *status->code;
    if (status->signal) ex.signal = *status->signal;
  } else {
    // The process ended (its pidfd is ready) but neither waitid nor PIDFD_GET_INFO could say
    // how. The reducer needs a status, so the record carries SIGKILL as a stand-in, and the
    // backend_failure trigger (offered first, so it wins) makes the classification
    // supervisor_failed: the record never presents this stand-in as an observed exit.
    (void)offer(core::Trigger::backend_failure, "root exit status could not be read");
    ex.signal = SIGKILL;
  }
  exit_ = ex;
  (void)cancel_.observe_exit();
  advance(core::event::Exited{ex});
  boost::json::object f;
  f["exit"] = exit_json(ex);
  emit("exited", std::move(f));

  if (stage_ == Stage::killing) {
    on_poll();  // the tree may already be empty: the root was the last one the wait waited for
  } else if (stage_ == Stage::none) {
    if (all_readers_eof()) {
      kill_stage();
    } else {
      // Descendants may still hold the output pipes: let them drain for a bounded time, then the
      // whole tree is killed (the execution is over once its root is).
      ++pending_;
      drain_timer_.expires_after(manager_->config_.exit_drain);
      drain_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
        --self->pending_;
        if (!ec && !self->detached_ && self->stage_ == Stage::none) self->kill_stage();
        self->maybe_close();
      });
    }
  }
}

bool Supervisor::is_root_pid(std::int32_t pid) const noexcept {
  // While a launch awaits its verdict the child is the StagedChild's to reap.
  return pid == root_pid_ && !root_reaped_ && (root_.has_value() || launching_ != nullptr);
}

bool Supervisor::root_gone() const noexcept {
  return exit_.has_value() || !root_ || !root_->alive();
}

// ------------------------------------------------------------------------------ timers

void Supervisor::arm_deadline() {
  if (!plan_.wall_ms || detached_) return;
  ++pending_;
  deadline_.expires_after(milliseconds(*plan_.wall_ms));
  deadline_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    --self->pending_;
    if (!ec && !self->detached_) {
      (void)self->offer(core::Trigger::deadline,
                        "limits.wall_ms=" + std::to_string(*self->plan_.wall_ms) + " reached");
    }
    self->maybe_close();
  });
}

void Supervisor::arm_sampler() {
  if (detached_ || support_cancelled_ || tree_done_ || stage_ == Stage::done) return;
  ++pending_;
  sampler_timer_.expires_after(manager_->config_.sample_interval);
  sampler_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    --self->pending_;
    if (!ec && !self->detached_ && !self->support_cancelled_ && !self->tree_done_) {
      self->sample();
      self->arm_sampler();
    }
    self->maybe_close();
  });
}

void Supervisor::sample() {
  std::vector<pid_t> pids;
  if (!exit_ && root_pid_ > 0) pids.push_back(root_pid_);
  if (cgroup_ || !pids.empty()) {
    if (auto u = sys::sample_tree(cgroup_ ? &*cgroup_ : nullptr, pids)) {
      auto peak = [](std::optional<std::uint64_t>& slot, sys::Measured const& m) {
        if (m.fidelity == sys::Fidelity::unavailable) return;
        slot = slot ? std::max(*slot, m.value) : m.value;
      };
      peak(cpu_ms_, u->cpu_ms);
      peak(rss_peak_, u->rss_bytes);
      peak(procs_peak_, u->processes);
      peak(fds_peak_, u->open_fds);
    }
  }
  auto const now = Clock::now();
  auto const& cfg = manager_->config_;
  if (plan_.disk_bytes && workspace_fd_.valid() && !disk_walk_running_ &&
      now - last_disk_sample_ >= cfg.disk_sample_interval) {
    last_disk_sample_ = now;
    start_disk_walk();
  }

  if (life_.phase != core::Phase::running) return;
  auto over = [](std::optional<std::uint64_t> const& v, std::optional<std::uint64_t> const& lim) {
    return v && lim && *v > *lim;
  };
  std::string why;
  if (over(cpu_ms_, plan_.cpu_ms))
    why = "cpu_ms " + std::to_string(*cpu_ms_);
  else if (over(rss_peak_, plan_.memory_bytes))
    why = "memory_bytes " + std::to_string(*rss_peak_);
  else if (over(procs_peak_, plan_.processes))
    why = "processes " + std::to_string(*procs_peak_);
  else if (over(disk_growth_peak_, plan_.disk_bytes))
    why = "disk_bytes " + std::to_string(*disk_growth_peak_);
  if (!why.empty()) {
    boost::json::object f;
    f["limit"] = why.substr(0, why.find(' '));
    f["action"] = "cancel";
    emit("limit", std::move(f));
    (void)offer(core::Trigger::resource_limit, why + " over the plan's limit");
  }
}

void Supervisor::start_disk_walk() {
  // The walk may visit up to disk_walk_max_entries entries: far too slow for the loop. The
  // worker gets its own dup of the workspace fd, so closing ours at close cannot race it.
  auto fd = workspace_fd_.dup();
  if (!fd) return;
  disk_walk_running_ = true;
  ++pending_;
  auto root = std::make_shared<sys::UniqueFd>(std::move(*fd));
  std::uint64_t const max_entries = manager_->config_.disk_walk_max_entries;
  asio::post(manager_->workers_, [self = shared_from_this(), root, max_entries]() {
    auto d = std::make_shared<Result<sys::DiskUsage>>(sys::walk_disk_usage(*root, max_entries));
    asio::post(self->io_, [self, d]() {
      --self->pending_;
      self->disk_walk_running_ = false;
      if (!self->detached_ && *d) {
        auto const& u = d->value();
        if (!self->disk_baseline_) {
          self->disk_baseline_ = u.bytes;
        } else {
          std::uint64_t const growth = sat_sub(u.bytes, *self->disk_baseline_);
          self->disk_growth_peak_ =
              self->disk_growth_peak_ ? std::max(*self->disk_growth_peak_, growth) : growth;
          // The sampler checks limits right after sampling; a walk finishes later, so it checks
          // the disk limit itself.
          if (self->life_.phase == core::Phase::running && self->plan_.disk_bytes &&
              growth > *self->plan_.disk_bytes) {
            boost::json::object f;
            f["limit"] = "disk_bytes";
            f["action"] = "cancel";
            self->emit("limit", std::move(f));
            (void)self->offer(core::Trigger::resource_limit,
                              "disk_bytes " + std::to_string(growth) + " over the plan's limit");
          }
        }
      }
      self->maybe_close();
    });
  });
}

// ------------------------------------------------------------------------------ stop

Result<CancelResult> Supervisor::cancel(core::Trigger trigger, std::string reason) {
  return offer(trigger, std::move(reason));
}

Result<CancelResult> Supervisor::offer(core::Trigger trigger, std::string reason) {
  if (terminal_) return Error(Errc::exec_not_running, id_ + " is terminal");
  if (closing_) {
    // Closed, its terminal record being written: the exit decided the outcome and nothing is
    // left to stop (the tree is empty, its handles are gone).
    CancelResult res;
    res.accepted = false;
    res.trigger = cancel_.first();
    return res;
  }
  auto outcome = cancel_.offer(trigger);
  if (!outcome) return Error(Errc::exec_not_running, outcome.error().message());
  CancelResult res;
  res.accepted = *outcome == core::TriggerOutcome::accepted;
  res.trigger = cancel_.first();
  if (res.accepted) {
    if (manager_ != nullptr && manager_->config_.sink != nullptr) {
      if (auto r = manager_->config_.sink->record_trigger(id_, trigger); !r) {
        sink_error("record_trigger", r.error());
      }
    }
    boost::json::object f;
    f["trigger"] = core::trigger_wire(trigger);
    f["reason"] = reason;
    emit("cancel_requested", std::move(f));
    if (life_.phase == core::Phase::running) begin_stop();
  } else if (*outcome == core::TriggerOutcome::rejected_after_exit && stage_ == Stage::none) {
    // The exit decided the outcome, but descendants may still be draining: stop them now.
    drain_timer_.cancel();
    kill_stage();
  }
  maybe_close();
  return res;
}

void Supervisor::begin_stop() {
  advance(core::event::StopRequested{});
  stage_ = Stage::graceful;
  std::uint32_t const n = signal_tree(plan_.graceful_signal);
  graceful_sent_ = n > 0;
  boost::json::object f;
  f["signal"] = signal_wire(plan_.graceful_signal);
  f["targets"] = n;
  f["step"] = "graceful";
  emit("signal_sent", std::move(f));
  if (plan_.grace_ms == 0) {
    kill_stage();
    return;
  }
  ++pending_;
  stage_timer_.expires_after(milliseconds(plan_.grace_ms));
  stage_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    --self->pending_;
    if (!ec && !self->detached_ && self->stage_ == Stage::graceful) self->kill_stage();
    self->maybe_close();
  });
  arm_poll(kGracefulPoll);
}

void Supervisor::arm_poll(milliseconds every) {
  if (detached_) return;
  ++pending_;
  poll_timer_.expires_after(every);
  poll_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    --self->pending_;
    if (!ec && !self->detached_) self->on_poll();
    self->maybe_close();
  });
}

void Supervisor::on_poll() {
  if (stage_ == Stage::graceful) {
    // The tree went away on the graceful signal alone: no need to wait out the grace period.
    if (root_gone() && !tree_populated()) {
      kill_stage();
      return;
    }
    arm_poll(kGracefulPoll);
  } else if (stage_ == Stage::killing) {
    if ((root_gone() && !tree_populated()) || Clock::now() >= kill_deadline_) {
      final_stage();
      return;
    }
    arm_poll(events_wd_ >= 0 ? kKillPollWatched : kKillPoll);
  }
}

bool Supervisor::tree_populated() const {
  if (!cgroup_) return false;  // marker boundary: only the final sweep can tell
  auto p = cgroup_->populated();
  return !p || *p;  // unreadable counts as populated: never claim empty without seeing it
}

std::uint32_t Supervisor::signal_tree(int sig) {
  std::uint32_t n = 0;
  if (root_ && !exit_) {
    if (auto d = root_->send_signal(sig); d && *d) ++n;
  }
  if (cgroup_) {
    auto procs = cgroup_->procs();
    if (procs) {
      std::string const own = cgroup_rel_;
      for (auto pid : procs.value()) {
        if (pid == root_pid_) continue;
        auto fd = sys::Pidfd::open(pid);
        if (!fd) continue;  // exited meanwhile
        // Re-check membership after the pidfd pins the process: the pid read from cgroup.procs
        // could have been recycled by a process outside the tree in between.
        if (own.empty() || cgroup_of(pid) != own) continue;
        if (auto d = fd.value().send_signal(sig); d && *d) ++n;
      }
    }
  } else if (marker_) {
    // A graceful signal does not end processes: one pass, no re-signalling.
    if (auto r = sys::marker_sweep(*marker_, sweep_options(sig, 1))) n += r->signalled;
  }
  return n;
}

sys::MarkerSweepOptions Supervisor::sweep_options(int sig, std::uint32_t rounds) const {
  sys::MarkerSweepOptions o;
  o.signal = sig;
  o.max_rounds = rounds;
  // Nothing that started before the root can descend from it: skipped before being read.
  if (root_start_ticks_ > 0) o.not_before_ticks = root_start_ticks_;
  return o;
}

void Supervisor::kill_stage() {
  if (stage_ == Stage::killing || stage_ == Stage::done || detached_) return;
  stage_ = Stage::killing;
  stage_timer_.cancel();
  bool something = false;
  if (root_ && !exit_) {
    if (auto d = root_->send_signal(SIGKILL); d && *d) something = true;
  }
  bool const populated = cgroup_ && tree_populated();
  if (populated) {
    something = true;
    (void)cgroup_->kill();
  }
  std::uint32_t swept = 0;
  if (boundary_ == Boundary::marker && marker_) {
    auto o = sweep_options(SIGKILL, manager_->config_.marker_sweep_rounds);
    if (auto r = sys::marker_sweep(*marker_, o)) swept = r->signalled;
  }
  if (something || swept > 0) {
    forced_ = true;
    boost::json::object f;
    f["signal"] = "SIGKILL";
    f["step"] = "kill";
    f["targets"] = swept + (something ? 1U : 0U);
    emit("signal_sent", std::move(f));
  }
  kill_deadline_ = Clock::now() + milliseconds(plan_.kill_after_ms);
  // The usual end of an execution: the root exited and left nothing in its cgroup. Nothing to
  // wait for, so no cgroup.events watch to add and remove again (a marker-boundary execution
  // has no cgroup: only the final sweep can tell, exactly as on_poll would decide).
  if (!populated && root_gone()) {
    final_stage();
    return;
  }
  // Watch before the next populated check (on_poll), so an emptying in between still notifies.
  watch_cgroup_events();
  on_poll();
}

void Supervisor::watch_cgroup_events() {
  if (!cgroup_ || events_wd_ >= 0 || detached_ || manager_ == nullptr) return;
  // -1 when inotify is unavailable: polling alone still finds the empty tree.
  events_wd_ = manager_->watch_cgroup_events(cgroup_->path() + "/cgroup.events", weak_from_this());
}

void Supervisor::unwatch_cgroup_events() {
  if (events_wd_ < 0) return;
  if (manager_ != nullptr) manager_->unwatch_cgroup_events(events_wd_);
  events_wd_ = -1;
}

void Supervisor::on_cgroup_events() {
  if (detached_ || events_wd_ < 0) return;
  if (stage_ == Stage::killing) on_poll();
  maybe_close();
}

void Supervisor::collect_orphan_candidates(std::vector<sys::Pidfd>& out, bool& looked) const {
  // Children of this process (the subreaper) that no live supervisor owns as its root: with the
  // marker boundary they may be descendants of this execution that scrubbed their marker. They
  // cannot be attributed, so they are not signalled — but the cleanup cannot be confirmed.
  // Read on the loop (it consults the manager's indexes); the wait for them to finish dying
  // runs on the worker.
  looked = false;
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/self/task", ec);
  if (ec) return;  // cannot look: cannot confirm
  looked = true;
  for (auto const& t : it) {
    auto dir = sys::open_dir_path(t.path().string());
    if (!dir) continue;
    auto children = sys::read_file_at(*dir, "children");
    if (!children) continue;
    std::string_view rest = *children;
    while (!rest.empty()) {
      auto sp = rest.find(' ');
      auto tok = rest.substr(0, sp);
      rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
      std::int32_t pid = 0;
      if (std::from_chars(tok.data(), tok.data() + tok.size(), pid).ec != std::errc{} || pid <= 0) {
        continue;
      }
      if (manager_ != nullptr && manager_->is_direct_child(pid)) continue;
      // Inside another execution's cgroup: that execution's, not an escapee of this one.
      if (manager_ != nullptr && manager_->owner_by_cgroup(pid)) continue;
      // A zombie or an exiting process reads as not alive through its pidfd.
      if (auto fd = sys::Pidfd::open(pid); fd && fd->alive()) out.push_back(std::move(*fd));
    }
  }
}

// What the worker found for the final stage.
struct Supervisor::FinalScan {
  std::optional<Result<sys::MarkerSweepResult>> sweep;  // nullopt: no marker, nothing swept
  bool orphans_alive = false;
};

void Supervisor::final_stage() {
  if (stage_ == Stage::done) return;
  stage_ = Stage::done;
  poll_timer_.cancel();
  sampler_timer_.cancel();
  unwatch_cgroup_events();  // the tree-empty wait is over
  // Every teardown ends with a marker sweep, whatever the boundary: it catches a process that
  // left the cgroup (root without nsdelegate) but kept its environment. It reads every process
  // that started after the root (older ones are skipped by start time before any environ read,
  // their start times cached across sweeps), which takes a fraction of a millisecond per /proc
  // pass: it runs on the worker thread, through the manager's MarkerSweeper, so teardowns that
  // end at the same time share their passes.
  std::optional<sys::Marker> marker = marker_;
  auto const opts = sweep_options(SIGKILL, manager_->config_.marker_sweep_rounds);
  auto orphans = std::make_shared<std::vector<sys::Pidfd>>();
  bool looked = true;
  bool const check_orphans = boundary_ == Boundary::marker;
  if (check_orphans) collect_orphan_candidates(*orphans, looked);
  ++pending_;
  // Runs on the worker with the sweep's result (none without a marker).
  auto finish = [self = shared_from_this(), orphans, looked,
                 check_orphans](std::optional<Result<sys::MarkerSweepResult>> sweep) {
    auto scan = std::make_shared<FinalScan>();
    scan->sweep = std::move(sweep);
    if (check_orphans) {
      // Processes still in the middle of dying from the kill get a short bounded moment.
      auto const until = Clock::now() + kOrphanSettle;
      while (!orphans->empty()) {
        std::erase_if(*orphans, [](sys::Pidfd const& p) { return !p.alive(); });
        if (orphans->empty() || Clock::now() >= until) break;
        ::usleep(2000);  // the worker's own time: the loop is not blocked
      }
      scan->orphans_alive = !looked || !orphans->empty();
    }
    asio::post(self->io_, [self, scan]() {
      --self->pending_;
      if (!self->detached_) self->finish_final_stage(*scan);
      self->maybe_close();
    });
  };
  if (!marker) {
    asio::post(manager_->workers_, [finish]() mutable { finish(std::nullopt); });
    return;
  }
  sys::MarkerSweeper::Request req{
      sys::MarkerSweepTarget{*marker, opts.not_before_ticks},
      [finish](Result<sys::MarkerSweepResult> r) mutable { finish(std::move(r)); }};
  // A run already scheduled (or running) serves this request too; otherwise schedule one.
  if (!manager_->sweeper_.enqueue(std::move(req))) return;
  // When this is the only live execution there is nothing else on the loop for the sweep to hold
  // up, and the two hand-offs to and from the worker (a cross-CPU wake-up each, ~30 us on this
  // VM) would be most of its cost over a ~0.15 ms pass: run it here. Only for a cgroup boundary:
  // the marker boundary's completion may wait up to kOrphanSettle for orphans to die, which
  // belongs on the worker. No run was scheduled (enqueue returned true), so the worker is not
  // inside the sweeper meanwhile; requests queued by this run's completions are served by it.
  if (!check_orphans && manager_->roots_.size() <= 1) {
    manager_->sweeper_.run_pending();
    return;
  }
  asio::post(manager_->workers_, [mgr = manager_]() { mgr->sweeper_.run_pending(); });
}

void Supervisor::finish_final_stage(FinalScan const& scan) {
  std::vector<std::string> why;  // every reason the cleanup cannot be confirmed
  auto const sweeper = manager_->sweeper_.stats();
  manager_->stats_.final_sweep_requests = sweeper.requests;
  manager_->stats_.final_sweeps = sweeper.sweeps;
  if (scan.sweep) {
    auto const& sw = *scan.sweep;
    if (!sw) {
      why.push_back("marker sweep failed: " + sw.error().message());
    } else {
      auto const& swr = sw.value();  // not operator->: see manager.cpp (GCC 12 -O2 warning)
      if (!swr.confirmed) {
        std::string pids;
        for (auto pid : swr.unreadable_pids) pids += " " + std::to_string(pid);
        why.push_back("marker sweep unconfirmed: " + std::to_string(swr.remaining) +
                      " marked left, " + std::to_string(swr.unreadable) + " unreadable" +
                      (pids.empty() ? "" : " (" + pids.substr(1) + ")"));
      }
      if (swr.signalled > 0) {
        forced_ = true;
        boost::json::object f;
        f["signal"] = "SIGKILL";
        f["step"] = "final_sweep";
        f["targets"] = swr.signalled;
        emit("signal_sent", std::move(f));
      }
    }
  }
  if (cgroup_) {
    // Only cpu.stat: the full stats() would read six more files here for nothing.
    if (auto usec = cgroup_cpu_usec(*cgroup_)) {
      std::uint64_t const ms = *usec / 1000;
      cpu_ms_ = cpu_ms_ ? std::max(*cpu_ms_, ms) : ms;
      cpu_from_cgroup_ = true;
    }
    if (tree_populated()) why.push_back("cgroup still populated after kill_after_ms");
  }
  if (!root_gone()) why.push_back("root process still alive after kill_after_ms");
  if (scan.orphans_alive) {
    why.push_back(
        "unattributed live orphans reparented to the daemon (a process may have dropped its "
        "marker)");
  }
  cleanup_ = why.empty() ? core::Cleanup::confirmed : core::Cleanup::unconfirmed;
  for (auto const& w : why) cleanup_detail_ += (cleanup_detail_.empty() ? "" : "; ") + w;
  tree_done_ = true;
  sampler_timer_.cancel();
  if (!all_readers_eof()) {
    ++pending_;
    reader_timer_.expires_after(manager_->config_.reader_close_bound);
    reader_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      --self->pending_;
      if (!ec && !self->detached_) self->force_close_readers();
      self->maybe_close();
    });
  }
}

// ------------------------------------------------------------------------------ close

void Supervisor::maybe_close() {
  if (terminal_ || closing_ || detached_) return;
  if (!exit_ || !tree_done_ || !all_readers_eof()) return;
  if (!support_cancelled_) {
    support_cancelled_ = true;
    deadline_.cancel();
    stage_timer_.cancel();
    poll_timer_.cancel();
    drain_timer_.cancel();
    sampler_timer_.cancel();
    reader_timer_.cancel();
    exit_retry_timer_.cancel();
    unwatch_cgroup_events();
    close_writer("closed");
  }
  if (pending_ > 0) return;  // the cancelled tasks have not completed yet
  closing_ = true;
  close_and_record();
}

void Supervisor::close_and_record() {
  advance(core::event::Closed{});
  boost::json::object f;
  f["cleanup"] = core::cleanup_wire(cleanup_);
  if (!cleanup_detail_.empty()) f["cleanup_detail"] = cleanup_detail_;
  emit("closed", std::move(f));

  core::ClassifyInput in;
  in.exit = *exit_;
  in.trigger = cancel_.first();
  in.cleanup = cleanup_;
  auto rec = core::make_terminal_record(in, std::nullopt);
  core::TerminalRecord record;
  if (rec) {
    record = std::move(*rec);
  } else {
    record.classification = core::Classification::supervisor_failed;
    record.exit = *exit_;
    record.trigger = cancel_.first();
    sink_error_ = "classification failed: " + rec.error().message();
  }
  record.output = accounting();
  record.resources = resource_report();
  record.tree = core::TreeReport{
      boundary_, cleanup_,
      kernel_enforced_ ? core::Containment::kernel_enforced : core::Containment::escapable};
  record.escalation = core::EscalationReport{graceful_sent_, forced_};
  if (cgroup_) {
    // The directory is empty when cleanup is confirmed; a failed rmdir leaves it for the next
    // start's recovery, which kills what is left in it (RecoveryReport::leftover_cgroups).
    (void)cgroup_->remove();
  }
  // A closed execution stays in the terminal history (views, output, waits) but acts on nothing
  // any more: its descriptors go now, or every history entry would pin two (4,096 entries: 8,192
  // descriptors against the daemon's RLIMIT_NOFILE).
  cgroup_.reset();
  root_.reset();
  pty_.reset();
  workspace_fd_.reset();
  finish_terminal(std::move(record), TerminalWrite::async);
}

void Supervisor::finish_terminal(core::TerminalRecord record, TerminalWrite write) {
  auto const& cfg = manager_->config_;
  if (cfg.sink != nullptr) {
    for (auto const& [stream, acc] : record.output) {
      if (auto r = cfg.sink->record_output(id_, stream, acc); !r)
        sink_error("record_output", r.error());
    }
    if (write == TerminalWrite::async) {
      // The loop goes on while the record is written; nobody learns the result (waits, the
      // terminal event, the manager) before the sink answers, and then it is in the WAL.
      auto rec = std::make_shared<core::TerminalRecord>(std::move(record));
      cfg.sink->record_terminal_async(id_, *rec, [self = shared_from_this(), rec](Result<> r) {
        // Detached meanwhile (the manager is gone): the record is written, nobody to tell.
        if (self->manager_ == nullptr) return;
        if (!r) self->sink_error("record_terminal", r.error());
        // The committed slot was written before this record (one FIFO queue), but its
        // completion may still be on its way: the caller of the launch hears of the start
        // before anyone hears of the end.
        if (auto p = self->pending_start_; p && p->done) {
          p->then = [self, rec] { self->publish_terminal(std::move(*rec)); };
          return;
        }
        self->publish_terminal(std::move(*rec));
      });
      return;
    }
    if (auto r = cfg.sink->record_terminal(id_, record); !r)
      sink_error("record_terminal", r.error());
  }
  publish_terminal(std::move(record));
}

void Supervisor::publish_terminal(core::TerminalRecord record) {
  advance(core::event::TerminalRecorded{record.classification, core::RecoveryPath::observed});
  (void)cancel_.seal();
  terminal_ = std::move(record);
  boost::json::object f;
  if (auto j = core::to_json(*terminal_)) {
    f["terminal"] = std::move(*j);
  } else {
    f["terminal"] = nullptr;
    f["error"] = j.error().message();
  }
  emit("terminal", std::move(f));
  events_.clear_subscribers();  // nothing follows the terminal event

  // Pending exec.wait calls are the manager's (answered from on_terminal, below).
  if (manager_ != nullptr) manager_->on_terminal(id_);
}

void Supervisor::advance(core::LifecycleEvent const& ev) {
  auto next = core::reduce(life_, ev);
  if (!next) {
    sink_error_ = "lifecycle: " + next.error().message();
    return;
  }
  bool const moved = next->phase != life_.phase;
  life_ = *next;
  auto const& cfg = manager_->config_;
  // Only phase changes are recorded (a spawn failure stays in `starting` until terminal), and
  // terminal is recorded by record_terminal itself.
  if (cfg.sink != nullptr && moved && life_.phase != core::Phase::terminal) {
    if (auto r = cfg.sink->record_phase(id_, life_.phase); !r)
      sink_error("record_phase", r.error());
  }
}

void Supervisor::emit(std::string kind, boost::json::object fields,
                      std::vector<std::uint8_t> data) {
  auto dropped = events_.append(std::move(kind), std::move(fields), std::move(data));
  if (manager_ != nullptr) manager_->stats_.dropped_subscribers += dropped.size();
}

void Supervisor::sink_error(std::string what, Error const& e) {
  sink_error_ = what + ": " + e.message();
}

core::OutputAccounting Supervisor::accounting() const {
  core::OutputAccounting out;
  if (plan_.pty) {
    out[core::Stream::pty] = core::StreamAccounting{};
  } else {
    out[core::Stream::stdout_stream] = core::StreamAccounting{};
    out[core::Stream::stderr_stream] = core::StreamAccounting{};
  }
  for (auto const& r : readers_) out[r.stream] = r.acc;
  return out;
}

core::ResourceReport Supervisor::resource_report() const {
  core::ResourceReport rep;
  auto set = [&](core::ResourceDim d, std::optional<std::uint64_t> v,
                 std::optional<std::uint64_t> lim, core::Fidelity fid) {
    auto& o = rep.at(d);
    o.value = v;
    o.limit = lim;
    o.fidelity = v ? fid : core::Fidelity::unavailable;
  };
  std::optional<std::uint64_t> wall;
  if (root_pid_ > 0) {
    auto const end = exited_at_ ? *exited_at_ : Clock::now();
    wall = static_cast<std::uint64_t>(
        std::chrono::duration_cast<milliseconds>(end - started_).count());
  }
  // Wall time is measured exactly and the deadline timer enforces it without a sampling gap.
  set(core::ResourceDim::wall, wall, plan_.wall_ms, core::Fidelity::hard);
  set(core::ResourceDim::cpu, cpu_ms_, plan_.cpu_ms, core::Fidelity::sampled);
  set(core::ResourceDim::memory, rss_peak_, plan_.memory_bytes,
      memory_hard_ ? core::Fidelity::hard : core::Fidelity::sampled);
  set(core::ResourceDim::disk, disk_growth_peak_, plan_.disk_bytes, core::Fidelity::sampled);
  std::uint64_t observed = 0;
  for (auto const& r : readers_) observed = sat_add(observed, r.acc.observed);
  // Every output byte is counted as it is read: exact, and the limit applies byte-exactly.
  set(core::ResourceDim::output,
      root_pid_ > 0 ? std::optional<std::uint64_t>(observed) : std::nullopt, plan_.output_bytes,
      core::Fidelity::hard);
  // limits.open_files is RLIMIT_NOFILE of every process (kernel-enforced per process, hence
  // hard); the value is the sampled peak of descriptors open over the whole tree.
  set(core::ResourceDim::descriptors, fds_peak_, plan_.open_files,
      plan_.open_files ? core::Fidelity::hard : core::Fidelity::sampled);
  set(core::ResourceDim::processes, procs_peak_, plan_.processes,
      pids_hard_ ? core::Fidelity::hard : core::Fidelity::sampled);
  set(core::ResourceDim::concurrency, concurrency_, std::nullopt, core::Fidelity::sampled);
  return rep;
}

// ------------------------------------------------------------------------------ queries

ExecutionView Supervisor::view() const {
  ExecutionView v;
  v.execution_id = id_;
  v.identity = request_.identity;
  v.plan_digest = plan_digest_;
  v.phase = life_.phase;
  v.boundary = boundary_;
  v.kernel_enforced = kernel_enforced_;
  v.pid = root_pid_;
  v.executable = plan_.executable;
  v.started_at = started_wall_;
  v.trigger = cancel_.first();
  v.output = accounting();
  v.events = events_.last_seq();
  v.terminal = terminal_;
  v.sink_error = sink_error_;
  v.orphans_reaped = orphans_reaped_;
  if (!cleanup_detail_.empty()) v.cleanup_detail = cleanup_detail_;
  return v;
}

Result<SubscriptionHandle> Supervisor::subscribe(std::optional<std::uint64_t> from_seq,
                                                 std::function<bool(Event const&)> sink) {
  auto s = events_.subscribe(from_seq, std::move(sink));
  if (s.dropped) {
    if (manager_ != nullptr) ++manager_->stats_.dropped_subscribers;
    return Error(Errc::rpc_overloaded, "subscriber refused events during replay");
  }
  return SubscriptionHandle{id_, s.id, s.replay_from};
}

void Supervisor::unsubscribe(std::uint64_t id) {
  (void)events_.unsubscribe(id);
}

Result<OutputSlice> Supervisor::output(StreamId stream, std::uint64_t offset,
                                       std::uint64_t max_bytes) const {
  Reader const* r = reader_for(stream);
  // A terminal has one stream; a client asking for stdout of a PTY execution gets it.
  if (r == nullptr && plan_.pty && stream == core::Stream::stdout_stream)
    r = reader_for(core::Stream::pty);
  OutputSlice slice;
  if (r == nullptr) {
    if (spawn_failure_) {
      slice.eof = true;  // nothing ever ran: an empty, complete, ended stream
      return slice;
    }
    return Error(
        Errc::plan_invalid_value,
        std::string{"no stream "} + std::string{core::stream_wire(stream)} + " in this execution");
  }
  slice.complete = r->acc.complete;
  std::uint64_t const size = r->spool_size;
  std::uint64_t const want = std::min({max_bytes, kMaxSliceBytes, sat_sub(size, offset)});
  if (want > 0) {
    auto const path = spool_path(r->stream);
    sys::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return Error(Errc::sys_error, "open spool " + path.string(), errno);
    slice.data.resize(want);
    std::uint64_t got = 0;
    while (got < want) {
      ssize_t const n =
          ::pread(fd.get(), slice.data.data() + got, want - got, static_cast<off_t>(offset + got));
      if (n > 0) {
        got += static_cast<std::uint64_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        break;
      }
    }
    slice.data.resize(got);
  }
  slice.eof = r->eof && offset + slice.data.size() >= size;
  return slice;
}

void Supervisor::detach() {
  if (detached_) return;
  detached_ = true;
  // A launch still awaiting its verdict is abandoned: its child is killed and reaped (nobody
  // is left to tell; its staged record is recovery's), so its cgroup is empty and goes too.
  if (launching_) {
    launching_.reset();
    if (cgroup_) (void)cgroup_->remove();
  }
  pending_start_.reset();  // nobody is left to answer (and it may hold this supervisor)
  deadline_.cancel();
  stage_timer_.cancel();
  poll_timer_.cancel();
  drain_timer_.cancel();
  sampler_timer_.cancel();
  reader_timer_.cancel();
  exit_retry_timer_.cancel();
  for (auto& r : readers_) {
    r.sd.reset();
    r.spool.reset();
  }
  writer_.sd.reset();
  writer_.queue.clear();
  exit_sd_.reset();
  unwatch_cgroup_events();
  events_.clear_subscribers();
  // The process, its cgroup and the pidfd's process are left as they are: the registry's
  // staged/committed ownership lets the next daemon start recover them.
  manager_ = nullptr;
}

void Supervisor::discard_spool() {
  if (manager_ == nullptr) return;
  std::error_code ec;
  std::filesystem::remove_all(manager_->config_.state_dir / "spool" / id_, ec);
}

}  // namespace custos::supervisor
