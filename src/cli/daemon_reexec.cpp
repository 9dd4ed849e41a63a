// `custos daemon --reexec`: asks the running daemon to hand over to a new image of itself
// (SIGHUP, docs/operations.md "Handover") and waits until the new image serves.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "custos/cli/client.hpp"
#include "custos/sys/pidfd.hpp"

#include "commands.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

struct Serving {
  std::int64_t pid = 0;
  std::int64_t started_ns = 0;
  std::int64_t handovers = 0;
  bool fallback = false;
  std::int64_t refused_ns = 0;  // the daemon's last refused handover, 0: none
  std::string refused_reason;
};

Result<Serving> serving(RpcClient& client) {
  auto info = CUSTOS_TRY(client.call("host.info", {}));
  Serving s;
  auto const* o = info.if_object();
  if (o == nullptr) return Error{Errc::rpc_invalid_request, "host.info answered no object"};
  if (auto const* p = o->if_contains("pid"); p != nullptr && p->is_int64()) s.pid = p->as_int64();
  if (auto const* t = o->if_contains("started_ns"); t != nullptr && t->is_int64()) {
    s.started_ns = t->as_int64();
  }
  if (auto const* h = o->if_contains("handover"); h != nullptr && h->is_object()) {
    auto const& ho = h->as_object();
    if (auto const* c = ho.if_contains("count"); c != nullptr && c->is_int64()) {
      s.handovers = c->as_int64();
    }
    if (auto const* f = ho.if_contains("fallback"); f != nullptr && f->is_bool()) {
      s.fallback = f->as_bool();
    }
  }
  if (auto const* r = o->if_contains("handover_refused"); r != nullptr && r->is_object()) {
    auto const& ro = r->as_object();
    if (auto const* t = ro.if_contains("at_ns"); t != nullptr && t->is_int64()) {
      s.refused_ns = t->as_int64();
    }
    if (auto const* w = ro.if_contains("reason"); w != nullptr && w->is_string()) {
      s.refused_reason = std::string{w->as_string()};
    }
  }
  if (s.pid <= 1 || s.started_ns == 0) {
    return Error{Errc::rpc_invalid_request,
                 "host.info names no daemon process this custos can hand over"};
  }
  return s;
}

}  // namespace

// NOLINTNEXTLINE(readability-function-size): find, signal, then wait for the new image
int reexec_daemon(std::string const& socket, std::chrono::milliseconds timeout) {
  auto fail = [](int code, std::string const& why) {
    (void)std::fprintf(stderr, "custos daemon --reexec: %s\n", why.c_str());
    return code;
  };
  auto client = RpcClient::connect(socket);
  if (!client) return fail(kExitUnreachable, client.error().message());
  auto before = serving(*client);
  if (!before) return fail(kExitInternal, before.error().message());
  // The pid the daemon reports names it in its own pid namespace; this connection stays open
  // while the pidfd is taken and the daemon answers again on it with the same pid and start, so
  // the pidfd names the very process that serves the socket (it cannot have exited meanwhile).
  auto pidfd = sys::Pidfd::open(static_cast<std::int32_t>(before->pid));
  if (!pidfd) return fail(kExitInternal, pidfd.error().message());
  auto again = serving(*client);
  if (!again || again->pid != before->pid || again->started_ns != before->started_ns) {
    return fail(kExitInternal, "the daemon changed while it was being identified; try again");
  }
  auto sent = pidfd->send_signal(SIGHUP);
  if (!sent || !*sent) {
    return fail(kExitInternal, sent ? "the daemon exited" : sent.error().message());
  }
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no answer yet";
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    if (!pidfd->alive()) return fail(kExitDaemonFailed, "the daemon exited during the handover");
    auto c = RpcClient::connect(socket);
    if (!c) {
      last = c.error().message();
      continue;
    }
    auto now = serving(*c);
    if (!now) {
      last = now.error().message();
      continue;
    }
    if (now->started_ns == before->started_ns) {
      if (now->refused_ns != before->refused_ns) {
        return fail(kExitRefused,
                    "the daemon refused the handover and keeps serving: " + now->refused_reason);
      }
      continue;  // the handover has not begun yet
    }
    if (now->pid != before->pid) {
      return fail(kExitDaemonFailed, "another daemon process (pid " + std::to_string(now->pid) +
                                         ") serves the socket now");
    }
    if (now->fallback) {
      return fail(kExitDaemonFailed,
                  "the new image failed to start; the previous image serves again (its log says "
                  "why)");
    }
    (void)std::printf("handed over: pid %lld serves again (handover %lld)\n",
                      static_cast<long long>(now->pid), static_cast<long long>(now->handovers));
    return kExitOk;
  }
  // A refused check leaves the old image serving with its old start: its log says why.
  return fail(kExitDaemonFailed, "no new image serves after " +
                                     std::to_string(timeout.count() / 1000) +
                                     " s (a refused handover is in the daemon's log): " + last);
}

}  // namespace custos::cli
