// The marker boundary's sweep (procfs.hpp, docs/boundaries.md): scan, signal every process that
// carries a marker through a pidfd after re-checking it, and scan again until none is left; and
// the sweeper that batches the requests of many executions into shared passes.
#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <poll.h>
#include <span>
#include <thread>
#include <unistd.h>

#include "custos/sys/pidfd.hpp"
#include "custos/sys/procfs.hpp"

#include "marker_scan.hpp"

namespace custos::sys {
namespace {

using detail::EnvironState;
using detail::expected_ns;
using detail::marker_needle;
using detail::proc_root_is_ours;
using detail::read_environ_state;
using detail::scan_pass;
using detail::ScanParams;
using detail::ScanTarget;

constexpr std::size_t kMaxUnreadablePidsReported = 32;

bool read_proc_hides_processes(std::string const& proc_root) {
  if (auto root = open_dir_path("/")) {
    if (auto mi = read_file_at(*root, "proc/self/mountinfo", std::size_t{4} * 1024 * 1024)) {
      return proc_hides_processes(*mi, proc_root);
    }
  }
  return false;
}

Result<std::vector<MarkerSweepResult>> sweep_many(std::span<MarkerSweepTarget const> targets,
                                                  MarkerSweepOptions const& options, bool hides) {
  std::uint64_t const ns = CUSTOS_TRY(expected_ns(options.pid_ns_inode, options.proc_root));
  bool const can_signal = proc_root_is_ours(options.proc_root);
  std::vector<MarkerSweepResult> results(targets.size());
  if (targets.empty()) return results;
  std::vector<ScanTarget> scan_targets;
  scan_targets.reserve(targets.size());
  for (auto const& t : targets) {
    scan_targets.push_back(ScanTarget{marker_needle(t.marker), t.not_before_ticks});
  }
  for (auto& r : results) r.proc_hides_processes = hides;

  ScanParams const sp{ns, options.proc_root, options.max_environ_bytes, options.cache};
  std::uint32_t const max_rounds = std::max<std::uint32_t>(options.max_rounds, 1);
  // A target stays active until a pass finds none of its processes (or its rounds run out),
  // exactly as its own marker_sweep would.
  std::vector<std::size_t> active(targets.size());
  for (std::size_t i = 0; i < active.size(); ++i) active[i] = i;
  std::vector<MarkerScanResult> scans(targets.size());
  // A process can be unreadable for a moment only (between credential changes inside execve,
  // say, when another tenant launches at the same time): a pass whose only fault was unreadable
  // processes is repeated, at most this many times, before its result counts.
  constexpr std::uint32_t kUnreadableRetries = 2;
  std::vector<std::uint32_t> unreadable_retries(targets.size(), 0);
  while (!active.empty()) {
    CUSTOS_TRYV(scan_pass(scan_targets, active, sp, scans));
    bool signalled_any = false;
    bool retry_unreadable = false;
    std::vector<std::size_t> next;
    for (std::size_t const t : active) {
      MarkerScanResult const& scan = scans[t];
      MarkerSweepResult& out = results[t];
      ++out.rounds;
      out.unreadable = static_cast<std::uint32_t>(scan.unreadable.size());
      out.unreadable_pids.assign(
          scan.unreadable.begin(),
          scan.unreadable.begin() + static_cast<std::ptrdiff_t>(std::min(
                                        scan.unreadable.size(), kMaxUnreadablePidsReported)));
      out.remaining = static_cast<std::uint32_t>(scan.matched.size());
      if (scan.matched.empty() && !scan.unreadable.empty() && out.rounds < max_rounds &&
          unreadable_retries[t] < kUnreadableRetries) {
        ++unreadable_retries[t];
        retry_unreadable = true;
        next.push_back(t);
        continue;
      }
      if (scan.matched.empty() || !can_signal) continue;
      for (std::int32_t const pid : scan.matched) {
        auto pidfd = Pidfd::open(pid);
        if (!pidfd) continue;  // exited between the scan and the open: nothing left to signal
        // The pid may have been recycled between the scan and pidfd_open: re-read the marker
        // through /proc/<pid> now that the pidfd pins a process, then check the pidfd is still
        // alive — a live process keeps its pid, so the re-read was of the very process the
        // pidfd names.
        EnvironState const again = read_environ_state(
            options.proc_root, pid, scan_targets[t].needle, options.max_environ_bytes);
        if (again != EnvironState::marked || !pidfd->alive()) continue;
        bool const delivered = CUSTOS_TRY(pidfd->send_signal(options.signal));
        if (delivered) ++out.signalled;
      }
      signalled_any = true;
      if (out.rounds < max_rounds) next.push_back(t);
    }
    active = std::move(next);
    // Pause after a round that signalled something, so the killed processes can exit (and drop
    // their environment) before the next scan looks again.
    if ((signalled_any || retry_unreadable) && !active.empty() && options.round_pause.count() > 0) {
      std::this_thread::sleep_for(options.round_pause);
    }
  }
  // Confirmed only by a final scan that saw every process and no marker.
  for (auto& out : results) {
    out.confirmed = out.remaining == 0 && out.unreadable == 0 && !out.proc_hides_processes;
  }
  return results;
}

}  // namespace

Result<MarkerSweepResult> marker_sweep(Marker const& marker, MarkerSweepOptions const& options) {
  MarkerSweepTarget const target{marker, options.not_before_ticks};
  auto many =
      CUSTOS_TRY(marker_sweep_many(std::span<MarkerSweepTarget const>(&target, 1), options));
  return std::move(many[0]);
}

Result<std::vector<MarkerSweepResult>> marker_sweep_many(std::span<MarkerSweepTarget const> targets,
                                                         MarkerSweepOptions const& options) {
  return sweep_many(targets, options, read_proc_hides_processes(options.proc_root));
}

// ---- MarkerSweeper -------------------------------------------------------------------------

MarkerSweeper::MarkerSweeper(MarkerSweepOptions options) : options_(std::move(options)) {
  options_.cache = &cache_;
}

bool MarkerSweeper::enqueue(Request request) {
  std::lock_guard const lock(mu_);
  queue_.push_back(std::move(request));
  if (scheduled_) return false;
  scheduled_ = true;
  return true;
}

void MarkerSweeper::run_pending() {
  for (;;) {
    std::vector<Request> batch;
    {
      std::lock_guard const lock(mu_);
      if (queue_.empty()) {
        scheduled_ = false;
        return;
      }
      batch.swap(queue_);
    }
    if (!options_.pid_ns_inode) {
      // Our own pid namespace never changes (setns only moves our future children), so it is
      // looked up once rather than with a stat of <proc>/self/ns/pid per sweep.
      if (auto ns = pid_namespace_inode("self", options_.proc_root)) options_.pid_ns_inode = *ns;
    }
    std::vector<MarkerSweepTarget> targets;
    targets.reserve(batch.size());
    for (auto const& r : batch) targets.push_back(r.target);
    auto results = sweep_many(targets, options_, proc_hides_processes_now());
    {
      std::lock_guard const lock(mu_);
      ++stats_.sweeps;
      stats_.requests += batch.size();
      stats_.cache = cache_.stats();
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (!batch[i].done) continue;
      if (results) {
        batch[i].done(std::move(results.value()[i]));
      } else {
        batch[i].done(results.error());
      }
    }
  }
}

bool MarkerSweeper::proc_hides_processes_now() {
  if (!mountinfo_.valid()) {
    mountinfo_.reset(::open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC));
    hides_.reset();
    if (!mountinfo_.valid()) {
      // No way to see mount changes: no directory is held across passes either.
      cache_.drop_proc_dir();
      return read_proc_hides_processes(options_.proc_root);
    }
  }
  if (hides_) {
    // The file reports POLLPRI|POLLERR once after each change of the mount table since the
    // last poll (and since open): only then can the answer differ.
    pollfd p{mountinfo_.get(), POLLPRI, 0};
    int const n = ::poll(&p, 1, 0);
    if (n == 0 || (n > 0 && (p.revents & (POLLPRI | POLLERR)) == 0)) return *hides_;
  }
  hides_.reset();
  // The mount table changed (or is read for the first time): the held /proc directory may
  // belong to a mount that is no longer the one at proc_root.
  cache_.drop_proc_dir();
  if (::lseek(mountinfo_.get(), 0, SEEK_SET) != 0)
    return read_proc_hides_processes(options_.proc_root);
  std::string text;
  char buf[8192];
  for (;;) {
    ssize_t const n = ::read(mountinfo_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return read_proc_hides_processes(options_.proc_root);
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > std::size_t{4} * 1024 * 1024)
      return read_proc_hides_processes(options_.proc_root);
  }
  hides_ = proc_hides_processes(text, options_.proc_root);
  return *hides_;
}

MarkerSweeper::Stats MarkerSweeper::stats() const {
  std::lock_guard const lock(mu_);
  return stats_;
}

}  // namespace custos::sys
