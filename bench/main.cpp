// custos_bench: measures the kernel floors, then every product row against them, and prints
// the table. scripts/bench builds it (release preset), runs it and splices its Markdown into
// docs/benchmarks.md. Never part of the test suite.
//
//   custos_bench [--quick] [--json FILE] [--markdown FILE] [--noop PATH] [--custos PATH]
//                [--work-parent DIR] [--time-limit SECONDS] [--only AREA]
//
// Everything it creates lives in custos-bench-<pid> beneath the cgroup v2 mount and in a private
// work directory; both are removed at the end, and a watchdog kills the bench cgroup and exits if
// the run overstays its time limit.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <signal.h>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "bench.hpp"

#ifndef CUSTOS_BENCH_NOOP
#define CUSTOS_BENCH_NOOP ""
#endif
#ifndef CUSTOS_BENCH_CUSTOS
#define CUSTOS_BENCH_CUSTOS ""
#endif
#ifndef CUSTOS_BENCH_WORK_PARENT
#define CUSTOS_BENCH_WORK_PARENT "/tmp"
#endif

namespace custos::bench {
namespace {

namespace fs = std::filesystem;

// ---- cgroup v2 root of this run ------------------------------------------------------------

// The cgroup2 mount point from /proc/self/mountinfo ("... mountpoint opts ... - cgroup2 ...").
std::string find_cgroup2_mount() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    auto const sep = line.find(" - ");
    if (sep == std::string::npos) continue;
    std::istringstream tail(line.substr(sep + 3));
    std::string fstype;
    tail >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream head(line.substr(0, sep));
    std::string f[5];
    for (auto& x : f) head >> x;
    // Mount points escape space, tab, newline and backslash as octal; a v2 mount with any of
    // them is not one this bench will write beneath.
    if (f[4].find('\\') != std::string::npos) return {};
    return f[4];
  }
  return {};
}

// Precomputed for the watchdog, which may only use async-signal-safe calls.
char g_kill_path[512];

void write_kill(char const* path) {
  int const fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    [[maybe_unused]] auto const w = ::write(fd, "1", 1);
    ::close(fd);
  }
}

extern "C" void on_watchdog(int) {
  if (g_kill_path[0] != '\0') write_kill(g_kill_path);
  static char const msg[] = "custos_bench: time limit or interrupt; bench cgroup killed\n";
  [[maybe_unused]] auto const w = ::write(2, msg, sizeof msg - 1);
  ::_exit(3);
}

// Kills whatever is left beneath the run's root and removes every cgroup there, deepest first
// (rows nest: <root>/<row>/<execution>), then the root itself.
void remove_cgroup_dir(fs::path const& dir) {
  std::error_code ec;
  std::vector<fs::path> children;
  for (auto const& e : fs::directory_iterator(dir, ec)) {
    if (e.is_directory(ec)) children.push_back(e.path());
  }
  for (auto const& c : children) remove_cgroup_dir(c);
  write_kill((dir / "cgroup.kill").c_str());
  for (int i = 0; i < 2000 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(1000);
}

void remove_cgroup_tree(std::string const& root) {
  if (!root.empty()) remove_cgroup_dir(root);
}

// ---- output --------------------------------------------------------------------------------

std::string num(std::optional<double> v) {
  if (!v.has_value() || !std::isfinite(*v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", *v);
  return buf;
}

std::string human(std::optional<double> v) {
  if (!v.has_value() || !std::isfinite(*v)) return "—";
  char buf[64];
  double const a = std::fabs(*v);
  std::snprintf(buf, sizeof buf, a >= 100 ? "%.0f" : (a >= 10 ? "%.1f" : "%.3g"), *v);
  return buf;
}

std::string json_string(std::string const& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// One line: the array scripts/bench prints last with --json.
std::string to_json(std::vector<Row> const& rows) {
  std::string out = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto const& r = rows[i];
    if (i > 0) out += ",";
    out += "{\"name\":" + json_string(r.name) + ",\"unit\":" + json_string(r.unit) +
           ",\"value\":" + num(r.value) + ",\"floor_name\":" + json_string(r.floor_name) +
           ",\"floor_value\":" + num(r.floor_value) + ",\"ratio\":" + num(r.ratio()) +
           ",\"target\":" + num(r.target) +
           ",\"better\":" + json_string(r.better == Better::lower ? "lower" : "higher") +
           // A floor row has no target: it is a measurement, not a claim, so meets is null.
           ",\"meets\":" + (r.target.has_value() ? (r.meets() ? "true" : "false") : "null") +
           ",\"note\":" + json_string(r.note) + "}";
  }
  return out + "]";
}

std::string verdict(Row const& r) {
  if (!r.target.has_value()) return "floor";
  if (!r.value.has_value() || !r.floor_value.has_value()) return "not measured";
  return r.meets() ? "meets" : "MISSES";
}

std::string target_text(Row const& r) {
  if (!r.target.has_value()) return "";
  return std::string{r.better == Better::lower ? "≤ " : "≥ "} + human(r.target) + "×";
}

void print_table(std::vector<Row> const& rows) {
  std::printf("%-78s %12s %-11s %12s %8s %8s  %s\n", "row", "value", "unit", "floor", "ratio",
              "target", "verdict");
  for (auto const& r : rows) {
    std::string const name = r.name.size() > 78 ? r.name.substr(0, 75) + "..." : r.name;
    std::printf("%-78s %12s %-11s %12s %8s %8s  %s\n", name.c_str(), human(r.value).c_str(),
                r.unit.c_str(), human(r.floor_value).c_str(),
                r.ratio() ? (human(r.ratio()) + "×").c_str() : "—", target_text(r).c_str(),
                verdict(r).c_str());
  }
  for (auto const& r : rows) {
    if (!r.note.empty() && (!r.value.has_value() || !r.floor_value.has_value())) {
      std::printf("  note: %s: %s\n", r.name.c_str(), r.note.c_str());
    }
  }
}

std::string markdown(std::vector<Row> const& rows, bool quick, double secs) {
  std::ostringstream md;
  utsname u{};
  ::uname(&u);
  std::time_t const now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  md << "Measured " << when << " on " << u.sysname << " " << u.release << " " << u.machine << ", "
     << std::thread::hardware_concurrency() << " CPUs, in " << human(secs) << " s"
     << (quick ? " — **quick mode: smoke figures only, not for comparison**" : "") << ".\n\n";
  md << "| row | value | unit | floor | floor value | ratio | target | verdict |\n";
  md << "|---|---:|---|---|---:|---:|---:|---|\n";
  for (auto const& r : rows) {
    md << "| " << r.name << " | " << human(r.value) << " | " << r.unit << " | " << r.floor_name
       << " | " << human(r.floor_value) << " | " << (r.ratio() ? human(r.ratio()) + "×" : "—")
       << " | " << target_text(r) << " | " << verdict(r) << " |\n";
  }
  bool any_note = false;
  for (auto const& r : rows) {
    if (r.note.empty() || (r.value.has_value() && r.floor_value.has_value())) continue;
    if (!any_note) md << "\n";
    any_note = true;
    md << "- *" << r.name << "*: " << r.note << "\n";
  }
  return md.str();
}

int usage() {
  std::fprintf(stderr,
               "usage: custos_bench [--quick] [--json FILE] [--markdown FILE] [--noop PATH] "
               "[--custos PATH]\n"
               "                    [--work-parent DIR] [--time-limit SECONDS] [--only AREA]\n");
  return 2;
}

}  // namespace

int run(int argc, char** argv) {
  if (auto const helper = run_helper(argc, argv)) return *helper;
  Env env;
  env.noop_path = CUSTOS_BENCH_NOOP;
  env.custos_path = CUSTOS_BENCH_CUSTOS;
  std::string work_parent = CUSTOS_BENCH_WORK_PARENT;
  std::string json_file;
  std::string md_file;
  std::string only;      // --only AREA: development aid, runs the floors and one row area
  int time_limit = 280;  // the whole run, scripts/bench's build excluded, stays under 5 minutes
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&]() -> char const* { return i + 1 < argc ? argv[++i] : nullptr; };
    char const* v = nullptr;
    if (a == "--quick") {
      env.quick = true;
    } else if ((a == "--json" || a == "--markdown" || a == "--noop" || a == "--custos" ||
                a == "--work-parent" || a == "--time-limit" || a == "--only") &&
               (v = next()) != nullptr) {
      if (a == "--json") json_file = v;
      if (a == "--markdown") md_file = v;
      if (a == "--noop") env.noop_path = v;
      if (a == "--custos") env.custos_path = v;
      if (a == "--work-parent") work_parent = v;
      if (a == "--time-limit") time_limit = std::atoi(v);
      if (a == "--only") only = v;
    } else {
      return usage();
    }
  }
  if (env.noop_path.empty() || ::access(env.noop_path.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "custos_bench: the static no-op '%s' is not executable\n",
                 env.noop_path.c_str());
    return 2;
  }
  if (time_limit <= 0) return usage();
  {
    std::error_code ec;
    env.self_path = fs::read_symlink("/proc/self/exe", ec).string();
  }
  // The memory row holds ~1,000 executions with several descriptors each.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }

  // Private scratch directory (pipe/PTY drain files, SQLite databases of the rows).
  std::string tmpl = work_parent + "/custos-bench-work-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "custos_bench: mkdtemp in %s: %s\n", work_parent.c_str(),
                 std::strerror(errno));
    return 2;
  }
  env.work_dir = tmpl;
  // The launch rows' workspace: beside the daemons' state directories, never above them (a
  // workspace holding the state directory is refused, workspace.state_dir).
  if (::mkdir((env.work_dir + "/ws").c_str(), 0755) != 0) {
    std::fprintf(stderr, "custos_bench: mkdir %s/ws: %s\n", env.work_dir.c_str(),
                 std::strerror(errno));
    return 2;
  }

  std::string const mount = find_cgroup2_mount();
  std::string cg_note;
  if (mount.empty()) {
    cg_note = "no cgroup2 mount";
  } else {
    std::string const root = mount + "/custos-bench-" + std::to_string(::getpid());
    if (::mkdir(root.c_str(), 0755) == 0) {
      env.cgroup_root = root;
      std::snprintf(g_kill_path, sizeof g_kill_path, "%s/cgroup.kill", root.c_str());
    } else {
      cg_note = "cannot create " + root + ": " + std::strerror(errno);
    }
  }
  if (!cg_note.empty())
    std::fprintf(stderr, "custos_bench: %s; cgroup floors will be missing\n", cg_note.c_str());

  // The same last resort on the time limit and on an interrupt: nothing may outlive the run.
  struct sigaction sa {};
  sa.sa_handler = &on_watchdog;
  ::sigaction(SIGALRM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::alarm(static_cast<unsigned>(time_limit));
  auto const t0 = std::chrono::steady_clock::now();
  env.deadline = t0 + std::chrono::seconds(time_limit - 10);

  std::fprintf(stderr, "custos_bench: measuring floors%s...\n", env.quick ? " (quick)" : "");
  Floors const floors = measure_floors(env);
  std::vector<Row> rows = floors.rows;
  std::fprintf(stderr, "custos_bench: product rows...\n");
  for (auto const& area : product_row_fns()) {
    if (!only.empty() && only != area.name) continue;
    // Every area starts with no dirty page cache left by the one before (outside any timed
    // interval), as the floors did: writeback of an earlier area's files must not be billed to
    // the next one.
    settle_page_cache(env);
    auto more = area.fn(env, floors);
    rows.insert(rows.end(), more.begin(), more.end());
  }
  double const secs = seconds_since(t0);
  ::alarm(0);

  remove_cgroup_tree(env.cgroup_root);
  std::error_code ec;
  fs::remove_all(env.work_dir, ec);

  print_table(rows);
  if (!json_file.empty()) std::ofstream(json_file) << to_json(rows) << "\n";
  if (!md_file.empty()) std::ofstream(md_file) << markdown(rows, env.quick, secs);
  return 0;
}

}  // namespace custos::bench

int main(int argc, char** argv) {
  return custos::bench::run(argc, argv);
}
