// rpc rows (issue 5): the daemon over its real socket, beside same-run floors.
//   host.info round trip           vs a raw Unix-socket line echo (p50)         target <= 2x
//   exec.start -> terminal, seq.   vs clone3 launch floor + one FULL commit + one socket echo
//                                  round trip (one request: exec.start subscribe)  target <= 1.25x
//   same, 16 clients               vs the 16-launcher floor, one FULL commit each  target >= 0.9x
//   a reference execution (plan.backend "reference", script {"exit": 0}) exec.start -> terminal,
//   sequential, beside the native sequential row's value: for the record, no target. Same
//   requests, same daemon, same durable claim and records; no process, no cgroup, no sweep.
//   the same no-op through `bwrap --unshare-all` (fork + exec + wait), beside the sequential
//   row's value: for the record, no target (a sandbox launcher, not a supervisor: no cgroup, no
//   durable record, no events), like the floor rows.
// The daemon is the release `custos` binary started for the run (state in the work dir, its
// cgroup subtree under the bench's cgroup root) and stopped by pidfd at the end.
#include <boost/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <signal.h>
#include <string>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "bench.hpp"
#include "daemon_client.hpp"

namespace custos::bench {

namespace {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

// Floor: a thread echoing lines on a Unix stream socket, same framing, no JSON.
std::optional<double> echo_floor_us(Env const& env, std::size_t n) {
  std::string const path = env.work_dir + "/echo.sock";
  int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 4) != 0) {
    ::close(lfd);
    return std::nullopt;
  }
  std::thread server([lfd] {
    int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    std::string buf;
    char tmp[65536];
    for (;;) {
      ssize_t r = ::recv(c, tmp, sizeof tmp, 0);
      if (r <= 0) break;
      buf.append(tmp, static_cast<std::size_t>(r));
      auto nl = buf.rfind('\n');
      if (nl == std::string::npos) continue;
      std::string out = buf.substr(0, nl + 1);
      buf.erase(0, nl + 1);
      if (::send(c, out.data(), out.size(), MSG_NOSIGNAL) < 0) break;
    }
    ::close(c);
  });
  int fd = connect_unix(path);
  std::vector<double> us;
  std::string const line = R"({"jsonrpc":"2.0","method":"host.info","id":1})"
                           "\n";
  std::string buf;
  for (std::size_t i = 0; fd >= 0 && i < n; ++i) {
    auto t0 = Clock::now();
    if (!round_trip(fd, line, buf)) break;
    us.push_back(seconds_since(t0) * 1e6);
  }
  if (fd >= 0) ::close(fd);
  server.join();
  ::close(lfd);
  ::unlink(path.c_str());
  if (us.size() != n) return std::nullopt;
  return median(us);
}

// The backend a launch runs on: the native one (clone3 of the static no-op), or the reference
// model with the smallest script that ends on purpose (docs/api.md, "The reference backend").
enum class Backend : std::uint8_t { native, reference };
// The workspace as `custos run` declares it by default (writable), or read-only: enforced for a
// native execution by a private mount namespace with the workspace mounted read-only.
enum class Access : std::uint8_t { writable, read_only };

std::string start_line(Env const& env, std::string const& action, int id, Backend backend,
                       Access access) {
  json::object identity{{"project_id", "bench"}, {"session_id", "bench"}, {"run_id", "r"},
                        {"attempt_id", "a"},     {"turn_id", "t"},        {"action_id", action},
                        {"process_id", "p"},     {"workspace_id", "w"},   {"resource_id", "r"},
                        {"environment_id", "e"}, {"generation", 1},       {"revision", 1}};
  json::object plan{
      {"command", json::object{{"executable", env.noop_path}, {"argv", json::array{"noop"}}}},
      {"workspace",
       json::object{{"root", env.work_dir + "/ws"},
                    {"access", access == Access::writable ? "writable" : "read_only"}}},
      {"io", json::object{{"mode", "pipes"}}}};
  if (backend == Backend::reference) {
    plan["backend"] =
        json::object{{"kind", "reference"},
                     {"script", json::object{{"steps", json::array{json::object{{"exit", 0}}}}}}};
  }
  // One request for the whole run, as `custos run` and the clients do: the answer is followed
  // on this connection by the execution's events, terminal last.
  json::object req{
      {"jsonrpc", "2.0"},
      {"id", id},
      {"method", "exec.start"},
      {"params", json::object{{"identity", identity}, {"plan", plan}, {"subscribe", true}}}};
  return json::serialize(req) + "\n";
}

// Whether a terminal result is `exited` 0.
bool exited_zero(json::value const* terminal) {
  if (terminal == nullptr || !terminal->is_object()) return false;
  auto const* classification = terminal->as_object().if_contains("classification");
  auto const* exit = terminal->as_object().if_contains("exit");
  auto const* code =
      exit != nullptr && exit->is_object() ? exit->as_object().if_contains("code") : nullptr;
  return classification != nullptr && classification->is_string() &&
         classification->as_string() == "exited" && code != nullptr && code->is_int64() &&
         code->as_int64() == 0;
}

// One exec.start with `subscribe: true` on `fd`, read through to the terminal event; returns
// false on any error, or when the terminal result is not `exited` 0.
bool launch_once(Env const& env, int fd, std::string& buf, std::string const& action,
                 Backend backend = Backend::native, Access access = Access::writable) {
  std::string line;
  std::string const req = start_line(env, action, 1, backend, access);
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
    return false;
  bool answered = false;
  for (;;) {
    if (!read_line(fd, buf, line)) return false;
    boost::system::error_code ec;
    auto v = json::parse(line, ec);
    if (ec || !v.is_object()) return false;
    auto const& m = v.as_object();
    if (m.contains("id")) {
      auto const* result = m.if_contains("result");
      if (result == nullptr || !result->is_object()) return false;
      // The reference model answers boundary "reference": a start that ran natively does not
      // count.
      if (backend == Backend::reference) {
        auto const* boundary = result->as_object().if_contains("boundary");
        if (boundary == nullptr || !boundary->is_string() || boundary->as_string() != "reference")
          return false;
      }
      answered = true;
      continue;
    }
    auto const* params = m.if_contains("params");
    if (params == nullptr || !params->is_object()) continue;
    auto const* kind = params->as_object().if_contains("kind");
    if (kind != nullptr && kind->is_string() && kind->as_string() == "terminal") {
      return answered && exited_zero(params->as_object().if_contains("terminal"));
    }
  }
}

// The first executable named `name` on $PATH, or "".
std::string on_path(std::string const& name) {
  char const* path = std::getenv("PATH");
  std::string const dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string const candidate = dirs.substr(start, end - start) + "/" + name;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

// One `bwrap --unshare-all --bind / / NOOP`: fork, exec, wait. Returns the exit status
// (waitpid form), -1 when fork failed. bwrap's stderr goes to `err_path`.
int bwrap_once(std::string const& bwrap, std::string const& noop, std::string const& err_path) {
  pid_t const pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int const err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (err >= 0) ::dup2(err, STDERR_FILENO);
    char const* argv[] = {bwrap.c_str(), "--unshare-all", "--bind", "/",
                          "/",           noop.c_str(),    nullptr};
    ::execv(argv[0], const_cast<char* const*>(argv));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

Row bwrap_row(Env const& env, std::optional<double> custos_ms, std::size_t n) {
  Row r;
  r.name = "rpc: the same no-op through `bwrap --unshare-all` (median, for the record)";
  r.unit = "ms";
  r.floor_name = "custos exec.start -> terminal, sequential (native rpc row, same run)";
  r.floor_value = custos_ms;
  r.better = Better::lower;
  std::string const bwrap = on_path("bwrap");
  if (bwrap.empty()) {
    r.note = "bwrap is not installed here (scripts/install-deps installs bubblewrap)";
    return r;
  }
  std::string const err_path = env.work_dir + "/bwrap.err";
  std::vector<double> ms;
  for (std::size_t i = 0; i < n; ++i) {
    auto const t0 = Clock::now();
    int const status = bwrap_once(bwrap, env.noop_path, err_path);
    double const took = seconds_since(t0) * 1e3;
    if (status < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::ifstream in(err_path);
      std::string why;
      std::getline(in, why);
      r.note = "bwrap --unshare-all --bind / / cannot run here (exit status " +
               std::to_string(status) + (why.empty() ? "" : ": " + why) + ")";
      return r;
    }
    ms.push_back(took);
  }
  r.value = median(ms);
  r.note =
      std::to_string(n) + " launches of the static no-op in new user, mount, pid, net, ipc, " +
      "uts and cgroup namespaces (no cgroup, no durable record, no events); ratio > 1: custos' " +
      "whole exec.start -> terminal path is that many times faster";
  ::unlink(err_path.c_str());
  return r;
}

}  // namespace

std::vector<Row> rpc_rows(Env const& env, Floors const& f) {
  std::size_t const n_rtt = env.quick ? 200 : 2000;
  std::size_t const n_seq = env.quick ? 30 : 300;
  std::size_t const per_client = env.quick ? 5 : 40;
  auto floor_us = echo_floor_us(env, n_rtt);
  // One run costs at least a launch, the claim's durable commit and the one round trip of its
  // request over the socket.
  std::optional<double> launch_floor_ms;
  if (f.launch_seq_ms && f.sqlite_full_commit_us && floor_us) {
    launch_floor_ms = *f.launch_seq_ms + *f.sqlite_full_commit_us / 1000.0 + *floor_us / 1000.0;
  }
  std::optional<double> launch_floor_per_s;
  if (f.launch_concurrent_per_s && f.sqlite_full_commit_us) {
    launch_floor_per_s = 1.0 / (1.0 / *f.launch_concurrent_per_s + *f.sqlite_full_commit_us / 1e6);
  }
  Row rtt = unmeasured("rpc: host.info round trip over the socket (p50)", "us",
                       "raw Unix-socket line echo (same run)", floor_us, 2.0, Better::lower, "");
  Row seq = unmeasured("rpc: exec.start -> terminal of a static no-op, sequential (median)", "ms",
                       "clone3 launch floor + one SQLite FULL commit + one socket echo round trip",
                       launch_floor_ms, 1.25, Better::lower, "");
  // For the record, beside the native row: its floor is the native row's value of this run.
  Row ref;
  ref.name =
      "rpc: exec.start -> terminal of a reference execution (script: exit 0), sequential (median, "
      "for the record)";
  ref.unit = "ms";
  ref.floor_name = "native exec.start -> terminal, sequential (rpc row above, same run)";
  ref.better = Better::lower;
  Row par = unmeasured("rpc: same, 16 clients", "launches/s",
                       "16-launcher clone3 floor with one FULL commit per launch",
                       launch_floor_per_s, 0.9, Better::higher, "");
  // The same native runs with the workspace read-only (for the record; see below).
  Row ro;
  ro.name =
      "rpc: the same with a read-only workspace (private mount namespace; median, for the "
      "record)";
  ro.unit = "ms";
  ro.floor_name = "native exec.start -> terminal, sequential, writable workspace (same run)";
  ro.better = Better::lower;
  DaemonProc d;
  if (!start_daemon(env, "rpc", d)) {
    rtt.note = seq.note = ref.note = ro.note = par.note =
        "the daemon did not answer on " + d.socket;
    return {rtt, seq, ref, ro, par, bwrap_row(env, std::nullopt, n_seq)};
  }
  {
    int fd = connect_unix(d.socket);
    std::string buf;
    std::vector<double> us;
    std::string const line = R"({"jsonrpc":"2.0","method":"host.info","id":1})"
                             "\n";
    for (std::size_t i = 0; fd >= 0 && i < n_rtt; ++i) {
      auto t0 = Clock::now();
      if (!round_trip(fd, line, buf)) break;
      us.push_back(seconds_since(t0) * 1e6);
    }
    if (fd >= 0) ::close(fd);
    if (us.size() == n_rtt)
      rtt.value = median(us);
    else
      rtt.note = "a host.info call failed";
  }
  static std::atomic<std::uint64_t> counter{0};
  auto action = [] {
    return "act-bench-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  };
  // `n` one-request runs one after the other on a connection of their own: their milliseconds,
  // fewer when one failed.
  auto sequential = [&](std::size_t n, Backend backend, Access access) {
    int fd = connect_unix(d.socket);
    std::string buf;
    std::vector<double> ms;
    for (std::size_t i = 0; fd >= 0 && i < n; ++i) {
      auto t0 = Clock::now();
      if (!launch_once(env, fd, buf, action(), backend, access)) break;
      ms.push_back(seconds_since(t0) * 1e3);
    }
    if (fd >= 0) ::close(fd);
    return ms;
  };
  if (auto ms = sequential(n_seq, Backend::native, Access::writable); ms.size() == n_seq) {
    seq.value = median(ms);
    seq.note = std::to_string(n_seq) + " launches, each claim consumed durably";
  } else {
    seq.note = "a launch failed after " + std::to_string(ms.size());
  }
  // The same requests with plan.backend = reference: the daemon's whole path of an execution
  // (parse, gateway, the claim consumed durably, record, modelled staged slot, committed +
  // running, events, close, terminal record, the answer and the events) with no process, no
  // cgroup and no final sweep.
  ref.floor_value = seq.value;
  if (auto ms = sequential(n_seq, Backend::reference, Access::writable); ms.size() == n_seq) {
    ref.value = median(ms);
    ref.note = std::to_string(n_seq) +
               " launches of the reference model (no process, no cgroup), each claim consumed "
               "durably, each ending exited 0 with boundary reference; ratio < 1: the share of "
               "the native row that is the daemon's own path, the rest is the process, its "
               "cgroup and its final sweep";
  } else {
    ref.note =
        "a reference launch failed or did not end exited 0 after " + std::to_string(ms.size());
  }
  // The same native runs with the workspace read-only: the private mount namespace that
  // enforces it (open_tree clone of the workspace, made read-only, attached in the child's new
  // namespace) is what this row adds to the writable one.
  ro.floor_value = seq.value;
  std::size_t const n_ro = std::max<std::size_t>(n_seq / 3, 10);
  if (auto ms = sequential(n_ro, Backend::native, Access::read_only); ms.size() == n_ro) {
    ro.value = median(ms);
    ro.note = std::to_string(n_ro) +
              " launches; the difference to the writable row is the mount namespace: its copy "
              "at clone3 (CLONE_NEWNS), the read-only attach, and its teardown at the exit";
  } else {
    ro.note = "a read-only launch failed after " + std::to_string(ms.size());
  }
  {
    std::atomic<std::size_t> done{0};
    std::vector<std::thread> threads;
    auto t0 = Clock::now();
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&] {
        int fd = connect_unix(d.socket);
        std::string buf;
        for (std::size_t i = 0; fd >= 0 && i < per_client; ++i) {
          if (!launch_once(env, fd, buf, action())) break;
          ++done;
        }
        if (fd >= 0) ::close(fd);
      });
    }
    for (auto& th : threads) th.join();
    double const secs = seconds_since(t0);
    if (done == 16 * per_client) {
      par.value = static_cast<double>(done.load()) / secs;
      par.note = std::to_string(done.load()) + " launches, all terminal";
    } else {
      par.note = std::to_string(16 * per_client - done.load()) + " launches failed or were lost";
    }
  }
  return {rtt, seq, ref, ro, par, bwrap_row(env, seq.value, n_seq)};
}

}  // namespace custos::bench
