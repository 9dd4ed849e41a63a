// The handover: `custos daemon` replacing its own image with execve while keeping what clients
// and executions need of it (docs/operations.md, "Handover"; the manifest format and the
// verification rules are in docs/supervisor.md, "Handover").
//
// One image stops accepting, detaches its executions at a consistent point (as `shutdown =
// detach` does) and writes a manifest — which image handed over, and the descriptor number of
// each thing it keeps — into a sealed memfd. Exactly the descriptors the manifest names lose
// O_CLOEXEC; the image is replaced with fexecve, the memfd's number in CUSTOS_HANDOVER_FD. The
// next image (same pid, so the executions are still its children) reads the manifest, verifies
// every descriptor before it uses it, and starts through the ordinary start-up: recovery
// re-acquires the executions by pidfs identity and the manager adopts them.
//
// Everything here runs with no event loop: before the daemon is built, or after it was destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "custos/core/result.hpp"
#include "custos/supervisor/types.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::daemon::handover {

// The environment variable that names the manifest's descriptor in the new image.
inline constexpr char const* kManifestEnv = "CUSTOS_HANDOVER_FD";
// Version 2 added `executions` (what each live execution carries); a version 1 manifest (an
// older image handing over) is still read, with none.
inline constexpr std::uint32_t kManifestVersion = 2;
// The retained events of every live execution travel in it (output in base64): bounded by the
// executions' own retention (output.retained_bytes each), and by this.
inline constexpr std::size_t kMaxManifestBytes = std::size_t{1} << 30;

// Which image handed over, as the next one reports it (host.info `handover`).
struct Origin {
  std::string version;          // the handing-over image's version
  std::int64_t started_ns = 0;  // when that image started
  std::uint32_t count = 0;      // handovers since this process was first started, this one included
  bool fallback = false;        // the new image failed to start: this is the old image again
  std::string reason;           // why it fell back (empty otherwise)
};

// The descriptors one image hands to the next. While held here each one is O_CLOEXEC: only the
// exec of a handover clears it, on exactly these.
struct Descriptors {
  sys::UniqueFd listener;              // the API socket, listening
  bool listener_from_systemd = false;  // socket activation: systemd owns the socket's path
  sys::UniqueFd socket_lock;           // <socket>.lock, flocked (none with socket activation)
  sys::UniqueFd state_lock;            // <state-dir>/custos.lock, flocked
  sys::UniqueFd old_image;             // the handing-over image's executable (a fallback)
  sys::UniqueFd metrics_listener;      // the metrics endpoint, listening (none: not served)
  sys::UniqueFd metrics_lock;          // <metrics socket>.lock, flocked (a Unix socket's)
};

// What a new image received.
struct Inherited {
  Origin origin;
  std::string state_dir;    // the previous image's, as resolved
  std::string socket_path;  // likewise
  // The cgroup subtree the previous image served, and whether a daemon of this process created
  // it (then the last one to stop removes it when empty).
  std::string subtree_path;
  bool subtree_created = false;
  Descriptors fds;
  // What each live execution carried (its stdio verified, handover_carried.hpp); an entry that
  // failed verification is absent, and that execution is adopted without its output.
  std::vector<supervisor::Carried> executions;
};

// This process's image as it was started: the executable's path (read once at start, before a
// package upgrade can replace the file) and the argv.
struct Image {
  std::string path;
  std::vector<std::string> argv;
};
// Errors: sys.error when /proc/self/exe or /proc/self/cmdline cannot be read.
[[nodiscard]] Result<Image> own_image();

// Reads the manifest CUSTOS_HANDOVER_FD names and removes the variable from the environment:
// nullopt when this process was not started by a handover. Every descriptor the manifest names
// is taken over (made O_CLOEXEC) whether or not it is used later. Errors:
// daemon.handover_failed when the variable is set but the manifest is not a sealed memfd of the
// expected format (nothing it names is then trusted).
[[nodiscard]] Result<std::optional<Inherited>> take_inherited();

// A second descriptor (O_CLOEXEC) of the inherited listener, only if it is a listening AF_UNIX
// stream socket bound at `socket_path`. Errors: daemon.handover_failed saying which check failed.
[[nodiscard]] Result<sys::UniqueFd> verified_listener(Inherited const& in,
                                                      std::string const& socket_path);
// A second descriptor of an inherited lock file descriptor, only if it is the file at `path`
// now (same device and inode). Errors: daemon.handover_failed.
[[nodiscard]] Result<sys::UniqueFd> verified_lock(sys::UniqueFd const& fd, std::string const& path);

// The pre-flight: `image.path` opened and run (through that descriptor) with the daemon's argv
// plus `--check-config`, which parses and resolves the configuration and exits. The new image is
// used only when that exits 0 within the bound. A check is started on the loop (start_check:
// the child is this process's, and the caller keeps the orphan reaper off its pid before anything
// else can reap it) and finished on another thread (finish_check blocks for its duration), so the
// daemon serves on meanwhile.
struct Check {
  sys::UniqueFd exe;     // what the check runs, and the execve will
  sys::Pidfd child;      // the check
  std::int32_t pid = 0;  // its pid, for the reaper to leave alone
  sys::UniqueFd output;  // its stdout and stderr
  std::string path;      // image.path, for messages
};
// Errors: daemon.handover_failed when the image cannot be opened or run; sys errors.
[[nodiscard]] Result<Check> start_check(Image const& image);
// Waits for the check (killed past `bound`) and reaps it. Returns the descriptor the check ran,
// so the execve replaces this process with the very file that was checked. Errors:
// daemon.handover_failed with the check's own output.
[[nodiscard]] Result<sys::UniqueFd> finish_check(Check check, std::chrono::milliseconds bound);

// What the handing-over image passes on.
struct Outgoing {
  Origin origin;  // this handover, as the next image will report it
  std::string state_dir;
  std::string socket_path;
  std::string subtree_path;
  bool subtree_created = false;
  Descriptors fds;
  std::vector<supervisor::Carried> executions;  // ExecutionManager::hand_over()
  Image image;                                  // the argv to start with (and the path, for logs)
  sys::UniqueFd new_image;                      // what check_image() checked
};

// Replaces the process with the new image; if that execve fails, with the old one again
// (origin.fallback set). Returns only when both failed: what this process starts again with,
// in-process.
[[nodiscard]] Inherited replace_image(Outgoing out);

// A handed-over image whose start failed: the old image (in.fds.old_image) is executed again
// with origin.fallback set, unless `in` is already a fallback or has no old image. Returns only
// when that was not possible, with the reason.
[[nodiscard]] Error fall_back(Inherited in, std::string const& reason,
                              std::vector<std::string> const& argv);

}  // namespace custos::daemon::handover
