// The registry's rows (issue 4, docs/durability.md "Benchmark rows"):
//   1. durable writes per execution, sequential, as multiples of one synchronous=FULL commit
//      (registry::bench_durable_overhead measures its own floor in the same directory and run);
//   2. the same with 16 concurrent launchers (group commit), informational;
//   3. launch throughput with 16 executions in flight through an ExecutionManager whose sink is
//      the registry (supervisor::RegistrySink on the manager's loop, as the daemon wires it),
//      against the same manager configuration with a null sink, measured in the same run in
//      alternating blocks: is the registry the bottleneck? Target >= 0.8.
#include <boost/asio/io_context.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "custos/core/plan.hpp"
#include "custos/registry/bench.hpp"
#include "custos/registry/registry.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/registry_sink.hpp"
#include "custos/sys/identity.hpp"

#include "../tests/support/launch_permit_minter.hpp"
#include "bench.hpp"
#include "launch_request.hpp"

namespace custos::bench {
namespace {

namespace fs = std::filesystem;
namespace sup = custos::supervisor;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Forwards to the registry sink and adds up the time spent in it on the manager's loop (the
// posted per-turn flushes run outside it and are not counted here).
class TimedSink final : public sup::OwnershipSink {
 public:
  explicit TimedSink(sup::OwnershipSink& inner) noexcept : inner_(&inner) {}
  Result<> record_authorized(std::string const& id, core::ExecutionIdentity const& identity,
                             core::ExecutionPlan const& plan, std::string const& digest) override {
    return timed(authorized_us_,
                 [&] { return inner_->record_authorized(id, identity, plan, digest); });
  }
  void record_authorized_async(std::string const& id, core::ExecutionIdentity const& identity,
                               core::ExecutionPlan const& plan, std::string const& digest,
                               std::function<void(Result<>)> done) override {
    auto const t0 = Clock::now();
    inner_->record_authorized_async(id, identity, plan, digest, std::move(done));
    authorized_us_ += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  Result<> record_staged(std::string const& id, sys::PidfsIdentity const& identity,
                         sup::Boundary boundary, std::string const& cgroup_path,
                         std::string const& marker) override {
    return timed(other_us_, [&] {
      return inner_->record_staged(id, identity, boundary, cgroup_path, marker);
    });
  }
  Result<> record_committed(std::string const& id) override {
    return timed(other_us_, [&] { return inner_->record_committed(id); });
  }
  void record_staged_async(std::string const& id, sys::PidfsIdentity const& identity,
                           sup::Boundary boundary, std::string const& cgroup_path,
                           std::string const& marker, std::function<void(Result<>)> done) override {
    auto const t0 = Clock::now();
    inner_->record_staged_async(id, identity, boundary, cgroup_path, marker, std::move(done));
    other_us_ += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  void record_committed_async(std::string const& id, std::function<void(Result<>)> done) override {
    auto const t0 = Clock::now();
    inner_->record_committed_async(id, std::move(done));
    other_us_ += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  Result<> record_phase(std::string const& id, core::Phase phase) override {
    return timed(other_us_, [&] { return inner_->record_phase(id, phase); });
  }
  Result<> record_trigger(std::string const& id, core::Trigger trigger) override {
    return timed(other_us_, [&] { return inner_->record_trigger(id, trigger); });
  }
  Result<> record_output(std::string const& id, sup::StreamId stream,
                         core::StreamAccounting const& accounting) override {
    return timed(other_us_, [&] { return inner_->record_output(id, stream, accounting); });
  }
  Result<> record_terminal(std::string const& id, core::TerminalRecord const& record) override {
    return timed(other_us_, [&] { return inner_->record_terminal(id, record); });
  }
  // The waits and the daemon's non-blocking forms go through too (the time of the blocking
  // wait counts; the asynchronous forms spend none on the loop but their queueing).
  Result<> make_durable(std::string const& id) override {
    return timed(other_us_, [&] { return inner_->make_durable(id); });
  }
  void when_durable(std::string const& id, std::function<void(Result<>)> done) override {
    inner_->when_durable(id, std::move(done));
  }
  void record_terminal_async(std::string const& id, core::TerminalRecord const& record,
                             std::function<void(Result<>)> done) override {
    auto const t0 = Clock::now();
    inner_->record_terminal_async(id, record, std::move(done));
    other_us_ += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  [[nodiscard]] double authorized_us() const { return authorized_us_; }
  [[nodiscard]] double other_us() const { return other_us_; }

 private:
  template <class F>
  Result<> timed(double& acc, F&& f) {
    auto const t0 = Clock::now();
    auto r = f();
    acc += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    return r;
  }
  sup::OwnershipSink* inner_;
  double authorized_us_ = 0;
  double other_us_ = 0;
};

// One ExecutionManager on its own loop, cgroup subtree and directory; with a registry sink or
// none. Everything it created is removed by the destructor.
class Launcher {
 public:
  Launcher(Env const& env, std::string const& name, bool with_registry) {
    if (!env.cgroup_root.empty()) {
      std::string const sub = env.cgroup_root + "/" + name;
      if (::mkdir(sub.c_str(), 0755) == 0) subtree_ = sub;
    }
    dir_ = fs::path(env.work_dir) / name;
    std::error_code ec;
    fs::create_directories(dir_ / "ws", ec);
    if (with_registry) {
      auto reg = registry::Registry::open(dir_ / "registry");
      if (!reg) {
        error_ = "registry: " + reg.error().message();
      } else {
        registry_ = std::move(*reg);
        sink_ = std::make_unique<sup::RegistrySink>(*registry_, &io_);
        timed_ = std::make_unique<TimedSink>(*sink_);
      }
    }
    sup::ManagerConfig cfg = bench_manager_config(subtree_, dir_);
    cfg.sink = timed_.get();
    mgr_ = std::make_unique<sup::ExecutionManager>(io_, std::move(cfg));
  }
  Launcher(Launcher const&) = delete;
  Launcher& operator=(Launcher const&) = delete;

  ~Launcher() {
    cancel_remaining(*mgr_, io_);
    mgr_.reset();
    // The sink joins its flush thread (committing what is deferred), then the registry closes.
    timed_.reset();
    sink_.reset();
    registry_.reset();
    remove_bench_dirs(subtree_, dir_);
  }

  [[nodiscard]] std::string const& error() const { return error_; }
  [[nodiscard]] bool has_cgroup() const { return !subtree_.empty(); }
  [[nodiscard]] registry::Registry* registry() const { return registry_.get(); }
  [[nodiscard]] TimedSink const* timed() const { return timed_.get(); }

  sup::LaunchRequest request_for(std::string const& program) {
    sup::LaunchRequest r = bench_request(++seq_);
    r.plan.command.executable = program;
    r.plan.command.argv = {program};
    r.plan.workspace.root = (dir_ / "ws").string();
    return r;
  }

  // `total` launches of `program` with `in_flight` kept running, each through the daemon's
  // event-loop launch (start_async); launches per second, or nothing with `why` set.
  std::optional<double> concurrent(std::string const& program, std::size_t in_flight_max,
                                   std::size_t total, Clock::time_point deadline,
                                   std::string& why) {
    return launches_per_second(
        *mgr_, io_, AsyncStart{[&](std::function<void(Result<sup::StartResult>)> done) {
          sup::start_async_with_test_permit(*mgr_, request_for(program), std::move(done));
        }},
        in_flight_max, total, deadline, why);
  }

 private:
  bool drive(std::function<bool()> const& pred, std::chrono::milliseconds timeout) {
    return drive_until(io_, pred, timeout);
  }

  boost::asio::io_context io_;
  std::string subtree_;
  fs::path dir_;
  std::string error_;
  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<sup::RegistrySink> sink_;
  std::unique_ptr<TimedSink> timed_;
  std::unique_ptr<sup::ExecutionManager> mgr_;
  std::uint64_t seq_ = 0;
};

// CPU time of this whole process (every thread: the loop, the sink's flush thread, the
// registry's flusher, and the kernel work done for them), in microseconds.
double process_cpu_us() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto us = [](timeval t) {
    return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_usec);
  };
  return us(ru.ru_utime) + us(ru.ru_stime);
}

// Busy CPU time of the whole machine (every CPU, user + system + irq, not idle or iowait), in
// microseconds, from /proc/stat: what the children, the kernel threads (journal, writeback,
// cgroup removal) and other processes took as well.
double machine_busy_us() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  double const tick_us = 1e6 / static_cast<double>(::sysconf(_SC_CLK_TCK));
  return (user + nice + system + irq + softirq + steal) * tick_us;
}

// CPU time per thread name of this process (utime + stime from /proc/self/task/*/stat), in
// microseconds: the loop runs on the bench's main thread, the sink's transactions on
// "custos-commit", the registry's fdatasyncs on "custos-fsync".
std::map<std::string, double> thread_cpu_us_by_name() {
  std::map<std::string, double> out;
  double const tick_us = 1e6 / static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::error_code ec;
  for (auto const& e : fs::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(e.path() / "comm");
    std::ifstream stat(e.path() / "stat");
    std::string name, line;
    std::getline(comm, name);
    std::getline(stat, line);
    auto const close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stod(field);
      if (i == 15) stime = std::stod(field);
    }
    out[name] += (utime + stime) * tick_us;
  }
  return out;
}

Row concurrent_launch_row(Env const& env) {
  Row row = unmeasured(
      "registry: 16 concurrent launches through the registry sink vs the same manager with a "
      "null sink",
      "launches/s", "same manager, null sink (same run, alternating blocks)", std::nullopt, 0.8,
      Better::higher, "");
  Launcher with(env, "reg-with", true);
  Launcher without(env, "reg-without", false);
  if (!with.error().empty()) {
    row.note = with.error();
    return row;
  }
  if (!with.has_cgroup() || !without.has_cgroup()) {
    row.note = "no writable cgroup v2 for the executions";
    return row;
  }
  // Alternating blocks share the host's noise between both sides; the sums give launches/s
  // over each side's whole measured time.
  constexpr std::size_t kInFlight = 16;
  std::size_t const per_block = kInFlight * (env.quick ? 10 : 30);
  int const blocks = env.quick ? 2 : 4;
  double secs_with = 0, secs_without = 0;
  double cpu_with = 0, cpu_without = 0;
  double busy_with = 0, busy_without = 0;
  std::map<std::string, double> by_thread;  // registry side
  std::size_t n_with = 0, n_without = 0;
  auto const before = with.registry()->write_stats();
  for (int b = 0; b < blocks; ++b) {
    std::string why;
    for (int side = 0; side < 2; ++side) {
      // Which side goes first alternates too.
      bool const reg_side = (b + side) % 2 == 0;
      Launcher& l = reg_side ? with : without;
      double const cpu0 = process_cpu_us();
      double const busy0 = machine_busy_us();
      auto const threads0 = thread_cpu_us_by_name();
      auto rate = l.concurrent(env.noop_path, kInFlight, per_block, env.deadline, why);
      if (reg_side) {
        for (auto const& [name, us] : thread_cpu_us_by_name()) {
          auto it = threads0.find(name);
          by_thread[name] += us - (it == threads0.end() ? 0.0 : it->second);
        }
      }
      if (!rate) {
        row.note = std::string{reg_side ? "registry sink: " : "null sink: "} + why;
        return row;
      }
      (reg_side ? cpu_with : cpu_without) += process_cpu_us() - cpu0;
      (reg_side ? busy_with : busy_without) += machine_busy_us() - busy0;
      (reg_side ? secs_with : secs_without) += static_cast<double>(per_block) / *rate;
      (reg_side ? n_with : n_without) += per_block;
    }
  }
  auto const after = with.registry()->write_stats();
  row.value = static_cast<double>(n_with) / secs_with;
  row.floor_value = static_cast<double>(n_without) / secs_without;
  auto const per_launch = [&](double us) {
    return std::to_string(static_cast<long>(us / static_cast<double>(n_with))) + " us";
  };
  row.note =
      std::to_string(n_with) +
      " launches each side; registry: " + std::to_string(after.transactions - before.transactions) +
      " transactions (" + std::to_string(after.full_commits - before.full_commits) + " FULL) for " +
      std::to_string(after.writes - before.writes) + " writes; time in the sink per " +
      "launch: claim+record " + per_launch(with.timed()->authorized_us()) + ", the rest " +
      per_launch(with.timed()->other_us()) + "; the process's CPU per launch (every " +
      "thread): registry side " + per_launch(cpu_with) + ", null side " + per_launch(cpu_without) +
      "; the machine's busy CPU per launch: registry side " + per_launch(busy_with) +
      ", null side " + per_launch(busy_without) + "; wall per launch x 2 CPUs: registry side " +
      per_launch(secs_with * 2e6) + ", null side " + per_launch(secs_without * 2e6) +
      "; registry side CPU by thread:";
  for (auto const& [name, us] : by_thread) {
    if (us > 0) row.note += " " + name + " " + per_launch(us);
  }
  return row;
}

// One launch at a time through the registry sink: how many transactions the daemon's loop
// really makes per execution (the sequential durable-writes row models four), and what the
// registry adds to a lone launch + wait. Informational: no target.
Row sequential_launch_row(Env const& env) {
  Row row{"registry: launch + wait one at a time, registry sink vs null sink",
          "launches/s",
          std::nullopt,
          "same manager, null sink (same run, alternating blocks)",
          std::nullopt,
          std::nullopt,
          Better::higher,
          ""};
  Launcher with(env, "reg-seq-with", true);
  Launcher without(env, "reg-seq-without", false);
  if (!with.error().empty() || !with.has_cgroup() || !without.has_cgroup()) {
    row.note = with.error().empty() ? "no writable cgroup v2 for the executions" : with.error();
    return row;
  }
  std::size_t const per_block = env.quick ? 40 : 150;
  double secs_with = 0, secs_without = 0;
  std::size_t n = 0;
  auto const before = with.registry()->write_stats();
  for (int b = 0; b < 2; ++b) {
    for (int side = 0; side < 2; ++side) {
      bool const reg_side = (b + side) % 2 == 0;
      std::string why;
      auto rate =
          (reg_side ? with : without).concurrent(env.noop_path, 1, per_block, env.deadline, why);
      if (!rate) {
        row.note = why;
        return row;
      }
      (reg_side ? secs_with : secs_without) += static_cast<double>(per_block) / *rate;
      if (reg_side) n += per_block;
    }
  }
  auto const after = with.registry()->write_stats();
  row.value = static_cast<double>(n) / secs_with;
  row.floor_value = static_cast<double>(n) / secs_without;
  double const txns = static_cast<double>(after.transactions - before.transactions);
  char per[32];
  std::snprintf(per, sizeof per, "%.2f", txns / static_cast<double>(n));
  row.note = std::to_string(n) + " launches each side; " + per +
             " registry transactions per launch (the durable-writes row models 4)";
  return row;
}

}  // namespace

std::vector<Row> registry_rows(Env const& env, Floors const& /*f*/) {
  // registry::bench_durable_overhead measures its own FULL-commit floor in the same directory
  // and run right before the product figures, so the ratio compares like with like
  // (docs/durability.md "Benchmark rows").
  std::size_t const n = env.quick ? 50 : 400;
  auto r = registry::bench_durable_overhead(env.work_dir, n, 16);
  Row seq{
      "registry: durable writes per execution, sequential (claim+record with group durability "
      "awaited, then NORMAL transactions)",
      "us",
      std::nullopt,
      "one SQLite WAL synchronous=FULL commit (same run)",
      std::nullopt,
      1.5,
      Better::lower,
      ""};
  Row par{"registry: durable writes per execution, 16 concurrent launchers (group commit)",
          "us",
          std::nullopt,
          "one SQLite WAL synchronous=FULL commit (same run)",
          std::nullopt,
          std::nullopt,
          Better::lower,
          ""};
  if (!r) {
    seq.note = par.note = r.error().message();
  } else {
    seq.value = r->sequential_us;
    seq.floor_value = r->full_commit_us;
    char cpu[32];
    std::snprintf(cpu, sizeof cpu, "%.0f", r->sequential_cpu_us);
    seq.note = std::to_string(r->executions) + " executions, median; " + cpu +
               " us of the writing thread's CPU per execution";
    par.value = r->concurrent_us;
    par.floor_value = r->full_commit_us;
    par.note = std::to_string(r->concurrent_transactions) + " transactions and " +
               std::to_string(r->concurrent_full_commits + r->concurrent_flushes) + " fsyncs for " +
               std::to_string(r->concurrent_writes) + " writes";
  }
  return {seq, par, sequential_launch_row(env), concurrent_launch_row(env)};
}

}  // namespace custos::bench
