// The registry's rows (issue 4, docs/durability.md "Benchmark rows"):
//   1. durable writes per execution, sequential, as multiples of one synchronous=FULL commit
//      (durable_overhead, bench/support, measures its own floor in the same directory and run);
//   2. the same with 16 concurrent launchers (group commit), informational;
//   3. launch throughput with 16 executions in flight through an ExecutionManager whose sink is
//      the registry (supervisor::RegistrySink on the manager's loop, as the daemon wires it),
//      against the same manager configuration with a null sink, measured in the same run in
//      alternating blocks: is the registry the bottleneck? Target >= 0.8.
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "custos/bench/durable_overhead.hpp"
#include "custos/core/plan.hpp"
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
  void record_authorized_async(std::string const& id, core::ExecutionIdentity const& identity,
                               core::ExecutionPlan const& plan, std::string const& digest,
                               std::function<void(Result<>)> done) override {
    auto const t0 = Clock::now();
    inner_->record_authorized_async(id, identity, plan, digest, std::move(done));
    authorized_us_ += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  void record_staged_async(std::string const& id, sys::PidfsIdentity const& identity,
                           sup::StagedBoundary const& boundary,
                           std::function<void(Result<>)> done) override {
    auto const t0 = Clock::now();
    inner_->record_staged_async(id, identity, boundary, std::move(done));
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
  // The asynchronous forms spend no time on the loop but their queueing.
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

// The registry sink's hand-offs without the registry: every write somebody waits for (the claim,
// staged, committed, terminal) goes to a thread of its own
// ("bench-handoff", woken as the commit thread is) and its completion comes back as a handler of
// the loop; nothing is written. For the record: what the daemon's threading of the writes costs
// the launch throughput on this host before SQLite does any work.
class HandoffSink final : public sup::OwnershipSink {
 public:
  explicit HandoffSink(boost::asio::io_context& io) : io_(&io), thread_([this] { run(); }) {}
  ~HandoffSink() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  HandoffSink(HandoffSink const&) = delete;
  HandoffSink& operator=(HandoffSink const&) = delete;

  void record_authorized_async(std::string const&, core::ExecutionIdentity const&,
                               core::ExecutionPlan const&, std::string const&,
                               std::function<void(Result<>)> done) override {
    hand(std::move(done));
  }
  void record_staged_async(std::string const&, sys::PidfsIdentity const&,
                           sup::StagedBoundary const&,
                           std::function<void(Result<>)> done) override {
    hand(std::move(done));
  }
  void when_durable(std::string const&, std::function<void(Result<>)> done) override {
    // As the registry sink when the claim's fsync finished while the child was created (the
    // usual case): at once, on the loop.
    done(ok());
  }
  void record_committed_async(std::string const&, std::function<void(Result<>)> done) override {
    hand(std::move(done));
  }
  Result<> record_phase(std::string const&, core::Phase) override { return ok(); }
  Result<> record_trigger(std::string const&, core::Trigger) override { return ok(); }
  Result<> record_output(std::string const&, sup::StreamId,
                         core::StreamAccounting const&) override {
    return ok();
  }
  void record_terminal_async(std::string const&, core::TerminalRecord const&,
                             std::function<void(Result<>)> done) override {
    hand(std::move(done));
  }

 private:
  void hand(std::function<void(Result<>)> done) {
    {
      std::lock_guard<std::mutex> g(mu_);
      queue_.push_back(std::move(done));
    }
    cv_.notify_one();
  }
  void run() {
    ::pthread_setname_np(::pthread_self(), "bench-handoff");
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      auto batch = std::move(queue_);
      queue_.clear();
      lk.unlock();
      for (auto& done : batch) boost::asio::post(*io_, [done = std::move(done)] { done(ok()); });
      lk.lock();
    }
  }

  boost::asio::io_context* io_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void(Result<>)>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// What a Launcher writes through.
enum class SinkKind { null, registry, handoff };

// One ExecutionManager on its own loop, cgroup subtree and directory; with a registry sink or
// none. Everything it created is removed by the destructor.
class Launcher {
 public:
  Launcher(Env const& env, std::string const& name, SinkKind kind) {
    if (!env.cgroup_root.empty()) {
      std::string const sub = env.cgroup_root + "/" + name;
      if (::mkdir(sub.c_str(), 0755) == 0) subtree_ = sub;
    }
    dir_ = fs::path(env.work_dir) / name;
    std::error_code ec;
    fs::create_directories(dir_ / "ws", ec);
    if (kind == SinkKind::handoff) {
      handoff_ = std::make_unique<HandoffSink>(io_);
      timed_ = std::make_unique<TimedSink>(*handoff_);
    } else if (kind == SinkKind::registry) {
      auto reg = registry::Registry::open(dir_ / "registry");
      if (!reg) {
        error_ = "registry: " + reg.error().message();
      } else {
        registry_ = std::move(*reg);
        sink_ = std::make_unique<sup::RegistrySink>(*registry_, io_);
        timed_ = std::make_unique<TimedSink>(*sink_);
      }
    }
    sup::ManagerConfig cfg = bench_manager_config(subtree_, dir_);
    cfg.sink = timed_.get();
    mgr_ = std::make_unique<sup::ExecutionManager>(io_, std::move(cfg));
    // As the daemon wires it.
    if (sink_) sink_->set_solo_probe([m = mgr_.get()] { return m->live_count() <= 1; });
  }
  Launcher(Launcher const&) = delete;
  Launcher& operator=(Launcher const&) = delete;

  ~Launcher() {
    cancel_remaining(*mgr_, io_);
    if (sink_) sink_->set_solo_probe(nullptr);  // it asks the manager
    mgr_.reset();
    // The sink joins its flush thread (committing what is deferred), then the registry closes.
    timed_.reset();
    sink_.reset();
    handoff_.reset();
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
  std::unique_ptr<HandoffSink> handoff_;
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

// 16 launches kept in flight on side `a` and on the null-sink side `b`, in alternating blocks
// (sharing the host's noise; which side goes first alternates too): launches per second over
// each side's whole measured time, with CPU figures per launch for the note.
struct AbResult {
  double a_per_s = 0, b_per_s = 0;
  std::size_t n = 0;                          // launches per side
  double a_cpu = 0, b_cpu = 0;                // this process, every thread
  double a_busy = 0, b_busy = 0;              // the whole machine
  double a_wall2 = 0, b_wall2 = 0;            // wall x 2 CPUs
  std::map<std::string, double> a_by_thread;  // side a, per thread name
  std::string error;

  // `us` over side a's launches, as a note prints it.
  [[nodiscard]] std::string per_launch(double us) const {
    return std::to_string(static_cast<long>(us / static_cast<double>(n))) + " us";
  }
};

AbResult measure_ab(Env const& env, Launcher& a, Launcher& b, std::string const& a_name) {
  AbResult out;
  constexpr std::size_t kInFlight = 16;
  std::size_t const per_block = kInFlight * (env.quick ? 10 : 30);
  int const blocks = env.quick ? 2 : 4;
  double secs_a = 0, secs_b = 0;
  for (int blk = 0; blk < blocks; ++blk) {
    for (int side = 0; side < 2; ++side) {
      bool const on_a = (blk + side) % 2 == 0;
      std::string why;
      double const cpu0 = process_cpu_us();
      double const busy0 = machine_busy_us();
      auto const threads0 = thread_cpu_us_by_name();
      auto rate = (on_a ? a : b).concurrent(env.noop_path, kInFlight, per_block, env.deadline, why);
      if (!rate) {
        out.error = (on_a ? a_name : std::string{"null sink"}) + ": " + why;
        return out;
      }
      if (on_a) {
        for (auto const& [name, us] : thread_cpu_us_by_name()) {
          auto it = threads0.find(name);
          out.a_by_thread[name] += us - (it == threads0.end() ? 0.0 : it->second);
        }
      }
      (on_a ? out.a_cpu : out.b_cpu) += process_cpu_us() - cpu0;
      (on_a ? out.a_busy : out.b_busy) += machine_busy_us() - busy0;
      (on_a ? secs_a : secs_b) += static_cast<double>(per_block) / *rate;
      if (on_a) out.n += per_block;
    }
  }
  out.a_per_s = static_cast<double>(out.n) / secs_a;
  out.b_per_s = static_cast<double>(out.n) / secs_b;
  out.a_wall2 = secs_a * 2e6;
  out.b_wall2 = secs_b * 2e6;
  return out;
}

// The CPU part of a concurrent row's note: per launch, side a against the null side.
std::string cpu_note(AbResult const& r, std::string const& a_name) {
  std::string note =
      "the process's CPU per launch (every thread): " + a_name + " side " + r.per_launch(r.a_cpu) +
      ", null side " + r.per_launch(r.b_cpu) + "; the machine's busy CPU per launch: " + a_name +
      " side " + r.per_launch(r.a_busy) + ", null side " + r.per_launch(r.b_busy) +
      "; wall per launch x 2 CPUs: " + a_name + " side " + r.per_launch(r.a_wall2) +
      ", null side " + r.per_launch(r.b_wall2) + "; " + a_name + " side CPU by thread:";
  for (auto const& [name, us] : r.a_by_thread) {
    if (us > 0) note += " " + name + " " + r.per_launch(us);
  }
  return note;
}

// A launches/s row against the same manager with a null sink, for the record (no target).
Row record_row(std::string name) {
  return Row{std::move(name), "launches/s",
             std::nullopt,    "same manager, null sink (same run, alternating blocks)",
             std::nullopt,    std::nullopt,
             Better::higher,  ""};
}

bool usable(Launcher const& a, Launcher const& b, Row& row) {
  if (!a.error().empty()) {
    row.note = a.error();
    return false;
  }
  if (!a.has_cgroup() || !b.has_cgroup()) {
    row.note = "no writable cgroup v2 for the executions";
    return false;
  }
  return true;
}

Row concurrent_launch_row(Env const& env) {
  // A measurement without a target: on a 2-core host any CPU the registry uses shows up here;
  // the end-to-end 16-client rpc row is the one that counts.
  Row row = unmeasured(
      "registry: 16 concurrent launches through the registry sink vs the same manager with a "
      "null sink (for the record)",
      "launches/s", "same manager, null sink (same run, alternating blocks)", std::nullopt, 0,
      Better::higher, "");
  row.target.reset();
  Launcher with(env, "reg-with", SinkKind::registry);
  Launcher without(env, "reg-without", SinkKind::null);
  if (!usable(with, without, row)) return row;
  auto const before = with.registry()->write_stats();
  AbResult const r = measure_ab(env, with, without, "registry");
  if (!r.error.empty()) {
    row.note = r.error;
    return row;
  }
  auto const after = with.registry()->write_stats();
  row.value = r.a_per_s;
  row.floor_value = r.b_per_s;
  row.note = std::to_string(r.n) + " launches each side; registry: " +
             std::to_string(after.transactions - before.transactions) + " transactions (" +
             std::to_string(after.full_commits - before.full_commits) + " FULL) for " +
             std::to_string(after.writes - before.writes) + " writes; time in the sink per " +
             "launch: claim+record " + r.per_launch(with.timed()->authorized_us()) + ", the rest " +
             r.per_launch(with.timed()->other_us()) + "; " + cpu_note(r, "registry");
  return row;
}

// For the record, beside the row above: the same manager and the same hand-offs (every write
// somebody waits for goes to a thread and comes back as a handler of the loop) with nothing
// written. The distance from this row to the one above is what the registry's own work costs;
// the distance from this row to 1 is the threading's.
Row handoff_launch_row(Env const& env) {
  Row row = record_row(
      "registry: the same 16 concurrent launches through a hand-off-only sink (the registry "
      "sink's thread hand-offs, no SQLite), for the record");
  Launcher with(env, "reg-handoff", SinkKind::handoff);
  Launcher without(env, "reg-handoff-null", SinkKind::null);
  if (!usable(with, without, row)) return row;
  AbResult const r = measure_ab(env, with, without, "hand-off");
  if (!r.error.empty()) {
    row.note = r.error;
    return row;
  }
  row.value = r.a_per_s;
  row.floor_value = r.b_per_s;
  row.note = std::to_string(r.n) + " launches each side; " + cpu_note(r, "hand-off");
  return row;
}

// One launch at a time through the registry sink: how many transactions the daemon's loop
// really makes per execution (the sequential durable-writes row models four), and what the
// registry adds to a lone launch + wait. Informational: no target.
Row sequential_launch_row(Env const& env) {
  Row row = record_row("registry: launch + wait one at a time, registry sink vs null sink");
  Launcher with(env, "reg-seq-with", SinkKind::registry);
  Launcher without(env, "reg-seq-without", SinkKind::null);
  if (!usable(with, without, row)) return row;
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
  // durable_overhead (bench/support) measures its own FULL-commit floor in the same directory
  // and run right before the product figures, so the ratio compares like with like
  // (docs/durability.md "Benchmark rows").
  std::size_t const n = env.quick ? 50 : 400;
  auto r = durable_overhead(env.work_dir, n, 16);
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
  Row txn{
      "registry: CPU of one waited NORMAL transaction changing a record (committed + "
      "running), against SQLite's own UPDATE + COMMIT of the same row",
      "us",
      std::nullopt,
      "the same file, VFS and pragmas, BEGIN IMMEDIATE + UPDATE + COMMIT of the row (same run)",
      std::nullopt,
      1.5,
      Better::lower,
      ""};
  if (!r) {
    seq.note = par.note = txn.note = r.error().message();
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
    txn.value = r->running_txn_cpu_us;
    txn.floor_value = r->sqlite_txn_cpu_us;
    char terminal[32];
    std::snprintf(terminal, sizeof terminal, "%.1f", r->terminal_txn_cpu_us);
    txn.note = std::to_string(r->executions) +
               " executions, medians of the writing thread's CPU clock; the terminal transaction "
               "(exited, closed, two accountings and the terminal record, one transaction): " +
               terminal + " us";
  }
  return {seq,
          par,
          txn,
          sequential_launch_row(env),
          concurrent_launch_row(env),
          handoff_launch_row(env)};
}

}  // namespace custos::bench
