// systemd's file descriptor store (fd_store.hpp).
#include "fd_store.hpp"

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "custos/registry/artifacts.hpp"

namespace custos::daemon::fd_store {

namespace {

constexpr std::string_view kPrefix = "custos-";

Error failed(std::string what) {
  return Error{Errc::daemon_handover_failed, std::move(what)};
}

// A pipe's read end (what the daemon reads an output stream from).
Result<void> check_pipe_read_end(sys::UniqueFd const& fd, std::string const& what) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return failed(what + ": fstat failed");
  if (!S_ISFIFO(st.st_mode)) return failed(what + ": not a pipe");
  int const flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDONLY) return failed(what + ": not a read end");
  return ok();
}

std::uint64_t spool_size(std::filesystem::path const& state_dir, std::string const& id,
                         core::Stream s) {
  struct stat st {};
  auto const p = registry::spool_path(state_dir, id, core::stream_wire(s));
  if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  return static_cast<std::uint64_t>(st.st_size);
}

}  // namespace

std::string name_of(std::string_view execution_id, core::Stream stream) {
  std::string n{kPrefix};
  n += core::stream_wire(stream);
  n += '-';
  n += execution_id;
  return n;
}

std::optional<std::pair<std::string, core::Stream>> parse_name(std::string_view name) {
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  auto const dash = name.find('-');
  if (dash == std::string_view::npos || dash + 1 == name.size()) return std::nullopt;
  auto const stream = core::stream_from_wire(name.substr(0, dash));
  if (!stream) return std::nullopt;
  return std::pair{std::string{name.substr(dash + 1)}, *stream};
}

Passed take_passed() {
  Passed p;
  char** names = nullptr;
  int const n = ::sd_listen_fds_with_names(1, &names);
  if (n <= 0) return p;
  for (int i = 0; i < n; ++i) {
    int const fd = SD_LISTEN_FDS_START + i;
    (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
    sys::UniqueFd held{fd};
    std::string_view const name = names != nullptr && names[i] != nullptr ? names[i] : "";
    if (auto kept = parse_name(name)) {
      auto& io = p.kept[kept->first];
      switch (kept->second) {
        case core::Stream::stdout_stream:
          io.out = std::move(held);
          break;
        case core::Stream::stderr_stream:
          io.err = std::move(held);
          break;
        case core::Stream::pty:
          io.pty = true;
          io.out = std::move(held);
          break;
      }
    } else if (!p.listener.valid() && ::sd_is_socket_unix(fd, SOCK_STREAM, 1, nullptr, 0) > 0) {
      p.listener = std::move(held);
    } else {
      ++p.other;  // closed here
    }
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) std::free(names[i]);  // NOLINT: sd_listen_fds_with_names' strv
    std::free(names);                                 // NOLINT
  }
  return p;
}

std::unique_ptr<Store> Store::from_environment() {
  char const* socket = std::getenv("NOTIFY_SOCKET");
  if (socket == nullptr || *socket == 0) return nullptr;
  // systemd 254 and later tell the store's size; 0 means the unit has none.
  if (char const* max = std::getenv("FDSTORE"); max != nullptr && std::strcmp(max, "0") == 0) {
    spdlog::info(
        "descriptor store: the unit has none (FDSTORE=0); output is not kept across "
        "a crash or restart");
    return nullptr;
  }
  return std::unique_ptr<Store>(new Store());
}

bool Store::send(std::string const& state, int fd) {
  int const r = fd >= 0 ? ::sd_pid_notify_with_fds(0, 0, state.c_str(), &fd, 1)
                        : ::sd_pid_notify(0, 0, state.c_str());
  if (r > 0) return true;
  // Logged once, then counted: one failing launch after another must not flood the journal.
  if (failures_++ == 0) {
    spdlog::warn(
        "descriptor store: systemd could not be told ({}); further failures are only "
        "counted",
        r < 0 ? std::strerror(-r) : "no notify socket");
  }
  return false;
}

void Store::keep(std::string const& execution_id, backend::CarriedStdio const& copies) {
  std::vector<std::string> names;
  auto one = [&](sys::UniqueFd const& fd, core::Stream s) {
    if (!fd.valid()) return;
    std::string name = name_of(execution_id, s);
    if (send("FDSTORE=1\nFDNAME=" + name, fd.get())) {
      ++stored_;
      names.push_back(std::move(name));
    }
  };
  if (copies.pty) {
    one(copies.out, core::Stream::pty);
  } else {
    one(copies.out, core::Stream::stdout_stream);
    one(copies.err, core::Stream::stderr_stream);
  }
  if (!names.empty()) names_[execution_id] = std::move(names);
  // `copies` closes here: systemd holds its own.
}

void Store::forget(std::string const& execution_id) {
  auto it = names_.find(execution_id);
  std::vector<std::string> names;
  if (it != names_.end()) {
    names = std::move(it->second);
    names_.erase(it);
  } else {
    // Kept by an earlier image or daemon (this one never learnt its names): every name it may
    // have used goes. Removing a name the store does not hold is a no-op for systemd.
    for (auto s : {core::Stream::stdout_stream, core::Stream::stderr_stream, core::Stream::pty}) {
      names.push_back(name_of(execution_id, s));
    }
  }
  for (auto const& name : names) (void)send("FDSTOREREMOVE=1\nFDNAME=" + name, -1);
}

Result<supervisor::Carried> restored(std::string const& execution_id, backend::CarriedStdio stdio,
                                     bool pty, core::StreamAccounting const& out,
                                     core::StreamAccounting const& err,
                                     std::filesystem::path const& state_dir) {
  std::string const who = "execution " + execution_id;
  if (stdio.pty != pty) {
    return failed(who + ": the store kept " + (stdio.pty ? "a terminal" : "pipes") +
                  " for a plan with " + (pty ? "a terminal" : "pipes"));
  }
  // The terminal's master is checked by the backend (sys::Pty::from_master) when it adopts.
  if (!pty) {
    if (stdio.out.valid()) CUSTOS_TRYV(check_pipe_read_end(stdio.out, who + " stdout"));
    if (stdio.err.valid()) CUSTOS_TRYV(check_pipe_read_end(stdio.err, who + " stderr"));
  }
  supervisor::Carried c;
  c.execution_id = execution_id;
  c.restored = true;
  auto stream = [&](core::Stream s, core::StreamAccounting const& stored, bool open) {
    supervisor::Carried::Stream st;
    st.stream = s;
    st.ended = !open;  // its descriptor is gone: every writer had closed it
    st.spool_size = spool_size(state_dir, execution_id, s);
    st.acc = core::StreamAccounting{st.spool_size + stored.dropped, st.spool_size, stored.dropped,
                                    false};
    c.output_allowed += st.spool_size;
    c.streams.push_back(st);
  };
  if (pty) {
    stream(core::Stream::pty, out, stdio.out.valid());
  } else {
    stream(core::Stream::stdout_stream, out, stdio.out.valid());
    stream(core::Stream::stderr_stream, err, stdio.err.valid());
  }
  stdio.in.reset();  // never stored: the input did not survive
  c.stdio = std::move(stdio);
  c.input_closed = false;  // closed by the adoption itself ("none")
  c.next_seq = 1;
  return c;
}

}  // namespace custos::daemon::fd_store
