// custos secret set|list|delete: the daemon's secret store (secret.* methods, admins only).
//
// `set NAME` takes the value from stdin. Piped or redirected, the value is exactly the bytes
// read up to end of file (a trailing newline included: `printf %s` or `echo -n` when it is not
// wanted). From a terminal, it prompts on stderr with echo off and takes one line, without the
// newline that Enter adds. At most secrets::kMaxSecretValueBytes; more is refused before
// anything is sent. The buffers the value is read and encoded into are zeroed once the call
// is done (the JSON request built from them is not).
#include <fmt/core.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <termios.h>
#include <unistd.h>

#include "custos/core/base64.hpp"
#include "custos/secrets/store.hpp"

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace json = boost::json;

namespace {

// A string whose bytes are zeroed when it dies. Reserved once at its bound, so it never
// reallocates and leaves no stale copy behind.
struct WipedString {
  std::string s;
  WipedString() = default;
  WipedString(WipedString const&) = delete;
  WipedString& operator=(WipedString const&) = delete;
  ~WipedString() { secrets::wipe_bytes(s.data(), s.size()); }
};

// Echo off on the terminal for as long as it lives.
class NoEcho {
 public:
  explicit NoEcho(int fd) : fd_(fd) {
    if (::tcgetattr(fd_, &saved_) != 0) return;
    termios quiet = saved_;
    quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    active_ = ::tcsetattr(fd_, TCSAFLUSH, &quiet) == 0;
  }
  ~NoEcho() {
    if (active_) static_cast<void>(::tcsetattr(fd_, TCSAFLUSH, &saved_));
  }
  NoEcho(NoEcho const&) = delete;
  NoEcho& operator=(NoEcho const&) = delete;

 private:
  int fd_;
  termios saved_{};
  bool active_ = false;
};

// Reads stdin into `out` (see the file comment). Refuses more than the store's bound.
Result<void> read_value(std::string const& name, std::string& out) {
  constexpr std::size_t kMax = secrets::kMaxSecretValueBytes;
  out.reserve(kMax + 1);
  bool const tty = ::isatty(STDIN_FILENO) == 1;
  std::unique_ptr<NoEcho> quiet;
  if (tty) {
    fmt::print(stderr, "secret {}: ", name);
    static_cast<void>(std::fflush(stderr));
    quiet = std::make_unique<NoEcho>(STDIN_FILENO);
  }
  char buf[4096];
  for (;;) {
    ssize_t const n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error{Errc::sys_error, "read stdin", errno};
    if (n == 0) break;
    auto const room = kMax + 1 - out.size();
    out.append(buf, std::min(static_cast<std::size_t>(n), room));
    if (out.size() > kMax) break;
    if (tty && out.back() == '\n') break;
  }
  secrets::wipe_bytes(buf, sizeof buf);
  if (tty) {
    quiet.reset();
    fmt::print(stderr, "\n");
    if (!out.empty() && out.back() == '\n') out.pop_back();
  }
  if (out.size() > kMax) {
    return Error{Errc::secret_too_large,
                 "secret " + name + ": more than " + std::to_string(kMax) + " bytes on stdin"};
  }
  return ok();
}

std::string local_time(std::int64_t ns) {
  std::time_t const t = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  if (::localtime_r(&t, &tm) == nullptr) return "-";
  char out[32];
  return std::strftime(out, sizeof out, "%Y-%m-%d %H:%M:%S", &tm) > 0 ? out : "-";
}

}  // namespace

void add_secret(CLI::App& app, Globals& g) {
  auto* secret = app.add_subcommand("secret", "The daemon's secret store (admins)");
  secret->require_subcommand(1);

  auto set_name = std::make_shared<std::string>();
  auto* set = secret->add_subcommand(
      "set",
      "Store a secret; the value is read from stdin (exactly its bytes; one line without "
      "echo from a terminal)");
  set->add_option("name", *set_name, "Secret name: [A-Za-z0-9_.-], first alphanumeric")->required();
  set->callback([&g, set_name] {
    WipedString value;
    if (auto r = read_value(*set_name, value.s); !r) {
      g.exit_code = report(r.error());
      return;
    }
    WipedString b64;
    b64.s = core::base64_encode(value.s);
    json::object params{{"name", *set_name}, {"value_b64", b64.s}};
    call_and_print(g, "secret.set", std::move(params), [&](json::object const& r) {
      fmt::print("secret {} set ({} bytes)\n", str_field(r, "name"), value.s.size());
    });
  });

  auto* list = secret->add_subcommand("list", "List the secrets' names (never their values)");
  list->callback([&g] {
    call_and_print(g, "secret.list", {}, [](json::object const& r) {
      fmt::print("{:<40} {:<12} {}\n", "NAME", "SOURCE", "SET");
      auto const* a = r.if_contains("secrets");
      if (a == nullptr || !a->is_array()) return;
      for (auto const& item : a->get_array()) {
        if (!item.is_object()) continue;
        auto const& e = item.get_object();
        auto const* ns = e.if_contains("created_ns");
        fmt::print("{:<40} {:<12} {}\n", str_field(e, "name"), str_field(e, "source"),
                   ns != nullptr && ns->is_int64() ? local_time(ns->get_int64()) : "-");
      }
    });
  });

  auto delete_name = std::make_shared<std::string>();
  auto* del = secret->add_subcommand("delete", "Delete a secret from the store");
  del->add_option("name", *delete_name, "Secret name")->required();
  del->callback([&g, delete_name] {
    call_and_print(g, "secret.delete", {{"name", *delete_name}}, [](json::object const& r) {
      fmt::print("secret {} deleted\n", str_field(r, "name"));
    });
  });
}

}  // namespace custos::cli
