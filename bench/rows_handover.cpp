// handover rows (issue 20): 1,000 (quick: 100) live executions handed from one image of the
// daemon to the next (SIGHUP: the process re-executes itself, docs/operations.md "Handover").
//   fresh start -> host.info          a new daemon with an empty state dir: what any image pays
//                                     before it serves (median of 3 (1); floor, for the record)
//   idle handover                     SIGHUP -> host.info with handover.count + 1 on the same
//                                     daemon with no execution: the handover's fixed cost
//   SIGHUP -> serving again           the same with every writer live        <= 1x
//   SIGHUP -> every one re-attached   until a client has seen each writer's `adopted` event
//                                     with output "kept"                     <= 1.25x
// Both timed rows are judged against the idle handover plus, per writer, the clone3 launch floor
// of the same run: handing an execution over may cost what launching it again would.
// Each writer is `custos_bench --helper-drip 200 STOP`: one numbered 16-byte line every 200 ms,
// until STOP exists, then its line count on stderr. After the handover the writers go on for a
// second, are released, and every terminal result and spool is checked: exited 0, handed over
// (`observations.output` "kept"), stdout exactly the lines it counted, accounting complete. Any
// byte lost, or any writer not re-attached, fails both timed rows (no value, the note says how
// many bytes and executions).
#include <boost/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <signal.h>
#include <sstream>
#include <string>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

#include "custos/core/base64.hpp"

#include "bench.hpp"
#include "daemon_client.hpp"

namespace custos::bench {

namespace {

namespace json = boost::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char const* kDripMs = "200";

// One connection to the daemon: requests numbered from 1, every read bounded by a deadline.
class Conn {
 public:
  explicit Conn(std::string const& socket) : fd_(connect_unix(socket)) {}
  Conn(Conn const&) = delete;
  Conn& operator=(Conn const&) = delete;
  ~Conn() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] bool ok() const { return fd_ >= 0; }

  // Sends one request; its id, or nothing when the send failed.
  std::optional<std::int64_t> send(char const* method, json::object params) {
    std::int64_t const id = next_id_++;
    json::object req{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
    req["params"] = std::move(params);
    std::string const line = json::serialize(req) + "\n";
    if (fd_ < 0 ||
        ::send(fd_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
      return std::nullopt;
    return id;
  }

  // The next message (an answer or a notification); nothing on close, garbage or the deadline.
  std::optional<json::object> next(Clock::time_point deadline) {
    for (;;) {
      if (auto const nl = buf_.find('\n'); nl != std::string::npos) {
        boost::system::error_code ec;
        auto v = json::parse(std::string_view(buf_).substr(0, nl), ec);
        buf_.erase(0, nl + 1);
        if (ec || !v.is_object()) return std::nullopt;
        return std::move(v.as_object());
      }
      auto const left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      pollfd p{fd_, POLLIN, 0};
      if (fd_ < 0 || left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) return std::nullopt;
      char tmp[65536];
      ssize_t const n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n <= 0) return std::nullopt;
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
  }

  // One call: the `result` of its answer, or nothing (an error answer, a close, the timeout).
  // Notifications read meanwhile are dropped.
  std::optional<json::object> call(char const* method, json::object params,
                                   milliseconds timeout = milliseconds(30000)) {
    auto const deadline = Clock::now() + timeout;
    auto const id = send(method, std::move(params));
    if (!id) return std::nullopt;
    while (auto m = next(deadline)) {
      auto const* got = m->if_contains("id");
      if (got == nullptr || !got->is_int64() || got->as_int64() != *id) continue;
      auto* result = m->if_contains("result");
      if (result == nullptr || !result->is_object()) return std::nullopt;
      return std::move(result->as_object());
    }
    return std::nullopt;
  }

 private:
  int fd_;
  std::string buf_;
  std::int64_t next_id_ = 1;
};

std::string str(json::object const& o, char const* key) {
  auto const* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->as_string()) : std::string();
}

std::int64_t int_or(json::object const& o, char const* key, std::int64_t fallback) {
  auto const* v = o.if_contains(key);
  if (v == nullptr) return fallback;
  if (v->is_int64()) return v->as_int64();
  if (v->is_uint64()) return static_cast<std::int64_t>(v->as_uint64());
  return fallback;
}

json::object const& obj(json::object const& o, char const* key) {
  static json::object const empty;
  auto const* v = o.if_contains(key);
  return v != nullptr && v->is_object() ? v->as_object() : empty;
}

// host.info's handover.count: 0 for an image no handover started.
std::int64_t handover_count(json::object const& info) {
  return int_or(obj(info, "handover"), "count", 0);
}

// Connects and asks host.info until an image with handover.count >= `want` answers (a connect
// made during the handover waits in the backlog; the old image may still take one and close it):
// that answer, or nothing by `deadline`.
std::optional<json::object> await_serving(std::string const& socket, std::int64_t want,
                                          Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    Conn c(socket);
    if (c.ok()) {
      auto info = c.call("host.info", {},
                         std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
      if (info && handover_count(*info) >= want) return info;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  return std::nullopt;
}

bool send_signal(DaemonProc const& d, int sig) {
  return ::syscall(SYS_pidfd_send_signal, d.pidfd, sig, nullptr, 0) == 0;
}

json::object drip_start(Env const& env, std::string const& stop, std::size_t i) {
  json::object identity{
      {"project_id", "bench"},
      {"session_id", "bench-handover"},
      {"run_id", "r"},
      {"attempt_id", "a"},
      {"turn_id", "t"},
      {"action_id", "act-handover-" + std::to_string(::getpid()) + "-" + std::to_string(i)},
      {"process_id", "p"},
      {"workspace_id", "w"},
      {"resource_id", "r"},
      {"environment_id", "e"},
      {"generation", 1},
      {"revision", 1}};
  json::object plan{
      {"command",
       json::object{{"executable", env.self_path},
                    {"argv", json::array{"custos_bench", "--helper-drip", kDripMs, stop}}}},
      {"workspace", json::object{{"root", env.work_dir + "/ws"}, {"access", "writable"}}},
      {"io", json::object{{"mode", "pipes"}}}};
  return json::object{{"identity", std::move(identity)}, {"plan", std::move(plan)}};
}

// Whether a client sees `id` re-attached with its output: exec.subscribe from `from_seq` (past
// the last event before the handover) replays up to the `adopted` event, whose `output` must be
// "kept". The subscription is dropped again.
bool seen_kept(Conn& c, std::string const& id, std::uint64_t from_seq, Clock::time_point deadline) {
  auto const req = c.send("exec.subscribe", {{"execution_id", id}, {"from_seq", from_seq}});
  if (!req) return false;
  std::optional<std::string> subscription;
  std::optional<bool> kept;
  while (!subscription || !kept) {
    auto m = c.next(deadline);
    if (!m) return false;
    if (auto const* got = m->if_contains("id"); got != nullptr) {
      if (!got->is_int64() || got->as_int64() != *req) continue;
      auto const& result = obj(*m, "result");
      subscription = str(result, "subscription");
      if (subscription->empty()) return false;
      continue;
    }
    auto const& p = obj(*m, "params");
    if (str(p, "execution_id") != id) continue;  // a subscription dropped before
    if (str(p, "kind") == "adopted") kept = str(p, "output") == "kept";
    if (str(p, "kind") == "terminal" && !kept) return false;
  }
  // Ends by itself after `terminal`; an error answer here changes nothing.
  (void)c.call("exec.unsubscribe", {{"subscription", *subscription}});
  return *kept;
}

// The whole of one stream through exec.output, or nothing.
std::optional<std::string> whole_output(Conn& c, std::string const& id, char const* stream) {
  std::string out;
  for (int slices = 0; slices < 64; ++slices) {
    auto r = c.call(
        "exec.output",
        {{"execution_id", id}, {"stream", stream}, {"offset", out.size()}, {"max_bytes", 1 << 20}});
    if (!r) return std::nullopt;
    auto data = core::base64_decode(str(*r, "data_b64"));
    if (!data) return std::nullopt;
    out.append(data->begin(), data->end());
    auto const* eof = r->if_contains("eof");
    if (eof != nullptr && eof->is_bool() && eof->as_bool()) return out;
  }
  return std::nullopt;
}

// What the end of the run found.
struct Tally {
  std::size_t lost_executions = 0;  // ended otherwise than exited 0, or with a byte missing
  std::uint64_t lost_bytes = 0;     // expected bytes from the first one that differs, summed
  std::size_t not_kept = 0;         // terminal observations do not say output "kept"
  std::uint64_t bytes = 0;          // stdout bytes written by all writers
  std::string first_problem;
};

// Checks one released writer: its terminal result and its spools against its own line count.
void check_writer(Conn& c, std::string const& id, Tally& t) {
  auto problem = [&](std::string const& what, std::uint64_t bytes) {
    ++t.lost_executions;
    t.lost_bytes += bytes;
    if (t.first_problem.empty()) t.first_problem = id + ": " + what;
  };
  auto term =
      c.call("exec.wait", {{"execution_id", id}, {"timeout_ms", 30000}}, milliseconds(40000));
  if (!term) return problem("no terminal result", 0);
  if (str(obj(*term, "observations"), "output") != "kept") ++t.not_kept;
  auto const err = whole_output(c, id, "stderr");
  auto const out = whole_output(c, id, "stdout");
  if (!err || !out || err->empty()) return problem("exec.output failed or no line count", 0);
  std::uint64_t const lines = std::strtoull(err->c_str(), nullptr, 10);
  std::string expected;
  expected.reserve(lines * kDripLine);
  char line[32];  // room for any u64: the format's bound, though a line count has 10 digits
  for (std::uint64_t i = 0; i < lines; ++i) {
    std::snprintf(line, sizeof line, "%010llu drip\n", static_cast<unsigned long long>(i));
    expected.append(line, kDripLine);
  }
  t.bytes += expected.size();
  auto const same = std::mismatch(expected.begin(), expected.end(), out->begin(), out->end());
  auto const kept = static_cast<std::uint64_t>(same.first - expected.begin());
  auto const& acc = obj(obj(*term, "output"), "stdout");
  auto const observed = static_cast<std::uint64_t>(int_or(acc, "observed", -1));
  auto const retained = static_cast<std::uint64_t>(int_or(acc, "retained", -1));
  auto const* complete = acc.if_contains("complete");
  bool const whole = str(*term, "classification") == "exited" &&
                     int_or(obj(*term, "exit"), "code", -1) == 0 && err->back() == '\n' &&
                     kept == expected.size() && out->size() == expected.size() &&
                     observed == expected.size() && retained == expected.size() &&
                     complete != nullptr && complete->is_bool() && complete->as_bool();
  if (!whole) {
    problem(str(*term, "classification") + ", exit " + json::serialize(obj(*term, "exit")) +
                ", stdout " + json::serialize(acc) + ", " + std::to_string(out->size()) + " of " +
                std::to_string(expected.size()) + " bytes read back",
            expected.size() - kept);
  }
}

std::size_t open_descriptors(pid_t pid) {
  std::error_code ec;
  std::size_t n = 0;
  for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// The soft RLIMIT_NOFILE of `pid` ("Max open files" in /proc/<pid>/limits), as text.
std::string descriptor_limit(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/limits");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream fields(line.substr(14));
    std::string soft;
    fields >> soft;
    return soft;
  }
  return "?";
}

std::string ms_text(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f ms", ms);
  return buf;
}

}  // namespace

std::vector<Row> handover_rows(Env const& env, Floors const& f) {
  std::size_t const n = env.quick ? 100 : 1000;
  std::string const count = n == 1000 ? "1,000" : std::to_string(n);
  // The budget (docs/benchmarks.md, "Rows and targets"): the fixed cost of a handover (the idle
  // one, same run) plus, per live execution, no more than launching it again would cost at the
  // kernel's floor (the clone3 launch floor, same run). Seeing every one re-attached adds three
  // round trips per execution on the client's side: 25% more.
  double const serve_target = 1.0;
  double const attach_target = 1.25;
  std::string const floor_name =
      "the same handover with no execution + " + count + " x the clone3 launch floor (same run)";

  Row fresh;
  fresh.name = "handover floor: fresh `custos daemon` start -> host.info (empty state dir, median)";
  fresh.unit = "ms";
  fresh.floor_name = fresh.name;
  fresh.better = Better::lower;
  Row idle;
  idle.name = "handover floor: SIGHUP -> host.info with handover.count + 1, no execution";
  idle.unit = "ms";
  idle.floor_name = "fresh daemon start -> host.info (row above, same run)";
  idle.better = Better::lower;
  Row serve = unmeasured("handover of " + count +
                             " live writers: SIGHUP -> host.info serves again (handover.count + 1)",
                         "ms", floor_name, std::nullopt, serve_target, Better::lower, "");
  Row attach = unmeasured(
      "same: SIGHUP -> every writer seen re-attached (`adopted`, output kept), zero bytes lost",
      "ms", floor_name, std::nullopt, attach_target, Better::lower, "");
  auto give_up = [&](std::string const& why) {
    if (serve.note.empty()) serve.note = why;
    if (attach.note.empty()) attach.note = why;
    return std::vector<Row>{fresh, idle, serve, attach};
  };

  {
    std::vector<double> ms;
    for (int i = 0; i < (env.quick ? 1 : 3); ++i) {
      DaemonProc d;
      auto const t0 = Clock::now();
      if (!start_daemon(env, "handover-fresh-" + std::to_string(i), d)) break;
      ms.push_back(seconds_since(t0) * 1e3);
    }
    if (!ms.empty()) fresh.value = fresh.floor_value = median(ms);
  }

  DaemonProc d;
  if (!start_daemon(env, "handover", d)) return give_up("the daemon did not answer on " + d.socket);
  auto const wait_limit = milliseconds(60000);
  {
    auto const t0 = Clock::now();
    if (!send_signal(d, SIGHUP)) return give_up("SIGHUP could not be sent");
    if (!await_serving(d.socket, 1, t0 + wait_limit))
      return give_up("the idle handover did not serve again within 60 s");
    idle.value = seconds_since(t0) * 1e3;
    idle.floor_value = fresh.value;
    idle.note =
        "the handover's fixed cost: the new image's --check-config run, the execve and "
        "the start-up of the new image";
  }
  if (f.launch_seq_ms) {
    serve.floor_value = attach.floor_value =
        *idle.value + static_cast<double>(n) * *f.launch_seq_ms;
  }

  // Every writer is released when this scope ends, whatever happened: the daemon's SIGTERM
  // (shutdown = cancel) then ends any that is left.
  std::string const stop = env.work_dir + "/handover-stop";
  struct Release {
    std::string path;
    ~Release() { std::ofstream{path}; }
  } const release{stop};

  std::vector<std::string> ids;
  {
    Conn c(d.socket);
    for (std::size_t i = 0; i < n; ++i) {
      auto r = c.call("exec.start", drip_start(env, stop, i));
      if (!r || int_or(*r, "pid", 0) == 0)
        return give_up("launch " + std::to_string(i) + " failed" +
                       (r ? ": " + json::serialize(*r) : std::string()));
      ids.push_back(str(*r, "execution_id"));
    }
  }
  std::this_thread::sleep_for(milliseconds(1000));  // every writer has written

  // Where each one's events stand just before the signal: the `adopted` event comes after.
  std::vector<std::uint64_t> last_seq(n, 0);
  std::size_t const fds = open_descriptors(d.pid);
  std::string const fd_limit = descriptor_limit(d.pid);
  {
    Conn c(d.socket);
    auto list = c.call("exec.list", {{"limit", 1000}, {"phase", "running"}});
    auto const* all = list ? list->if_contains("executions") : nullptr;
    if (all == nullptr || !all->is_array()) return give_up("exec.list failed before the handover");
    std::size_t found = 0;
    for (auto const& e : all->as_array()) {
      if (!e.is_object()) continue;
      auto const it = std::find(ids.begin(), ids.end(), str(e.as_object(), "execution_id"));
      if (it == ids.end()) continue;
      last_seq[static_cast<std::size_t>(it - ids.begin())] =
          static_cast<std::uint64_t>(int_or(e.as_object(), "events", 0));
      ++found;
    }
    if (found != n)
      return give_up(std::to_string(n - found) + " writers were not running before the handover");
  }

  auto const t0 = Clock::now();
  if (!send_signal(d, SIGHUP)) return give_up("SIGHUP could not be sent");
  auto const info = await_serving(d.socket, 2, t0 + wait_limit);
  if (!info) return give_up("the daemon did not serve again within 60 s of SIGHUP");
  double const serve_ms = seconds_since(t0) * 1e3;
  std::size_t recovered = 0;
  if (auto const* a = obj(*info, "registry").if_contains("adopted"); a != nullptr && a->is_array())
    recovered = a->as_array().size();

  // Re-attachment as a client sees it, from 4 connections at once.
  std::atomic<std::size_t> attached{0};
  {
    std::vector<std::thread> threads;
    for (std::size_t k = 0; k < 4; ++k) {
      threads.emplace_back([&, k] {
        Conn c(d.socket);
        for (std::size_t i = k; i < n; i += 4) {
          if (seen_kept(c, ids[i], last_seq[i] + 1, t0 + wait_limit)) ++attached;
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  double const attach_ms = seconds_since(t0) * 1e3;

  std::this_thread::sleep_for(milliseconds(1000));  // writing on under the new image
  { std::ofstream{stop}; }
  Tally t;
  {
    Conn c(d.socket);
    for (auto const& id : ids) check_writer(c, id, t);
  }

  std::string const figures = std::to_string(n) + " writers (one 16-byte line each 200 ms), " +
                              std::to_string(t.bytes) + " bytes in all; the daemon held " +
                              std::to_string(fds) + " descriptors before the handover (its limit " +
                              fd_limit + "); host.info registry.adopted listed " +
                              std::to_string(recovered) + "; " + std::to_string(attached.load()) +
                              " seen re-attached with output kept, " +
                              std::to_string(n - t.not_kept) + " terminal results say output kept";
  if (t.lost_executions > 0 || attached != n || t.not_kept > 0 || recovered != n) {
    serve.note = attach.note = "FAILED: " + std::to_string(t.lost_bytes) + " bytes lost in " +
                               std::to_string(t.lost_executions) + " of " + std::to_string(n) +
                               " executions (" + ms_text(serve_ms) + ", " + ms_text(attach_ms) +
                               " measured); " + figures +
                               (t.first_problem.empty() ? "" : "; first: " + t.first_problem);
    return {fresh, idle, serve, attach};
  }
  serve.value = serve_ms;
  attach.value = attach_ms;
  serve.note = attach.note =
      (f.launch_seq_ms ? "" : "no clone3 launch floor on this host (no writable cgroup v2); ") +
      figures + ", zero bytes lost";
  return {fresh, idle, serve, attach};
}

}  // namespace custos::bench
