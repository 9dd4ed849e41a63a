// The artifact row: publishing a completed 1 GiB spool to the artifact store
// (registry::ArtifactStore::publish: copy, read back and hash, fdatasync, rename, directory
// fsync) against the floor of a raw copy of the same file plus its fsync, in the same run and
// the same directory (docs/benchmarks.md).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "custos/registry/artifacts.hpp"
#include "custos/sys/unique_fd.hpp"

#include "bench.hpp"

namespace custos::bench {

namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

// The spool: written once with non-repeating content (a reflink or a dedup cannot shortcut it).
bool write_spool(fs::path const& p, std::uint64_t bytes) {
  sys::UniqueFd fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return false;
  std::vector<std::uint64_t> buf((std::size_t{1} << 20) / sizeof(std::uint64_t));
  std::uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (std::uint64_t done = 0; done < bytes;) {
    for (auto& w : buf) {
      x ^= x << 13U;
      x ^= x >> 7U;
      x ^= x << 17U;
      w = x;
    }
    auto const n = static_cast<std::size_t>(
        std::min<std::uint64_t>(bytes - done, buf.size() * sizeof(std::uint64_t)));
    if (::write(fd.get(), buf.data(), n) != static_cast<ssize_t>(n)) return false;
    done += n;
  }
  return ::fsync(fd.get()) == 0;
}

// The floor: copy_file_range of the whole file into a new one, then fsync. Seconds, or a
// negative value when it failed.
double raw_copy(fs::path const& from, fs::path const& to, std::uint64_t bytes) {
  auto const t0 = std::chrono::steady_clock::now();
  sys::UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  sys::UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!in.valid() || !out.valid()) return -1;
  for (std::uint64_t done = 0; done < bytes;) {
    ssize_t const n = ::copy_file_range(in.get(), nullptr, out.get(), nullptr, bytes - done, 0);
    if (n <= 0) return -1;
    done += static_cast<std::uint64_t>(n);
  }
  if (::fsync(out.get()) != 0) return -1;
  return seconds_since(t0);
}

}  // namespace

std::vector<Row> artifact_rows(Env const& env, Floors const& /*floors*/) {
  std::uint64_t const bytes = env.quick ? kGiB / 8 : kGiB;
  int const runs = env.quick ? 1 : 4;  // even: each side goes first equally often
  std::string const name =
      env.quick ? "artifact: publish a 128 MiB spool (quick)" : "artifact: publish a 1 GiB spool";
  fs::path const dir = fs::path{env.work_dir} / "artifacts-row";
  std::error_code ec;
  fs::create_directories(dir, ec);
  fs::path const spool = dir / "spool";
  std::vector<double> floor_s;
  std::vector<double> product_s;
  std::string why;
  if (!write_spool(spool, bytes)) {
    return {unmeasured(name, "GiB/s", "raw copy + fsync", std::nullopt, 0.85, Better::higher,
                       "could not write the spool in the work directory")};
  }
  // One store for every run, and the floor's copies in its temporary directory: both sides
  // write into the same directory, so ext4 places their blocks alike (a fresh directory per run
  // could put the product's blocks in another block group than the floor's). The artifact is
  // removed after each run, so no run finds its bytes already stored.
  fs::path const state = dir / "state";
  registry::ArtifactStore store{state};
  fs::path const store_tmp = state / "artifacts" / "tmp";
  fs::create_directories(store_tmp, ec);
  // The destination pages: on these VMs a write into page-cache pages the guest never touched
  // is several times slower than one into pages a removed file just freed (docs/benchmarks.md,
  // the pipe floor). One untimed copy first, removed again, so that every timed run of either
  // side writes into recycled pages; the spool itself stays cached and clean for both sides.
  settle_page_cache(env);
  if (raw_copy(spool, store_tmp / "warm-up", bytes) < 0) {
    why = "the warm-up copy failed: errno " + std::to_string(errno);
  }
  fs::remove(store_tmp / "warm-up", ec);
  // Alternating runs, each after the previous one's writeback settled, the order swapped every
  // run (floor first on even runs, product first on odd ones): the floor and the product see
  // the same page cache and the same disk, and neither always follows the other.
  auto run_floor = [&](int i) {
    fs::path const copy = store_tmp / ("floor-copy" + std::to_string(i));
    double const f = raw_copy(spool, copy, bytes);
    if (f < 0 && why.empty()) why = "the raw copy failed: errno " + std::to_string(errno);
    floor_s.push_back(f);
    fs::remove(copy, ec);
  };
  auto run_product = [&] {
    auto const t0 = std::chrono::steady_clock::now();
    auto a = store.publish(spool, bytes);
    product_s.push_back(seconds_since(t0));
    if (!a && why.empty()) why = "publish failed: " + a.error().message();
    if (a && a->existed && why.empty()) why = "publish found its bytes already stored";
    if (a) fs::remove(store.path_of(a->digest), ec);
  };
  for (int i = 0;
       i < runs && why.empty() && (i == 0 || std::chrono::steady_clock::now() < env.deadline);
       ++i) {
    settle_page_cache(env);
    if (i % 2 == 0)
      run_floor(i);
    else
      run_product();
    settle_page_cache(env);
    if (i % 2 == 0)
      run_product();
    else
      run_floor(i);
  }
  fs::remove_all(dir, ec);
  if (!why.empty()) {
    return {unmeasured(name, "GiB/s", "raw copy + fsync", std::nullopt, 0.85, Better::higher, why)};
  }
  double const gib = static_cast<double>(bytes) / static_cast<double>(kGiB);
  Row r;
  r.name = name;
  r.unit = "GiB/s";
  r.value = gib / median(product_s);
  r.floor_name = "raw copy + fsync";
  r.floor_value = gib / median(floor_s);
  r.target = 0.85;
  r.better = Better::higher;
  // The single runs, for the doc's budget: seconds of the floor and the product, in run order.
  auto list = [](std::vector<double> const& v) {
    std::string out;
    for (double x : v) {
      char b[32];
      std::snprintf(b, sizeof b, "%s%.3f", out.empty() ? "" : " ", x);
      out += b;
    }
    return out;
  };
  r.note = "median of " + std::to_string(product_s.size()) +
           " runs alternating the order, each after a syncfs, after one untimed warm-up copy; "
           "seconds, floor: " +
           list(floor_s) + "; publish: " + list(product_s);
  return {r};
}

}  // namespace custos::bench
