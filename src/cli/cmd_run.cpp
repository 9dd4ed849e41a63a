// custos run: one command as an owned execution, streamed live.
//
// Builds the plan from the flags, then one request for the whole run: exec.start with
// `subscribe: true`, whose answer is followed on the same connection by every exec.event of the
// execution from seq 1, terminal last (docs/api.md). Then one poll loop over the daemon socket,
// our stdin and a signalfd: output events go to our stdout/stderr, stdin goes
// to exec.input (EOF included), SIGWINCH becomes exec.resize (--pty), SIGINT/SIGTERM/SIGHUP
// become exec.cancel (in --pty mode Ctrl-C is a byte for the child's terminal instead, as it
// would be in any terminal). The exit code is the child's (docs/cli.md).
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <optional>
#include <poll.h>
#include <random>
#include <signal.h>
#include <span>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include "custos/core/base64.hpp"
#include "custos/rpc/protocol.hpp"
#include "custos/sys/unique_fd.hpp"

#include "common.hpp"
#include "exit_codes.hpp"
#include "run_progress.hpp"
#include "run_sandbox.hpp"

extern char** environ;

namespace custos::cli {

namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

struct RunFlags {
  std::vector<std::string> command;
  std::string cwd;
  std::string workspace;
  std::vector<std::string> env;
  double timeout_s = 0;
  std::optional<double> grace_s;  // --grace: escalation.grace_ms (the plan's default otherwise)
  bool pty = false;
  bool progress = false;  // --progress: a live status line on a terminal
  bool clean_env = false;
  bool read_only = false;
  // Authority and identity (docs/authority.md). Defaults suit one user on one machine: no grant
  // (the admin's implicit authority), no lease, session cli-<uid>, ids "cli".
  std::string grant;
  std::string lease;
  std::string session;
  std::string project_id = "cli";
  std::string workspace_id = "cli";
  std::string resource_id = "cli";
  std::string environment_id = "cli";
  std::uint64_t generation = 0;
  // Inside a container (docs/containers.md): the engine and the container's name or id, and the
  // engine socket when not the daemon's configured one.
  std::string docker;
  std::string podman;
  std::string docker_socket;
  std::string podman_socket;
  bool ungated = false;  // --ungated: the plan's gate is optional
  SandboxFlags sandbox;  // --sandbox FILE.json, --sandbox-profile NAME
  bool check = false;    // --check: exec.check instead of exec.start
  [[nodiscard]] bool in_container() const { return !docker.empty() || !podman.empty(); }
};

// Names inherited by default so ordinary programs find their tools and locale.
constexpr char const* kDefaultInherit[] = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM"};

bool is_executable_file(fs::path const& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// A bare name is looked up in the caller's PATH like execvp would; a name with '/' is taken
// relative to the current directory. argv[0] stays what the user typed.
Result<std::string> resolve_executable(std::string const& name) {
  if (name.empty()) return Error{Errc::plan_invalid_executable, "empty command"};
  if (name.find('/') != std::string::npos) {
    fs::path p = fs::absolute(name).lexically_normal();
    if (!is_executable_file(p)) {
      return Error{Errc::plan_invalid_executable, p.native() + " is not an executable file"};
    }
    return p.native();
  }
  char const* path_env = std::getenv("PATH");
  std::string const path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= path.size()) {
    auto const end = path.find(':', start);
    std::string dir =
        path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (dir.empty()) dir = ".";
    fs::path candidate = fs::absolute(fs::path{dir} / name).lexically_normal();
    if (is_executable_file(candidate)) return candidate.native();
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return Error{Errc::plan_invalid_executable, name + ": not found in PATH"};
}

std::string random_hex(std::size_t n) {
  std::random_device rd;
  std::string out;
  static constexpr char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < n; ++i) out.push_back(kHex[rd() & 15U]);
  return out;
}

// The plan's environment: the default names inherited (unless --clean-env), the names --env
// gave without a value inherited, and --env NAME=VALUE literals. A literal wins over a default
// inheritance of the same name; the daemon supplies inherited values, none travels from here.
// Under a sandbox the defaults are only those its environment.allow names, and `extra` (the
// profile's TMPDIR) is added unless --env gave the name.
json::array plan_env(RunFlags const& f, std::optional<json::object> const& sandbox,
                     std::vector<std::pair<std::string, std::string>> const& extra) {
  json::array env;
  std::map<std::string, bool> seen;
  auto inherit = [&](std::string const& name) {
    if (seen.count(name) != 0) return;
    seen[name] = true;
    // The daemon supplies the value from its own environment; no value travels from here.
    env.push_back(json::object{{"name", name}, {"inherit", true}});
  };
  std::vector<std::pair<std::string, std::string>> literals;
  for (auto const& e : f.env) {
    auto const eq = e.find('=');
    if (eq == std::string::npos) continue;
    literals.emplace_back(e.substr(0, eq), e.substr(eq + 1));
  }
  auto literal_named = [&](std::string const& n) {
    for (auto const& [k, v] : literals)
      if (k == n) return true;
    return false;
  };
  // A container has its own environment (the engine applies it): nothing is inherited from the
  // daemon's unless named.
  std::vector<std::string> const allowed =
      sandbox ? sandbox_env_allow(*sandbox) : std::vector<std::string>{};
  auto defaulted = [&](std::string const& name) {
    return !sandbox || std::find(allowed.begin(), allowed.end(), name) != allowed.end();
  };
  if (!f.clean_env && !f.in_container()) {
    for (char const* name : kDefaultInherit) {
      if (std::getenv(name) != nullptr && !literal_named(name) && defaulted(name)) inherit(name);
    }
  }
  for (auto const& [k, v] : extra) {
    bool const given = std::any_of(f.env.begin(), f.env.end(), [&](std::string const& e) {
      return e == k || e.starts_with(k + "=");
    });
    if (!given && defaulted(k)) literals.emplace_back(k, v);
  }
  for (auto const& e : f.env) {
    if (e.find('=') == std::string::npos) inherit(e);
  }
  for (auto const& [k, v] : literals) {
    if (seen.count(k) != 0) continue;
    seen[k] = true;
    env.push_back(json::object{{"name", k}, {"value", v}});
  }
  return env;
}

// Where and what a container run executes: paths are the container's, so nothing is resolved
// against this host (the executable must be absolute; the workspace defaults to "/").
Result<std::string> container_executable(std::string const& name) {
  if (!name.starts_with('/')) {
    return Error{
        Errc::plan_invalid_executable,
        name + ": inside a container give the executable's absolute path (e.g. /bin/" + name + ")"};
  }
  return name;
}

Result<json::object> build_params(RunFlags const& f, std::optional<winsize> ws) {
  json::object params;
  bool const contained = f.in_container();
  if (f.ungated && !contained) {
    return Error{Errc::plan_invalid_backend, "--ungated applies to --docker and --podman only"};
  }
  auto const exe = CUSTOS_TRY(contained ? container_executable(f.command.front())
                                        : resolve_executable(f.command.front()));
  fs::path const here = contained ? fs::path{"/"} : fs::current_path();
  fs::path const workspace =
      (f.workspace.empty() ? here : fs::absolute(f.workspace)).lexically_normal();
  fs::path cwd = f.cwd.empty() ? workspace : fs::absolute(f.cwd).lexically_normal();
  if (!contained && f.cwd.empty()) cwd = here;
  std::string rel = cwd.lexically_relative(workspace).native();
  if (rel.empty()) rel = ".";
  std::string ws_root = workspace.native();
  if (ws_root.size() > 1 && ws_root.back() == '/') ws_root.pop_back();

  std::string const run = "run-" + random_hex(16);
  json::object identity{
      {"project_id", f.project_id},
      {"session_id", f.session.empty() ? "cli-" + std::to_string(::getuid()) : f.session},
      {"run_id", run},
      {"attempt_id", "a1"},
      {"turn_id", "t1"},
      {"action_id", "act-" + random_hex(16)},
      {"process_id", "proc-1"},
      {"workspace_id", f.workspace_id},
      {"resource_id", f.resource_id},
      {"environment_id", f.environment_id},
      {"generation", f.generation},
      {"revision", 0}};

  json::array argv;
  for (auto const& a : f.command) argv.emplace_back(a);
  auto sandbox = CUSTOS_TRY(build_sandbox(f.sandbox, ws_root, f.read_only));
  // The build profile's temporary files go to the workspace, the one place it may write.
  std::vector<std::pair<std::string, std::string>> extra;
  if (!f.sandbox.profile.empty()) extra.emplace_back("TMPDIR", ws_root);
  json::array env = plan_env(f, sandbox, extra);

  json::object io{{"mode", f.pty ? "pty" : "pipes"}};
  if (f.pty) {
    io["rows"] = ws && ws->ws_row > 0 ? ws->ws_row : 24;
    io["cols"] = ws && ws->ws_col > 0 ? ws->ws_col : 80;
    io["resize"] = true;
  }
  json::object plan{{"command", json::object{{"executable", exe}, {"argv", std::move(argv)}}},
                    {"workspace", json::object{{"root", ws_root},
                                               {"access", f.read_only ? "read_only" : "writable"}}},
                    {"cwd", rel},
                    {"env", std::move(env)},
                    {"io", std::move(io)}};
  if (contained) {
    bool const docker = !f.docker.empty();
    json::object backend{{"kind", docker ? "docker" : "podman"},
                         {"container", docker ? f.docker : f.podman}};
    std::string const& socket = docker ? f.docker_socket : f.podman_socket;
    if (!socket.empty()) backend["socket"] = fs::absolute(socket).lexically_normal().native();
    if (f.ungated) backend["gate"] = "optional";
    plan["backend"] = std::move(backend);
  }
  if (sandbox) plan["sandbox"] = std::move(*sandbox);
  if (f.grace_s) {
    plan["escalation"] =
        json::object{{"grace_ms", static_cast<std::uint64_t>(std::max(0.0, *f.grace_s) * 1000.0)}};
  }
  if (f.timeout_s > 0) {
    auto const ms = static_cast<std::uint64_t>(f.timeout_s * 1000.0);
    plan["limits"] = json::object{{"wall_ms", ms == 0 ? 1 : ms}};
  }
  params["identity"] = std::move(identity);
  params["plan"] = std::move(plan);
  params["authority"] =
      json::object{{"epoch", 0},
                   {"grant_id", f.grant.empty() ? json::value(nullptr) : json::value(f.grant)},
                   {"lease_id", f.lease.empty() ? json::value(nullptr) : json::value(f.lease)}};
  return params;
}

// Puts the terminal in raw mode and restores it on every way out of run (destructor).
class RawTerminal {
 public:
  RawTerminal() = default;
  RawTerminal(RawTerminal const&) = delete;
  RawTerminal& operator=(RawTerminal const&) = delete;
  ~RawTerminal() { restore(); }
  bool enter(int fd) {
    if (::isatty(fd) == 0 || ::tcgetattr(fd, &saved_) != 0) return false;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    if (::tcsetattr(fd, TCSANOW, &raw) != 0) return false;
    fd_ = fd;
    return true;
  }
  void restore() {
    if (fd_ >= 0) (void)::tcsetattr(fd_, TCSAFLUSH, &saved_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  termios saved_{};
};

// Blocks the signals we handle and reads them from a signalfd; restores the mask on exit.
class SignalFd {
 public:
  SignalFd() {
    sigemptyset(&set_);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH}) sigaddset(&set_, s);
    (void)::sigprocmask(SIG_BLOCK, &set_, &old_);
    fd_.reset(::signalfd(-1, &set_, SFD_CLOEXEC | SFD_NONBLOCK));
  }
  SignalFd(SignalFd const&) = delete;
  SignalFd& operator=(SignalFd const&) = delete;
  ~SignalFd() { (void)::sigprocmask(SIG_SETMASK, &old_, nullptr); }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  int read_one() {
    signalfd_siginfo si{};
    if (::read(fd_.get(), &si, sizeof si) != static_cast<ssize_t>(sizeof si)) return 0;
    return static_cast<int>(si.ssi_signo);
  }

 private:
  sigset_t set_{};
  sigset_t old_{};
  sys::UniqueFd fd_;
};

bool write_all(int fd, std::vector<std::uint8_t> const& data) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t const n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        (void)::poll(&p, 1, -1);
        continue;
      }
      return false;
    }
    off += static_cast<std::size_t>(n);
  }
  return true;
}

class Runner {
 public:
  Runner(Globals& g, RunFlags const& f) : g_(g), f_(f), progress_(f.progress) {}

  int run() {
    std::optional<winsize> ws;
    winsize w{};
    if (::ioctl(STDIN_FILENO, TIOCGWINSZ, &w) == 0) ws = w;
    auto params = build_params(f_, ws);
    if (!params) return report(params.error());
    auto client = connect_daemon(g_);
    if (!client) return report(client.error());
    client_.emplace(std::move(*client));
    if (!f_.grant.empty()) {
      // A grant is checked against the current authority epoch: read it right before starting.
      auto list = client_->call("authority.list", {{"grant_id", f_.grant}});
      if (!list) return report(list.error());
      if (list->is_object()) {
        if (auto const* e = list->get_object().if_contains("epoch");
            e != nullptr && e->is_number()) {
          (*params)["authority"].as_object()["epoch"] = e->to_number<std::uint64_t>();
        }
      }
    }

    if (f_.check) return check(std::move(*params));

    // Events may be dropped for a slow reader, but never the terminal one (slow-subscriber
    // policy, docs/api.md), and dropped output is read back from the spool by offset: the
    // stream alone carries the run to its end, no exec.wait is needed.
    (*params)["subscribe"] = true;
    auto started = client_->call("exec.start", std::move(*params));
    if (!started) return report(started.error());
    if (!started->is_object()) return report(Error{Errc::internal, "exec.start: not an object"});
    id_ = str_field(started->get_object(), "execution_id");
    if (auto const* sub = started->get_object().if_contains("subscription");
        sub == nullptr || !sub->is_string()) {
      // The daemon could not attach the events to the answer (docs/api.md): the run goes on,
      // and its events are asked for separately.
      auto again = client_->call("exec.subscribe", {{"execution_id", id_}, {"from_seq", 1}});
      if (!again) return report(again.error());
    }

    if (f_.pty) raw_.enter(STDIN_FILENO);
    return loop();
  }

 private:
  // Our stdin on its way to the execution: at most one exec.input in flight.
  struct InputState {
    bool stdin_open = true;
    std::optional<std::uint64_t> inflight;  // the request id of the exec.input in flight
    std::vector<std::uint8_t> pending;      // read from stdin, not yet accepted
    bool eof_pending = false;
  };

  int loop() {
    InputState input;
    std::optional<json::value> terminal;

    for (;;) {
      // Send stdin that is ready, one exec.input in flight at a time (the daemon may accept
      // fewer bytes than offered; the rest is offered again).
      if (!input.inflight && (!input.pending.empty() || input.eof_pending)) {
        json::object p{{"execution_id", id_}};
        if (!input.pending.empty()) p["data_b64"] = core::base64_encode(input.pending);
        if (input.eof_pending) p["eof"] = true;
        auto sent = client_->send("exec.input", std::move(p));
        if (!sent) return finish_error(sent.error());
        input.inflight = *sent;
        inflight_len_ = input.pending.size();
        inflight_eof_ = input.eof_pending;
      }

      pollfd fds[3] = {
          {client_->fd(), POLLIN, 0}, {signals_.fd(), POLLIN, 0}, {STDIN_FILENO, 0, 0}};
      bool const want_stdin = input.stdin_open && input.pending.empty() && !input.eof_pending;
      if (want_stdin) fds[2].events = POLLIN;
      auto const now = ProgressLine::Clock::now();
      if (!terminal && progress_.sample_due(now)) {
        if (auto sent = client_->send("exec.get", {{"execution_id", id_}})) {
          progress_.sample_sent(*sent, now);
        }
      }
      progress_.tick(now, out_bytes());
      int timeout = progress_.wait_ms(now);
      if (terminal) timeout = 200;
      if (!client_->has_queued()) {
        int const r = ::poll(fds, want_stdin ? 3 : 2, timeout);
        if (r < 0 && errno != EINTR) return finish_error(Error{Errc::sys_error, "poll", errno});
        if (r == 0 && terminal) break;  // terminal seen and the stream went quiet
      }

      if ((fds[1].revents & POLLIN) != 0) on_signal();

      if (want_stdin && (fds[2].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        std::uint8_t buf[65536];
        ssize_t const n = ::read(STDIN_FILENO, buf, sizeof buf);
        if (n > 0) {
          input.pending.assign(buf, buf + n);
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          input.stdin_open = false;
          input.eof_pending = true;
        }
      }

      if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0 || client_->has_queued()) {
        auto msg = client_->next(0);
        if (!msg) {
          if (terminal) break;
          return finish_error(msg.error());
        }
        if (!*msg) continue;
        auto& m = **msg;
        if (auto const* method = m.if_contains("method"); method != nullptr) {
          auto* params = m.if_contains("params");
          if (method->is_string() && method->get_string() == "exec.event" && params != nullptr &&
              params->is_object()) {
            if (on_event(params->get_object(), terminal)) break;
          }
          continue;
        }
        auto const* idv = m.if_contains("id");
        std::uint64_t rid = 0;
        if (idv != nullptr && idv->is_int64()) rid = static_cast<std::uint64_t>(idv->get_int64());
        if (input.inflight && rid == *input.inflight) on_input_answer(m, input);
        (void)progress_.on_answer(rid, m);
      }
    }
    progress_.hide();
    raw_.restore();
    if (!terminal) return finish_error(Error{Errc::internal, "no terminal result"});
    if (g_.json) fmt::print("{}\n", json::serialize(*terminal));
    return exit_code_for(*terminal);
  }

  // A signal to the CLI: SIGWINCH resizes the pty; any other asks for a cancel, and a second one
  // forces it (the rest of the grace is skipped: the tree is killed now).
  void on_signal() {
    int const sig = signals_.read_one();
    if (sig == SIGWINCH && f_.pty) {
      winsize w{};
      if (::ioctl(STDIN_FILENO, TIOCGWINSZ, &w) == 0) {
        (void)client_->send("exec.resize",
                            {{"execution_id", id_}, {"rows", w.ws_row}, {"cols", w.ws_col}});
      }
    } else if (sig != 0 && sig != SIGWINCH && cancels_ < 2) {
      ++cancels_;
      json::object p{{"execution_id", id_},
                     {"reason", "custos run: signal " + std::to_string(sig)}};
      if (cancels_ == 2) p["force"] = true;
      (void)client_->send("exec.cancel", std::move(p));
      if (::isatty(STDERR_FILENO) == 1) {
        progress_.hide();
        fmt::print(
            stderr, "{}\n",
            cancels_ == 1 ? "custos: cancelling (again to kill now)" : "custos: killing now");
      }
    }
  }

  // The answer to the exec.input in flight: what was accepted leaves the pending bytes (the
  // rest is offered again); an error stops the forwarding.
  void on_input_answer(json::object const& m, InputState& in) {
    in.inflight.reset();
    if (auto const* err = m.if_contains("error"); err != nullptr) {
      // The child closed its stdin or the input limit was reached: stop forwarding.
      in.stdin_open = false;
      in.pending.clear();
      in.eof_pending = false;
      return;
    }
    std::uint64_t accepted = 0;
    if (auto const* res = m.if_contains("result"); res != nullptr && res->is_object()) {
      if (auto const* a = res->get_object().if_contains("accepted_bytes");
          a != nullptr && a->is_number()) {
        accepted = a->to_number<std::uint64_t>();
      }
    }
    if (accepted >= inflight_len_) {
      in.pending.clear();
      if (inflight_eof_) in.eof_pending = false;
    } else {
      in.pending.erase(in.pending.begin(),
                       in.pending.begin() + static_cast<std::ptrdiff_t>(accepted));
      // The daemon's queue is full: give the child a moment to read.
      ::usleep(10000);
    }
  }

  // Writes the stream's bytes from what we have written so far up to `upto` (or to the end of
  // the spool when nullopt), read with exec.output. Covers events the daemon dropped because we
  // were slow (docs/api.md) and output beyond the plan's event budget.
  void fill_from_spool(std::string const& stream, std::optional<std::uint64_t> upto) {
    auto& done = written_[stream];
    int const fd = stream == "stderr" ? STDERR_FILENO : STDOUT_FILENO;
    while (!upto || done < *upto) {
      std::uint64_t want = 1U << 20U;
      if (upto) want = std::min<std::uint64_t>(want, *upto - done);
      auto r = client_->call(
          "exec.output",
          {{"execution_id", id_}, {"stream", stream}, {"offset", done}, {"max_bytes", want}});
      if (!r || !r->is_object()) return;
      auto data = core::base64_decode(str_field(r->get_object(), "data_b64"));
      if (!data || data->empty()) return;
      progress_.hide();
      (void)write_all(fd, *data);
      done += data->size();
    }
  }

  // After the terminal event: the bytes its events did not carry (dropped for a slow reader,
  // beyond the plan's event budget, evicted before the start was answered) are read from the
  // spool. A stream whose observed count (the terminal record's accounting) we have written in
  // full needs no call, so an ordinary run costs its one request.
  void drain_spools(json::value const& terminal) {
    static constexpr std::array<char const*, 1> kPty{"pty"};
    static constexpr std::array<char const*, 2> kPipes{"stdout", "stderr"};
    std::span<char const* const> const streams =
        f_.pty ? std::span<char const* const>{kPty} : std::span<char const* const>{kPipes};
    for (char const* stream : streams) {
      if (auto observed = observed_bytes(terminal, stream);
          observed && written_[stream] >= *observed)
        continue;
      fill_from_spool(stream, std::nullopt);
    }
  }

  static std::optional<std::uint64_t> observed_bytes(json::value const& terminal,
                                                     std::string const& stream) {
    if (!terminal.is_object()) return std::nullopt;
    auto const* output = terminal.get_object().if_contains("output");
    if (output == nullptr || !output->is_object()) return std::nullopt;
    auto const* acc = output->get_object().if_contains(stream);
    if (acc == nullptr || !acc->is_object()) return std::nullopt;
    auto const* n = acc->get_object().if_contains("observed");
    if (n == nullptr || !n->is_number()) return std::nullopt;
    return n->to_number<std::uint64_t>();
  }

  // Returns true when the terminal event arrived (output is complete by then: events are
  // delivered in seq order and terminal is the last; anything dropped is read from the spool).
  bool on_event(json::object const& ev, std::optional<json::value>& terminal) {
    std::string const kind = str_field(ev, "kind");
    if (kind == "output") {
      auto data = core::base64_decode(str_field(ev, "data_b64"));
      if (!data) return false;
      std::string const stream = str_field(ev, "stream");
      auto& done = written_[stream];
      std::uint64_t offset = done;
      if (auto const* o = ev.if_contains("offset"); o != nullptr && o->is_number()) {
        offset = o->to_number<std::uint64_t>();
      }
      if (offset > done) fill_from_spool(stream, offset);
      if (offset + data->size() <= done) return false;  // already written (replay overlap)
      auto const skip = static_cast<std::ptrdiff_t>(done > offset ? done - offset : 0);
      std::vector<std::uint8_t> const rest(data->begin() + skip, data->end());
      progress_.hide();
      (void)write_all(stream == "stderr" ? STDERR_FILENO : STDOUT_FILENO, rest);
      done = offset + data->size();
      return false;
    }
    if (kind == "terminal") {
      if (auto const* t = ev.if_contains("terminal"); t != nullptr)
        terminal = *t;
      else
        terminal = json::value(ev);
      if (!terminal->is_object() || !terminal->get_object().contains("classification")) {
        // An event without the record: ask for it.
        auto r = client_->call("exec.wait", {{"execution_id", id_}});
        if (r) terminal = *r;
      }
      drain_spools(*terminal);
      return true;
    }
    return false;
  }

  // --check: what exec.start would decide, started nothing. Prints the daemon's answer (the plan
  // and sandbox digests, the checked sandbox plan, the admission); exit 0 when admitted, else
  // 65 with every missing control.
  int check(json::object params) {
    auto answer = client_->call("exec.check", std::move(params));
    if (!answer) return report(answer.error());
    fmt::print("{}\n", g_.json ? json::serialize(*answer) : pretty(*answer));
    auto const* a = answer->is_object() ? answer->get_object().if_contains("admission") : nullptr;
    if (a == nullptr || !a->is_object()) return kExitInternal;
    auto const* admitted = a->get_object().if_contains("admitted");
    if (admitted != nullptr && admitted->is_bool() && admitted->get_bool()) return kExitOk;
    if (auto const* m = a->get_object().if_contains("missing"); m != nullptr && m->is_array()) {
      for (auto const& c : m->get_array()) {
        if (c.is_string()) fmt::print(stderr, "  missing control: {}\n", c.get_string());
      }
    }
    fmt::print(stderr, "custos: not admitted: the backend cannot enforce this plan here\n");
    return kExitRefused;
  }

  [[nodiscard]] std::uint64_t out_bytes() const {
    std::uint64_t n = 0;
    for (auto const& [stream, bytes] : written_) n += bytes;
    return n;
  }

  int finish_error(Error const& e) {
    progress_.hide();
    raw_.restore();
    return report(e);
  }

  Globals& g_;
  RunFlags const& f_;
  std::optional<RpcClient> client_;
  std::string id_;
  RawTerminal raw_;
  SignalFd signals_;
  std::map<std::string, std::uint64_t> written_;  // bytes written per stream
  ProgressLine progress_;
  int cancels_ = 0;  // exec.cancel requests sent: the second one forces
  std::size_t inflight_len_ = 0;
  bool inflight_eof_ = false;
};

}  // namespace

void add_run(CLI::App& app, Globals& g) {
  auto flags = std::make_shared<RunFlags>();
  auto* sub =
      app.add_subcommand("run", "Run one command as an owned execution and stream its output");
  sub->add_option("command", flags->command, "EXE ARG... (after --)")->required();
  sub->add_option("--cwd", flags->cwd, "Working directory (inside the workspace; default: here)");
  sub->add_option("--workspace", flags->workspace, "Workspace root (default: current directory)");
  // One value per --env, so that "--env NAME -- cmd -c" does not end the list at "--".
  sub->add_option("--env", flags->env,
                  "NAME (inherit the daemon's value) or NAME=VALUE (literal); repeatable")
      ->allow_extra_args(false);
  sub->add_option("--timeout", flags->timeout_s, "Wall-clock limit in seconds (exit 124 when hit)");
  sub->add_option("--grace", flags->grace_s,
                  "Seconds a cancel waits after the graceful signal before killing the tree "
                  "(default 2; a second Ctrl-C kills at once)")
      ->check(CLI::Range(0.0, 3600.0));
  sub->add_flag("--pty", flags->pty, "Run in a pseudo-terminal; local terminal goes raw");
  sub->add_flag("--progress", flags->progress,
                "On a terminal, a live status line on stderr: elapsed, bytes out, processes");
  sub->add_flag("--clean-env", flags->clean_env,
                "Do not inherit PATH HOME USER LOGNAME LANG TERM by default");
  sub->add_flag("--read-only", flags->read_only,
                "Declare the workspace read_only in the plan (default writable)");
  sub->add_option("--grant", flags->grant,
                  "Run under this grant (default: none, the admin's implicit authority)");
  sub->add_option("--lease", flags->lease,
                  "The workspace's mutation lease (writable workspaces someone leased)");
  sub->add_option("--session", flags->session, "Session id (default: cli-<uid>)");
  sub->add_option("--project-id", flags->project_id, "Identity: project id")->capture_default_str();
  sub->add_option("--workspace-id", flags->workspace_id, "Identity: workspace id")
      ->capture_default_str();
  sub->add_option("--resource-id", flags->resource_id, "Identity: resource id")
      ->capture_default_str();
  sub->add_option("--environment-id", flags->environment_id, "Identity: environment id")
      ->capture_default_str();
  sub->add_option("--generation", flags->generation, "Identity: holder generation")
      ->capture_default_str();
  auto* docker = sub->add_option("--docker", flags->docker,
                                 "Run inside this running Docker container (name or id); paths "
                                 "are the container's");
  auto* podman = sub->add_option("--podman", flags->podman,
                                 "Run inside this running Podman container (name or id)");
  docker->excludes(podman);
  sub->add_option("--docker-socket", flags->docker_socket,
                  "Docker API socket (default: the daemon's)")
      ->needs(docker);
  sub->add_option("--podman-socket", flags->podman_socket,
                  "Podman API socket (default: the daemon's)")
      ->needs(podman);
  sub->add_flag("--ungated", flags->ungated,
                "Accept the marker boundary where the container cannot run the exec gate (an "
                "image without /bin/sh): the plan's backend gets \"gate\": \"optional\"");
  sub->add_option("--sandbox", flags->sandbox.file,
                  "Run sandboxed: FILE.json holds the plan's sandbox object (docs/sandbox.md); "
                  "with --sandbox-profile, each of its members replaces the profile's");
  sub->add_option("--sandbox-profile", flags->sandbox.profile,
                  "Run sandboxed under a built-in profile: build (system dirs read+execute, "
                  "the workspace writable, no network; docs/sandbox.md)")
      ->check(CLI::IsMember(sandbox_profiles()));
  sub->add_flag("--check", flags->check,
                "Start nothing: print what the daemon decides for this plan (exec.check: "
                "digests, the checked sandbox, admission); exit 0 when admitted");
  sub->callback([&g, flags] {
    Runner runner{g, *flags};
    g.exit_code = runner.run();
  });
}

}  // namespace custos::cli
