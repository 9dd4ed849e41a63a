// Container rows (issue 18), for each engine of scripts/engines (Docker, rootless Podman):
//   a gated exec of a no-op through custos, exec.start -> terminal (median)
//       vs a plain exec create + start + stream to its end + inspect of the same no-op through
//       the same engine API (median, same run)                                    target <= 1.3x
//   the `docker exec` / `podman exec` CLI running the same no-op (median), beside custos' value:
//       for the record (ratio > 1: custos is that many times faster)
//   teardown of a 200-process escapee tree (plain, setsid and double-forked sleeps) inside the
//       container, exec.cancel -> terminal: for the record, and measured only with zero
//       survivors on the host afterwards
// The engines must be up (scripts/bench starts them with scripts/engines when they are not);
// without them every row says why it has no value.
#include <boost/json.hpp>

#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <iterator>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/io_context.hpp>
#pragma GCC diagnostic pop

#include "custos/engine/client.hpp"

#include "bench.hpp"
#include "daemon_client.hpp"

namespace custos::bench {
namespace {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Engine {
  engine::EngineKind kind = engine::EngineKind::docker;
  std::string socket;
  std::string container;  // the harness's running container
};

// The harness's engines (scripts/engines writes .engines/state.json).
std::optional<Engine> engine_of(engine::EngineKind kind, std::string& why) {
  char const* dir = std::getenv("CUSTOS_ENGINES_DIR");
  std::string const path =
      (dir != nullptr && *dir != '\0' ? std::string{dir}
                                      : std::string{CUSTOS_BENCH_SOURCE_DIR} + "/.engines") +
      "/state.json";
  std::ifstream in(path);
  if (!in) {
    why = "the engines are not up (no " + path + "; scripts/engines up)";
    return std::nullopt;
  }
  std::string const text{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  boost::system::error_code ec;
  auto const v = json::parse(text, ec);
  auto const* e =
      !ec && v.is_object() ? v.as_object().if_contains(engine::to_string(kind)) : nullptr;
  if (e == nullptr || !e->is_object()) {
    why = std::string{engine::to_string(kind)} + " is not up in " + path;
    return std::nullopt;
  }
  auto const& o = e->as_object();
  auto const* sock = o.if_contains("socket");
  auto const* run = o.if_contains("running");
  auto const* name =
      run != nullptr && run->is_object() ? run->as_object().if_contains("name") : nullptr;
  if (sock == nullptr || !sock->is_string() || name == nullptr || !name->is_string()) {
    why = std::string{engine::to_string(kind)} + " has no running container in " + path;
    return std::nullopt;
  }
  return Engine{kind, std::string{sock->as_string()}, std::string{name->as_string()}};
}

// One plain exec of /bin/true through the engine API: create, start, read the stream to its
// end, wait for the recorded exit code. Returns false unless it exited 0.
bool plain_exec(boost::asio::io_context& io, engine::Client& c, Engine const& e) {
  bool ok = false;
  engine::ExecConfig cfg;
  cfg.cmd = {"/bin/true"};
  milliseconds const t{10000};
  c.create_exec(e.container, cfg, t, [&](Result<std::string> id) {
    if (!id) return;
    c.start_exec(*id, false, t, [&, exec = *id](Result<std::shared_ptr<engine::ExecStream>> s) {
      if (!s) return;
      auto stream = *s;
      stream->start([](engine::StdStream, std::span<std::uint8_t const>) {},
                    [&, stream, exec](engine::StreamEnd) {
                      c.wait_exec(exec, t, [&, stream](Result<engine::ExecInspect> r) {
                        stream->close();
                        ok = r && r->exit_code == 0;
                      });
                    });
    });
  });
  io.restart();
  io.run();
  return ok;
}

std::string start_line(Engine const& e, std::string const& action, std::string const& program,
                       std::vector<std::string> const& args) {
  json::object identity{{"project_id", "bench"}, {"session_id", "bench"}, {"run_id", "r"},
                        {"attempt_id", "a"},     {"turn_id", "t"},        {"action_id", action},
                        {"process_id", "p"},     {"workspace_id", "w"},   {"resource_id", "r"},
                        {"environment_id", "e"}, {"generation", 1},       {"revision", 1}};
  json::array argv{program};
  for (auto const& a : args) argv.emplace_back(a);
  json::object plan{{"command", json::object{{"executable", program}, {"argv", std::move(argv)}}},
                    {"workspace", json::object{{"root", "/"}, {"access", "read_only"}}},
                    {"io", json::object{{"mode", "pipes"}}},
                    {"backend", json::object{{"kind", engine::to_string(e.kind)},
                                             {"container", e.container},
                                             {"socket", e.socket}}}};
  return json::serialize(
             json::object{{"jsonrpc", "2.0"},
                          {"id", 1},
                          {"method", "exec.start"},
                          {"params", json::object{{"identity", identity}, {"plan", plan}}}}) +
         "\n";
}

// Sends one request line; the `result` object of its answer, or nullptr on any error.
json::object const* call(int fd, std::string& buf, std::string const& line, json::value& answer) {
  std::string out;
  if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
    return nullptr;
  if (!read_line(fd, buf, out)) return nullptr;
  boost::system::error_code ec;
  answer = json::parse(out, ec);
  auto const* r = !ec && answer.is_object() ? answer.as_object().if_contains("result") : nullptr;
  return r != nullptr && r->is_object() ? &r->as_object() : nullptr;
}

// exec.start; the execution id, or "" on any error.
std::string start(int fd, std::string& buf, std::string const& line) {
  json::value answer;
  auto const* r = call(fd, buf, line, answer);
  auto const* id = r != nullptr ? r->if_contains("execution_id") : nullptr;
  return id != nullptr && id->is_string() ? std::string{id->as_string()} : std::string{};
}

// exec.wait; the terminal record's classification (and exit code), "" on any error.
std::string wait_terminal(int fd, std::string& buf, std::string const& id, int& code) {
  std::string const line =
      json::serialize(json::object{{"jsonrpc", "2.0"},
                                   {"id", 2},
                                   {"method", "exec.wait"},
                                   {"params", json::object{{"execution_id", id}}}}) +
      "\n";
  json::value answer;
  auto const* t = call(fd, buf, line, answer);
  code = -1;
  if (t == nullptr) return {};
  auto const& to = *t;
  auto const* exit = to.if_contains("exit");
  auto const* c =
      exit != nullptr && exit->is_object() ? exit->as_object().if_contains("code") : nullptr;
  code = c != nullptr && c->is_int64() ? static_cast<int>(c->as_int64()) : -1;
  auto const* cl = to.if_contains("classification");
  return cl != nullptr && cl->is_string() ? std::string{cl->as_string()} : std::string{};
}

// Host pids of processes whose command line is exactly `sleep <n>`.
std::size_t host_sleeps(std::string const& n) {
  std::size_t count = 0;
  std::string const want = std::string{"sleep"} + '\0' + n;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return 0;
  while (dirent* ent = ::readdir(d)) {
    if (std::atoi(ent->d_name) <= 0) continue;
    std::ifstream in(std::string{"/proc/"} + ent->d_name + "/cmdline");
    std::string cmd{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
    if (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
    if (cmd == want) ++count;
  }
  ::closedir(d);
  return count;
}

// One run of an engine CLI (`docker exec` against the engine's socket, `podman --remote exec`);
// returns the wait status.
int cli_once(std::vector<std::string> const& args) {
  pid_t const pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto const& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return st;
}

std::string action() {
  static int counter = 0;
  return "act-bench-c-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// The floor: plain execs of /bin/true through the engine API.
void measure_floor(Engine const& e, std::size_t n, Row& row) {
  boost::asio::io_context io;
  engine::Client c(io, engine::Endpoint{e.kind, e.socket});
  std::vector<double> ms;
  (void)plain_exec(io, c, e);  // the version negotiation, not measured
  for (std::size_t i = 0; i < n; ++i) {
    auto const t0 = Clock::now();
    if (!plain_exec(io, c, e)) break;
    ms.push_back(seconds_since(t0) * 1e3);
  }
  if (ms.size() == n) {
    row.value = median(ms);
    row.floor_value = row.value;
    row.note = std::to_string(n) + " execs";
  } else {
    row.note = "a plain exec failed after " + std::to_string(ms.size());
  }
}

// custos: exec.start -> exec.wait of /bin/true in the container, one connection.
void measure_gated(Engine const& e, DaemonProc const& d, std::size_t n, Row& row) {
  int fd = connect_unix(d.socket);
  std::string buf;
  std::vector<double> ms;
  std::string failed;
  for (std::size_t i = 0; fd >= 0 && i <= n; ++i) {
    auto const t0 = Clock::now();
    auto const id = start(fd, buf, start_line(e, action(), "/bin/true", {}));
    int code = -1;
    auto const cl = id.empty() ? std::string{} : wait_terminal(fd, buf, id, code);
    if (cl != "exited" || code != 0) {
      failed = id.empty() ? "exec.start failed" : "terminal " + cl;
      break;
    }
    if (i > 0) ms.push_back(seconds_since(t0) * 1e3);  // the first one probes the gate
  }
  if (fd >= 0) ::close(fd);
  if (ms.size() == n) {
    row.value = median(ms);
    row.note = std::to_string(n) +
               " execs, each claim consumed durably, gated, moved into a per-exec cgroup";
  } else {
    row.note = failed.empty() ? "no connection" : failed;
  }
}

// The engine's own CLI running the same no-op.
void measure_cli(Engine const& e, bool quick, Row& row) {
  std::vector<std::string> args =
      e.kind == engine::EngineKind::docker
          ? std::vector<std::string>{"/usr/bin/docker", "-H",       "unix://" + e.socket, "exec",
                                     e.container,       "/bin/true"}
          : std::vector<std::string>{"/usr/bin/podman",    "--remote", "--url",
                                     "unix://" + e.socket, "exec",     e.container,
                                     "/bin/true"};
  std::vector<double> ms;
  std::size_t const runs = quick ? 3 : 10;
  for (std::size_t i = 0; i < runs; ++i) {
    auto const t0 = Clock::now();
    int const st = cli_once(args);
    if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) break;
    ms.push_back(seconds_since(t0) * 1e3);
  }
  if (ms.size() == runs) {
    row.value = median(ms);
    row.note = std::to_string(runs) + " runs of " + args[0] +
               " exec; ratio > 1: custos is that many times faster";
  } else {
    row.note = args[0] + " exec failed";
  }
}

// A 200-process escapee tree in the container, cancelled; counted on the host before and after.
void measure_teardown(Engine const& e, DaemonProc const& d, Row& row) {
  std::string const s = std::to_string(30000 + ::getpid() % 20000);
  // 66 rounds of a plain, a setsid'd and a double-forked sleep: 198, plus the root's own.
  std::string const script = "i=0; while [ $i -lt 66 ]; do sleep " + s + " & setsid sleep " + s +
                             " & (sleep " + s + " &); i=$((i+1)); done; exec sleep " + s;
  int fd = connect_unix(d.socket);
  std::string buf;
  auto const id =
      fd >= 0 ? start(fd, buf, start_line(e, action(), "/bin/sh", {"-c", script})) : std::string{};
  auto const until = Clock::now() + std::chrono::seconds(60);
  while (!id.empty() && host_sleeps(s) < 199 && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  std::size_t const tree = host_sleeps(s);
  if (id.empty() || tree < 199) {
    row.note = "the tree did not form (" + std::to_string(tree) + " of 199 processes)";
    if (fd >= 0) ::close(fd);
    return;
  }
  std::string const cancel =
      json::serialize(json::object{{"jsonrpc", "2.0"},
                                   {"id", 3},
                                   {"method", "exec.cancel"},
                                   {"params", json::object{{"execution_id", id}}}}) +
      "\n";
  auto const t0 = Clock::now();
  bool const sent = round_trip(fd, cancel, buf);
  int code = -1;
  auto const cl = sent ? wait_terminal(fd, buf, id, code) : std::string{};
  double const took = seconds_since(t0) * 1e3;
  ::close(fd);
  std::size_t const survivors = host_sleeps(s);
  if (cl != "cancelled") {
    row.note = "the cancel ended " + (cl.empty() ? std::string{"with no terminal"} : cl);
  } else if (survivors != 0) {
    row.note = std::to_string(survivors) + " survivors on the host";
  } else {
    row.value = took;
    row.note = std::to_string(tree) + " processes, zero survivors (checked on the host)";
  }
}

std::vector<Row> engine_rows(Env const& env, engine::EngineKind kind, DaemonProc& d, bool up) {
  std::string const name{engine::to_string(kind)};
  Row floor_row;
  floor_row.name = "containers: " + name + " plain exec of /bin/true through the engine API " +
                   "(create + start + stream + inspect, median)";
  floor_row.unit = "ms";
  floor_row.floor_name = floor_row.name;
  Row gated = unmeasured("containers: " + name + " gated exec of /bin/true through custos, " +
                             "exec.start -> terminal (median)",
                         "ms", "plain exec through the same engine API (row above, same run)",
                         std::nullopt, 1.3, Better::lower, "");
  Row cli;
  cli.name = "containers: `" + name + " exec` CLI of /bin/true (median, for the record)";
  cli.unit = "ms";
  cli.floor_name = "custos gated exec, exec.start -> terminal (row above, same run)";
  Row tear;
  tear.name = "containers: " + name + " teardown of a 200-process escapee tree inside the " +
              "container, exec.cancel -> terminal (zero survivors, for the record)";
  tear.unit = "ms";
  tear.floor_name = "(none: for the record)";
  std::string why;
  auto e = engine_of(kind, why);
  if (!e || !up) {
    if (!up) why = "the daemon did not answer on " + d.socket;
    floor_row.note = gated.note = cli.note = tear.note = why;
    return {floor_row, gated, cli, tear};
  }
  std::size_t const n = env.quick ? 5 : 40;
  measure_floor(*e, n, floor_row);
  gated.floor_value = floor_row.value;
  measure_gated(*e, d, n, gated);
  cli.floor_value = gated.value;
  measure_cli(*e, env.quick, cli);
  measure_teardown(*e, d, tear);
  return {floor_row, gated, cli, tear};
}

}  // namespace

std::vector<Row> container_rows(Env const& env, Floors const& f) {
  (void)f;
  DaemonProc d;
  bool const up = start_daemon(env, "containers", d);
  std::vector<Row> rows;
  for (auto kind : {engine::EngineKind::docker, engine::EngineKind::podman}) {
    auto r = engine_rows(env, kind, d, up);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

}  // namespace custos::bench
