// The retention sweep of retained output (artifacts.hpp, docs/durability.md "Retention").
#include <algorithm>
#include <ctime>
#include <sys/stat.h>
#include <unistd.h>

#include "custos/registry/artifacts.hpp"

namespace custos::registry {

namespace fs = std::filesystem;

namespace {

std::int64_t mtime_ns(fs::path const& p) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return 0;
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

std::uint64_t tree_bytes(fs::path const& dir) {
  std::uint64_t n = 0;
  std::error_code ec;
  for (auto const& e : fs::directory_iterator(dir, ec)) {
    auto const s = e.file_size(ec);
    if (!ec) n += s;
  }
  return n;
}

struct StoredArtifact {
  fs::path path;
  std::uint64_t bytes = 0;
  std::int64_t mtime = 0;
};

// Whether a spool directory may go: only when nothing can need it any more.
enum class SpoolFate : std::uint8_t { keep, remove, remove_when_old };

SpoolFate spool_fate(Registry& registry, std::string const& id) {
  auto rec = registry.get(id);
  if (!rec) {
    // No record names it: nothing will ever publish or serve it. A quarantined or unreadable
    // record's spool is kept (never act on a record that cannot be trusted).
    return rec.error().code == Errc::registry_not_found ? SpoolFate::remove_when_old
                                                        : SpoolFate::keep;
  }
  if (rec->phase != core::Phase::terminal) return SpoolFate::keep;  // live: still written
  if (rec->out.publication_done && rec->err.publication_done) return SpoolFate::remove;
  return SpoolFate::keep;  // a stream still to be published (pending or failed)
}

}  // namespace

Result<SweepReport> sweep_output(Registry& registry, ArtifactStore& store,
                                 RetentionPolicy const& policy) {
  SweepReport report;
  timespec ts{};
  (void)clock_gettime(CLOCK_REALTIME, &ts);
  std::int64_t const now = static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  std::int64_t const age_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(policy.age).count();
  auto old = [&](std::int64_t mtime) { return age_ns > 0 && now - mtime > age_ns; };
  auto remove_tree = [&](fs::path const& p, std::uint64_t bytes) {
    std::error_code ec;
    fs::remove_all(p, ec);
    if (ec) return false;
    report.bytes_freed += bytes;
    return true;
  };

  fs::path const state = store.state_dir();
  std::uint64_t kept_spool_bytes = 0;
  std::error_code ec;
  for (auto const& e : fs::directory_iterator(state / "spool", ec)) {
    if (!e.is_directory(ec)) continue;
    std::string const id = e.path().filename().string();
    std::uint64_t const bytes = tree_bytes(e.path());
    SpoolFate const fate = spool_fate(registry, id);
    bool const go = fate == SpoolFate::remove ||
                    (fate == SpoolFate::remove_when_old && old(mtime_ns(e.path())));
    if (go && remove_tree(e.path(), bytes)) {
      ++report.spools_removed;
    } else {
      kept_spool_bytes += bytes;
    }
  }
  // The publisher is the only writer of artifacts/tmp and runs this sweep itself: anything
  // there is a publication a crash interrupted.
  for (auto const& e : fs::directory_iterator(state / "artifacts" / "tmp", ec)) {
    auto const bytes = e.file_size(ec);
    (void)remove_tree(e.path(), ec ? 0 : bytes);
  }

  std::vector<StoredArtifact> artifacts;
  for (auto const& e : fs::directory_iterator(state / "artifacts" / "sha256", ec)) {
    auto const bytes = e.file_size(ec);
    if (ec) continue;
    artifacts.push_back({e.path(), bytes, mtime_ns(e.path())});
  }
  std::sort(artifacts.begin(), artifacts.end(),
            [](StoredArtifact const& a, StoredArtifact const& b) {
              return a.mtime != b.mtime ? a.mtime < b.mtime : a.path < b.path;
            });
  std::uint64_t total = kept_spool_bytes;
  for (auto const& a : artifacts) total += a.bytes;
  for (auto const& a : artifacts) {
    bool const over = policy.bytes > 0 && total > policy.bytes;
    if (!old(a.mtime) && !over) break;  // oldest first: every later one is younger
    if (::unlink(a.path.c_str()) != 0) continue;
    ++report.artifacts_removed;
    report.bytes_freed += a.bytes;
    total -= a.bytes;
  }
  report.figures = store.measure();
  return report;
}

}  // namespace custos::registry
