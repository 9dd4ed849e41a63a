// The handover's process side: the manifest, the descriptors it names and their verification,
// the pre-flight check of the new image, and the execve (handover.hpp).
#include "handover.hpp"

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <iterator>
#include <linux/close_range.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "custos/sys/pidfd.hpp"

#include "handover_carried.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX, not in a header

namespace custos::daemon::handover {

namespace json = boost::json;

namespace {

constexpr char const* kFormat = "custos-handover";
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;

Error failed(std::string what, int err = 0) {
  return Error{Errc::daemon_handover_failed, std::move(what), err};
}

// Takes over descriptor `n` a manifest names: made O_CLOEXEC, so it is not passed on to any
// child or further image unless a handover names it again. A number that is not open is none.
sys::UniqueFd take_fd(json::value const* v) {
  if (v == nullptr || !v->is_int64()) return {};
  auto const n = v->get_int64();
  if (n < 3 || n > INT32_MAX) return {};
  int const fd = static_cast<int>(n);
  if (::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return {};
  return sys::UniqueFd{fd};
}

std::string string_of(json::object const& o, char const* key) {
  auto const* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string{v->get_string()} : std::string{};
}

std::int64_t int_of(json::object const& o, char const* key) {
  auto const* v = o.if_contains(key);
  return v != nullptr && v->is_int64() ? v->get_int64() : 0;
}

json::value fd_json(sys::UniqueFd const& fd) {
  return fd.valid() ? json::value(fd.get()) : json::value(nullptr);
}

json::object manifest_of(Outgoing const& out, bool pass_old_image) {
  json::object from{{"version", out.origin.version},
                    {"started_ns", out.origin.started_ns},
                    {"count", out.origin.count},
                    {"fallback", out.origin.fallback},
                    {"reason", out.origin.reason}};
  json::object fds{
      {"listener", fd_json(out.fds.listener)},
      {"listener_from_systemd", out.fds.listener_from_systemd},
      {"socket_lock", fd_json(out.fds.socket_lock)},
      {"state_lock", fd_json(out.fds.state_lock)},
      {"old_image", pass_old_image ? fd_json(out.fds.old_image) : json::value(nullptr)},
      {"metrics_listener", fd_json(out.fds.metrics_listener)},
      {"metrics_lock", fd_json(out.fds.metrics_lock)}};
  json::array executions;
  for (auto const& c : out.executions) executions.push_back(carried_json(c));
  return json::object{
      {"format", kFormat},
      {"version", kManifestVersion},
      {"from", std::move(from)},
      {"state_dir", out.state_dir},
      {"socket_path", out.socket_path},
      {"subtree", json::object{{"path", out.subtree_path}, {"created", out.subtree_created}}},
      {"descriptors", std::move(fds)},
      {"executions", std::move(executions)}};
}

// The manifest in a sealed memfd (O_CLOEXEC: the exec clears it on this one only).
Result<sys::UniqueFd> write_manifest(json::object const& manifest) {
  std::string const text = json::serialize(manifest);
  if (text.size() > kMaxManifestBytes) return failed("the manifest is too large");
  sys::UniqueFd fd{::memfd_create("custos-handover", MFD_CLOEXEC | MFD_ALLOW_SEALING)};
  if (!fd.valid()) return failed("memfd_create", errno);
  std::size_t off = 0;
  while (off < text.size()) {
    ssize_t const n = ::write(fd.get(), text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return failed("write the manifest", errno);
    off += static_cast<std::size_t>(n);
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, kSeals) != 0) return failed("seal the manifest", errno);
  return fd;
}

std::vector<std::string> environment_with(int manifest_fd) {
  std::vector<std::string> env;
  std::string const own = std::string{kManifestEnv} + "=";
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view const entry{*e};
    // The listener goes by the manifest; systemd's variables named the first image's fds.
    if (entry.starts_with(own) || entry.starts_with("LISTEN_FDS=") ||
        entry.starts_with("LISTEN_PID=") || entry.starts_with("LISTEN_FDNAMES=")) {
      continue;
    }
    env.emplace_back(entry);
  }
  env.push_back(own + std::to_string(manifest_fd));
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void set_cloexec(sys::UniqueFd const& fd, bool on) {
  if (fd.valid()) (void)::fcntl(fd.get(), F_SETFD, on ? FD_CLOEXEC : 0);
}

// One execve of `image` with the manifest of `out`. Every descriptor but 0-2 is made O_CLOEXEC
// first, then exactly the ones the manifest names are cleared. Returns only on failure, with
// every descriptor O_CLOEXEC again.
Error exec_once(Outgoing const& out, sys::UniqueFd const& image, bool pass_old_image) {
  auto manifest = write_manifest(manifest_of(out, pass_old_image));
  if (!manifest) return manifest.error();
  auto env = environment_with(manifest->get());
  auto argv = out.image.argv;
  if (argv.empty()) return failed("no argv to start the new image with");
  auto envp = pointers(env);
  auto args = pointers(argv);
  (void)::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  std::array<sys::UniqueFd const*, 6> kept{&out.fds.listener,         &out.fds.socket_lock,
                                           &out.fds.state_lock,       manifest.operator->(),
                                           &out.fds.metrics_listener, &out.fds.metrics_lock};
  for (auto const* fd : kept) set_cloexec(*fd, false);
  if (pass_old_image) set_cloexec(out.fds.old_image, false);
  std::vector<int> carried;
  for (auto const& c : out.executions) {
    for (int fd : carried_fds(c)) carried.push_back(fd);
  }
  for (int fd : carried) (void)::fcntl(fd, F_SETFD, 0);
  spdlog::default_logger()->flush();
  ::fexecve(image.get(), args.data(), envp.data());
  int const err = errno;
  for (auto const* fd : kept) set_cloexec(*fd, true);
  set_cloexec(out.fds.old_image, true);
  for (int fd : carried) (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return failed("fexecve", err);
}

}  // namespace

Result<Image> own_image() {
  Image image;
  std::array<char, 4096> buf{};
  ssize_t const n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return Error{Errc::sys_error, "readlink /proc/self/exe", errno};
  image.path.assign(buf.data(), static_cast<std::size_t>(n));
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string const all{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (all.empty()) return Error{Errc::sys_error, "read /proc/self/cmdline"};
  std::size_t start = 0;
  while (start < all.size()) {
    auto end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    image.argv.emplace_back(all.substr(start, end - start));
    start = end + 1;
  }
  return image;
}

Result<std::optional<Inherited>> take_inherited() {
  char const* value = std::getenv(kManifestEnv);
  if (value == nullptr) return std::optional<Inherited>{};
  std::string const text{value};
  (void)::unsetenv(kManifestEnv);
  char* end = nullptr;
  long const n = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || n < 3 || n > INT32_MAX) {
    return failed(std::string{kManifestEnv} + " is not a descriptor number: " + text);
  }
  json::value const number(static_cast<std::int64_t>(n));
  sys::UniqueFd memfd = take_fd(&number);
  if (!memfd.valid()) return failed("the manifest descriptor " + text + " is not open");
  // Only a memfd carries seals: a sealed one cannot have changed since it was written.
  int const seals = ::fcntl(memfd.get(), F_GET_SEALS);
  if (seals < 0 || (static_cast<unsigned>(seals) & kSeals) != kSeals) {
    return failed("the manifest descriptor is not a sealed memfd");
  }
  struct stat st {};
  if (::fstat(memfd.get(), &st) != 0) return failed("fstat the manifest", errno);
  if (st.st_size <= 0 || static_cast<std::size_t>(st.st_size) > kMaxManifestBytes) {
    return failed("the manifest's size is out of bounds");
  }
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  if (::pread(memfd.get(), bytes.data(), bytes.size(), 0) != st.st_size) {
    return failed("read the manifest", errno);
  }
  boost::system::error_code ec;
  auto doc = json::parse(bytes, ec);
  if (ec || !doc.is_object()) return failed("the manifest is not a JSON object");
  auto const& m = doc.get_object();
  auto const version = int_of(m, "version");
  if (string_of(m, "format") != kFormat || version < 1 || version > kManifestVersion) {
    return failed("the manifest's format or version is not " + std::string{kFormat} + " " +
                  std::to_string(kManifestVersion));
  }
  auto const* from = m.if_contains("from");
  auto const* fds = m.if_contains("descriptors");
  if (from == nullptr || !from->is_object() || fds == nullptr || !fds->is_object()) {
    return failed("the manifest lacks `from` or `descriptors`");
  }
  Inherited in;
  auto const& f = from->get_object();
  in.origin.version = string_of(f, "version");
  in.origin.started_ns = int_of(f, "started_ns");
  in.origin.count = static_cast<std::uint32_t>(int_of(f, "count"));
  auto const* fb = f.if_contains("fallback");
  in.origin.fallback = fb != nullptr && fb->is_bool() && fb->get_bool();
  in.origin.reason = string_of(f, "reason");
  in.state_dir = string_of(m, "state_dir");
  in.socket_path = string_of(m, "socket_path");
  if (auto const* sub = m.if_contains("subtree"); sub != nullptr && sub->is_object()) {
    in.subtree_path = string_of(sub->get_object(), "path");
    auto const* created = sub->get_object().if_contains("created");
    in.subtree_created = created != nullptr && created->is_bool() && created->get_bool();
  }
  auto const& d = fds->get_object();
  in.fds.listener = take_fd(d.if_contains("listener"));
  auto const* sd = d.if_contains("listener_from_systemd");
  in.fds.listener_from_systemd = sd != nullptr && sd->is_bool() && sd->get_bool();
  in.fds.socket_lock = take_fd(d.if_contains("socket_lock"));
  in.fds.state_lock = take_fd(d.if_contains("state_lock"));
  in.fds.old_image = take_fd(d.if_contains("old_image"));
  in.fds.metrics_listener = take_fd(d.if_contains("metrics_listener"));
  in.fds.metrics_lock = take_fd(d.if_contains("metrics_lock"));
  if (auto const* ex = m.if_contains("executions"); ex != nullptr && ex->is_array()) {
    for (auto const& entry : ex->get_array()) {
      auto c = carried_from_json(entry);
      if (!c) {
        spdlog::warn("handover: {}; that execution is adopted without its output",
                     c.error().message());
        continue;
      }
      in.executions.push_back(std::move(*c));
    }
  }
  return std::optional<Inherited>{std::move(in)};
}

Result<sys::UniqueFd> verified_listener(Inherited const& in, std::string const& socket_path) {
  int const fd = in.fds.listener.get();
  if (fd < 0) return failed("no listening socket was handed over");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return failed("the handed-over listener is not a socket");
  }
  auto opt = [fd](int name) {
    int v = -1;
    socklen_t len = sizeof v;
    return ::getsockopt(fd, SOL_SOCKET, name, &v, &len) == 0 ? v : -1;
  };
  if (opt(SO_DOMAIN) != AF_UNIX || opt(SO_TYPE) != SOCK_STREAM || opt(SO_ACCEPTCONN) != 1) {
    return failed("the handed-over socket is not a listening Unix stream socket");
  }
  // systemd bound a socket-activated one at its unit's path: the daemon did not choose it.
  if (!in.fds.listener_from_systemd) {
    sockaddr_un addr{};
    socklen_t len = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return failed("getsockname of the handed-over listener", errno);
    }
    auto const max = len > offsetof(sockaddr_un, sun_path) ? len - offsetof(sockaddr_un, sun_path)
                                                           : std::size_t{0};
    std::string const bound{addr.sun_path, ::strnlen(addr.sun_path, max)};
    if (bound != socket_path) {
      return failed("the handed-over listener is bound at " + bound + ", not at " + socket_path);
    }
  }
  return in.fds.listener.dup();
}

Result<sys::UniqueFd> verified_lock(sys::UniqueFd const& fd, std::string const& path) {
  if (!fd.valid()) return failed("no lock on " + path + " was handed over");
  struct stat held {};
  struct stat now {};
  if (::fstat(fd.get(), &held) != 0 || !S_ISREG(held.st_mode)) {
    return failed("the handed-over lock of " + path + " is not a regular file");
  }
  if (::stat(path.c_str(), &now) != 0) return failed("stat " + path, errno);
  if (held.st_dev != now.st_dev || held.st_ino != now.st_ino) {
    return failed("the handed-over lock is not the file at " + path + " any more");
  }
  return fd.dup();
}

// NOLINTNEXTLINE(readability-function-size): one spawn, its output and its bounded wait
Result<Check> start_check(Image const& image) {
  sys::UniqueFd exe{::open(image.path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (!exe.valid()) return failed("open the new image " + image.path, errno);
  auto pipe = sys::make_pipe();
  if (!pipe) return pipe.error();
  auto& [out_r, out_w] = *pipe;
  // The check runs the descriptor just opened: the exec that follows replaces this process with
  // the same file, whatever happens to the path meanwhile.
  std::string const path = "/proc/self/fd/" + std::to_string(exe.get());
  std::vector<std::string> argv = image.argv;
  argv.emplace_back("--check-config");
  auto args = pointers(argv);
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawnattr_init(&attr);
  (void)::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  (void)::posix_spawn_file_actions_adddup2(&actions, out_w.get(), 1);
  (void)::posix_spawn_file_actions_adddup2(&actions, out_w.get(), 2);
  sigset_t none;
  sigset_t all;
  sigemptyset(&none);
  sigfillset(&all);
  (void)::posix_spawnattr_setsigmask(&attr, &none);
  (void)::posix_spawnattr_setsigdefault(&attr, &all);
  (void)::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  int const rc = ::posix_spawn(&pid, path.c_str(), &actions, &attr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  if (rc != 0) return failed("run the new image " + image.path, rc);
  out_w.reset();
  // Called on the loop, which is also where orphans are reaped: the pid still names the child.
  auto child = sys::Pidfd::open(pid);
  if (!child) return child.error();
  return Check{std::move(exe), std::move(*child), pid, std::move(out_r), image.path};
}

Result<sys::UniqueFd> finish_check(Check check, std::chrono::milliseconds bound) {
  auto& out_r = check.output;
  auto* child = &check.child;
  std::string output;
  auto const deadline = std::chrono::steady_clock::now() + bound;
  bool open = true;
  bool timed_out = false;
  while (open) {
    auto const left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out_r.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    std::array<char, 4096> buf{};
    ssize_t const n = ::read(out_r.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      open = false;
    } else if (output.size() < 4096) {
      output.append(buf.data(), static_cast<std::size_t>(n));
    }
  }
  if (timed_out) (void)child->send_signal(SIGKILL);
  auto status = child->wait();
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  if (timed_out) {
    return failed("the new image " + check.path + " did not finish its check within " +
                  std::to_string(bound.count()) + " ms");
  }
  if (!status) return status.error();
  if (status->code != 0) {
    return failed("the new image " + check.path + " refused the configuration (exit " +
                  (status->code ? std::to_string(*status->code)
                                : "signal " + std::to_string(status->signal.value_or(0))) +
                  ")" + (output.empty() ? "" : ": " + output));
  }
  return std::move(check.exe);
}

Inherited replace_image(Outgoing out) {
  auto first = exec_once(out, out.new_image, true);
  spdlog::critical("handover: the new image {} could not be executed: {}; the old one again",
                   out.image.path, first.message());
  out.origin.fallback = true;
  out.origin.reason = "the new image could not be executed: " + first.message();
  auto second = exec_once(out, out.fds.old_image, false);
  spdlog::critical(
      "handover: the old image could not be executed either: {}; starting again "
      "in this process",
      second.message());
  Inherited in;
  in.origin = std::move(out.origin);
  in.state_dir = std::move(out.state_dir);
  in.socket_path = std::move(out.socket_path);
  in.subtree_path = std::move(out.subtree_path);
  in.subtree_created = out.subtree_created;
  in.fds = std::move(out.fds);
  in.executions = std::move(out.executions);
  return in;
}

Error fall_back(Inherited in, std::string const& reason, std::vector<std::string> const& argv) {
  if (in.origin.fallback) {
    return failed("the old image failed to start too after a failed handover: " + reason);
  }
  if (!in.fds.old_image.valid()) return failed("no old image was handed over to fall back to");
  Outgoing out;
  out.origin = in.origin;
  out.origin.fallback = true;
  out.origin.reason = "the new image failed to start: " + reason;
  out.state_dir = std::move(in.state_dir);
  out.socket_path = std::move(in.socket_path);
  out.subtree_path = std::move(in.subtree_path);
  out.subtree_created = in.subtree_created;
  out.image.argv = argv;
  sys::UniqueFd image = std::move(in.fds.old_image);
  out.fds = std::move(in.fds);
  out.executions = std::move(in.executions);
  return exec_once(out, image, false);
}

}  // namespace custos::daemon::handover
