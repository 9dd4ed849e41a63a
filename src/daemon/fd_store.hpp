// systemd's file descriptor store (docs/operations.md, "Descriptor store"). The daemon gives
// systemd a copy of each launched execution's output descriptors (FDSTORE=1, one name per
// execution and stream) and takes them back at its terminal record (FDSTOREREMOVE=1). When the
// daemon dies without a handover — a crash, kill -9, `systemctl restart` — systemd keeps them
// (the pipes stay open, so a program writing on meets a full pipe, never EPIPE) and passes them
// to the next start (LISTEN_FDS, LISTEN_FDNAMES). That start re-attaches every execution
// recovery proves live by pidfs identity to its own descriptors, instead of adopting it without
// output.
//
// Trust: only the service's main process can store descriptors (NotifyAccess=main), so a name
// is the daemon's own word; each descriptor is still checked to be what its name says (a pipe's
// read end, or a terminal's master) before it is used, and is used only for an execution
// recovery re-acquired.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "custos/backend/backend.hpp"
#include "custos/core/accounting.hpp"
#include "custos/core/result.hpp"
#include "custos/supervisor/types.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::daemon::fd_store {

// One kept descriptor's name: `custos-<stream>-<execution id>`, the stream by its wire name
// (stdout, stderr, pty).
[[nodiscard]] std::string name_of(std::string_view execution_id, core::Stream stream);
// The execution and the stream a name stands for; nullopt for any other name (a socket's).
[[nodiscard]] std::optional<std::pair<std::string, core::Stream>> parse_name(std::string_view name);

// What systemd passed to this start.
struct Passed {
  sys::UniqueFd listener;  // the first passed AF_UNIX stream socket (custos.socket)
  std::map<std::string, backend::CarriedStdio> kept;  // the store's, by execution id
  std::size_t other = 0;                              // anything else: closed
};
// Takes every descriptor systemd passed (sd_listen_fds_with_names; the variables are removed
// from the environment so that nothing this daemon starts sees them). Each is owned and
// O_CLOEXEC from here. Nothing passed: an empty Passed.
[[nodiscard]] Passed take_passed();

// The daemon's StdioKeeper: systemd's store through $NOTIFY_SOCKET.
class Store final : public supervisor::StdioKeeper {
 public:
  // Under a notify socket, unless $FDSTORE (set by systemd 254 and later) says the service has
  // no store; null otherwise.
  [[nodiscard]] static std::unique_ptr<Store> from_environment();

  void keep(std::string const& execution_id, backend::CarriedStdio const& copies) override;
  // Removes what was kept for it: the names this image stored, else (kept by an earlier image or
  // daemon) every name it may have had. Also for an execution whose kept descriptors a start
  // does not re-attach (no longer live, or not ours).
  void forget(std::string const& execution_id) override;

  // Descriptors systemd was given since start, and messages it could not be sent.
  [[nodiscard]] std::uint64_t stored() const noexcept { return stored_; }
  [[nodiscard]] std::uint64_t failures() const noexcept { return failures_; }

 private:
  Store() = default;
  bool send(std::string const& state, int fd);

  std::unordered_map<std::string, std::vector<std::string>> names_;
  std::uint64_t stored_ = 0;
  std::uint64_t failures_ = 0;
};

// A restored execution's Carried (supervisor::Carried::restored): `stdio` from the store,
// checked against the plan's mode (pipes' read ends, or one terminal master); each stream goes
// on from its spool's size under `state_dir` with the stored accounting's drops, incomplete.
// Errors: daemon.handover_failed saying which descriptor failed which check (they are closed).
[[nodiscard]] Result<supervisor::Carried> restored(std::string const& execution_id,
                                                   backend::CarriedStdio stdio, bool pty,
                                                   core::StreamAccounting const& out,
                                                   core::StreamAccounting const& err,
                                                   std::filesystem::path const& state_dir);

}  // namespace custos::daemon::fd_store
