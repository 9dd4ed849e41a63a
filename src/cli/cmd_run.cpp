// custos run: one command as an owned execution, streamed live.
//
// Builds the plan from the flags, then one request for the whole run: exec.start with
// `subscribe: true`, whose answer is followed on the same connection by every exec.event of the
// execution from seq 1, terminal last (docs/api.md). Then one poll loop over the daemon socket,
// our stdin and a signalfd: output events go to our stdout/stderr, stdin goes
// to exec.input (EOF included), SIGWINCH becomes exec.resize (--pty), SIGINT/SIGTERM/SIGHUP
// become exec.cancel (in --pty mode Ctrl-C is a byte for the child's terminal instead, as it
// would be in any terminal). The exit code is the child's (docs/cli.md).
//
// When the daemon closes the connection (a handover closes every one, docs/api.md "After a
// restart") the run goes on: we connect again (retried for up to kReconnectBudget), subscribe
// from the seq after the last one seen (events up to it are skipped if they come again; a
// `replay_from` past that seq is a gap and is said on stderr) and ask exec.get whether the
// execution is already terminal, in which case exec.wait gives the result. A terminal event
// whose seq we had already passed belongs to an event log that started again (a new image that
// does not continue the numbering): its result is also taken from exec.wait. Output is written
// by stream offset, so no byte is written twice and what no event brought is read from the spool.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <fcntl.h>
#include <map>
#include <optional>
#include <poll.h>
#include <signal.h>
#include <span>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include "custos/core/base64.hpp"
#include "custos/rpc/protocol.hpp"
#include "custos/sys/unique_fd.hpp"

#include "common.hpp"
#include "exit_codes.hpp"
#include "run_plan.hpp"
#include "run_progress.hpp"

namespace custos::cli {

namespace json = boost::json;

namespace {

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
    InputState& input = input_;
    std::optional<json::value> terminal;

    for (;;) {
      if (resubscribe_) {
        auto ended = resubscribe();
        if (!ended) return finish_error(ended.error());
        if (*ended) {
          terminal = std::move(**ended);
          drain_spools(*terminal);
          break;
        }
      }
      if (auto sent = send_input(); !sent) return finish_error(sent.error());

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
          if (!connection_lost(msg.error())) return finish_error(msg.error());
          if (auto again = reconnect(); !again) return finish_error(again.error());
          continue;
        }
        if (!*msg) continue;
        auto ended = on_message(**msg, terminal);
        if (!ended) return finish_error(ended.error());
        if (*ended) break;
      }
    }
    progress_.hide();
    raw_.restore();
    if (!terminal) return finish_error(Error{Errc::internal, "no terminal result"});
    if (g_.json) fmt::print("{}\n", json::serialize(*terminal));
    return exit_code_for(*terminal);
  }

  // Sends stdin that is ready, one exec.input in flight at a time (the daemon may accept fewer
  // bytes than offered; the rest is offered again).
  Result<void> send_input() {
    auto& input = input_;
    if (input.inflight || (input.pending.empty() && !input.eof_pending)) return ok();
    json::object p{{"execution_id", id_}};
    if (!input.pending.empty()) p["data_b64"] = core::base64_encode(input.pending);
    if (input.eof_pending) p["eof"] = true;
    auto sent = client_->send("exec.input", std::move(p));
    // A lost connection shows at the next read of the socket; then it is offered again.
    if (!sent && !connection_lost(sent.error())) return sent.error();
    if (sent) input.inflight = *sent;
    inflight_len_ = input.pending.size();
    inflight_eof_ = input.eof_pending;
    return ok();
  }

  // One message from the daemon: an event of the execution, or the answer to exec.input or to
  // the progress line's exec.get. True when the run has its terminal result.
  Result<bool> on_message(json::object const& m, std::optional<json::value>& terminal) {
    if (auto const* method = m.if_contains("method"); method != nullptr) {
      auto const* params = m.if_contains("params");
      if (method->is_string() && method->get_string() == "exec.event" && params != nullptr &&
          params->is_object()) {
        return on_sequenced_event(params->get_object(), terminal);
      }
      return false;
    }
    auto const* idv = m.if_contains("id");
    std::uint64_t rid = 0;
    if (idv != nullptr && idv->is_int64()) rid = static_cast<std::uint64_t>(idv->get_int64());
    if (input_.inflight && rid == *input_.inflight) on_input_answer(m, input_);
    (void)progress_.on_answer(rid, m);
    return false;
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
      cancel_ = p;  // sent again after a reconnect: the answer may have been lost with it
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
      auto r = call_reconnecting(
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
        auto r = call_reconnecting("exec.wait", {{"execution_id", id_}});
        if (r) terminal = *r;
      }
      drain_spools(*terminal);
      return true;
    }
    return false;
  }

  // An exec.event in seq order: one whose seq we have passed came again after a reconnect and is
  // skipped, except a terminal one, which means the event log started again (today's handover:
  // the new image numbers an adopted execution's events from 1): its result comes from
  // exec.wait. True when the run has its terminal result.
  Result<bool> on_sequenced_event(json::object const& ev, std::optional<json::value>& terminal) {
    std::uint64_t seq = 0;
    if (auto const* s = ev.if_contains("seq"); s != nullptr && s->is_number())
      seq = s->to_number<std::uint64_t>();
    bool const old = seq != 0 && seq <= last_seq_;
    if (str_field(ev, "kind") == "terminal" && old) {
      auto r = CUSTOS_TRY(call_reconnecting("exec.wait", {{"execution_id", id_}}));
      terminal = std::move(r);
      drain_spools(*terminal);
      return true;
    }
    if (old) return false;
    last_seq_ = std::max(last_seq_, seq);
    return on_event(ev, terminal);
  }

  // A new connection to the daemon after the old one was lost; what the old one had received
  // and not handed out is kept. The execution's events are asked for again at the top of the
  // loop (resubscribe). Requests in flight on the old connection are forgotten: exec.input's is
  // offered again (it may have reached the daemon: a chunk in flight at a handover can arrive
  // twice), the progress sample is asked for again, a cancel is sent again.
  Result<void> reconnect() {
    auto fresh = CUSTOS_TRY(reconnect_daemon(g_));
    fresh.take_notifications(*client_);
    client_.emplace(std::move(fresh));
    input_.inflight.reset();
    progress_.forget_sample();
    resubscribe_ = true;
    return ok();
  }

  // A call that survives the daemon closing the connection: made again on a new one (the calls
  // used here — exec.output, exec.wait, exec.get, exec.subscribe — can be repeated).
  Result<json::value> call_reconnecting(std::string_view method, json::object const& params) {
    for (;;) {
      auto r = client_->call(method, params);
      if (r || !connection_lost(r.error())) return r;
      CUSTOS_TRYV(reconnect());
    }
  }

  // After a reconnect: subscribes from the seq after the last one seen and says so on stderr
  // when the daemon cannot replay from there (a gap: the events between were not kept). Then,
  // if the execution is already terminal (it ended while we were away, or its event log
  // started again below our seq), its result from exec.wait.
  Result<std::optional<json::value>> resubscribe() {
    while (resubscribe_) {
      resubscribe_ = false;
      std::uint64_t const from = last_seq_ + 1;
      auto sub = call_reconnecting("exec.subscribe", {{"execution_id", id_}, {"from_seq", from}});
      if (!sub && sub.error().code != Errc::exec_not_found) return sub.error();
      if (resubscribe_) continue;  // lost again meanwhile
      if (sub && sub->is_object()) {
        if (auto const* rf = sub->get_object().if_contains("replay_from");
            rf != nullptr && rf->is_number() && rf->to_number<std::uint64_t>() > from) {
          progress_.hide();
          fmt::print(stderr,
                     "custos: reconnected; events {}..{} of {} were not kept by the daemon (a "
                     "gap; output is read back from the spool)\n",
                     from, rf->to_number<std::uint64_t>() - 1, id_);
        }
      }
      auto rec = CUSTOS_TRY(call_reconnecting("exec.get", {{"execution_id", id_}}));
      if (resubscribe_) continue;
      auto const* t = rec.is_object() ? rec.get_object().if_contains("terminal") : nullptr;
      if (!sub || (t != nullptr && t->is_object())) {
        auto waited = CUSTOS_TRY(call_reconnecting("exec.wait", {{"execution_id", id_}}));
        return std::optional<json::value>{std::move(waited)};
      }
      if (cancel_) (void)client_->send("exec.cancel", *cancel_);
    }
    return std::optional<json::value>{};
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
  int cancels_ = 0;                     // exec.cancel requests sent: the second one forces
  std::optional<json::object> cancel_;  // the last exec.cancel sent
  InputState input_;
  std::uint64_t last_seq_ = 0;  // the highest event seq handled
  bool resubscribe_ = false;    // reconnected: the execution's events are to be asked for again
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
  sub->footer(reconnect_help());
  sub->callback([&g, flags] {
    Runner runner{g, *flags};
    g.exit_code = runner.run();
  });
}

}  // namespace custos::cli
