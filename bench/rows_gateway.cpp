// The gateway row (issue 6): authorization overhead per exec.start.
//
// Both sides run in this process, in the same run, against a real registry in the work dir and
// the same ExecutionManager set-up, launching the static no-op and waiting for its terminal
// record:
//   floor  the registry's own sink: the one-use claim consumed (synchronous=FULL) and the
//          record created, no authority check — a start whose authorization was settled
//          elsewhere;
//   value  the daemon's chain: ExecutionGateway::start with a grant (budget, ceilings) and a
//          writable workspace under its lease; the cross-check, budget begin and lease use run
//          in the claim's transaction, and the budget is settled at the terminal record.
// Target: value / floor <= 1.2.
#include <boost/asio/io_context.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "custos/gateway/gateway.hpp"
#include "custos/registry/registry.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/registry_sink.hpp"

#include "../tests/support/gateway_start.hpp"
#include "../tests/support/launch_permit_minter.hpp"
#include "bench.hpp"
#include "launch_request.hpp"

namespace custos::bench {
namespace {

namespace fs = std::filesystem;
namespace sup = custos::supervisor;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class GatewayHarness {
 public:
  GatewayHarness(Env const& env, std::string const& name, bool through_gateway)
      : through_gateway_(through_gateway) {
    if (!env.cgroup_root.empty()) {
      std::string const sub = env.cgroup_root + "/" + name;
      if (::mkdir(sub.c_str(), 0755) == 0) subtree_ = sub;
    }
    dir_ = fs::path(env.work_dir) / name;
    std::error_code ec;
    fs::create_directories(dir_ / "ws", ec);
    auto reg = registry::Registry::open(dir_ / "registry");
    if (!reg) {
      error_ = reg.error().message();
      return;
    }
    reg_ = std::move(*reg);
    inner_ = std::make_unique<sup::RegistrySink>(*reg_, io_);
    db_ = std::make_unique<gateway::RegistryDatabase>(*reg_);
    store_ = std::make_unique<gateway::AuthorityStore>(*db_);
    gw_ = std::make_unique<gateway::ExecutionGateway>(
        io_, *store_, gateway::GatewayOptions{reg_.get(), inner_.get()});
    sup::ManagerConfig cfg = bench_manager_config(subtree_, dir_);
    cfg.sink = through_gateway ? &gw_->sink() : static_cast<sup::OwnershipSink*>(inner_.get());
    mgr_ = std::make_unique<sup::ExecutionManager>(io_, std::move(cfg));
    gw_->attach(*mgr_);
    if (through_gateway) setup_authority();
  }

  GatewayHarness(GatewayHarness const&) = delete;
  GatewayHarness& operator=(GatewayHarness const&) = delete;

  ~GatewayHarness() {
    if (mgr_) cancel_remaining(*mgr_, io_);
    mgr_.reset();
    gw_.reset();
    store_.reset();
    db_.reset();
    inner_.reset();
    reg_.reset();
    remove_bench_dirs(subtree_, dir_);
  }

  [[nodiscard]] std::string const& error() const { return error_; }
  [[nodiscard]] bool has_cgroup() const { return !subtree_.empty(); }

  Result<sup::StartResult> start(std::string const& exe) {
    sup::LaunchRequest r = bench_request(++seq_, /*revision=*/0);
    r.plan.command.executable = exe;
    r.plan.command.argv = {exe};
    r.plan.workspace.root = (dir_ / "ws").string();
    r.plan.workspace.access = core::WorkspaceAccess::writable;
    r.plan.limits.wall_ms = 10'000;
    r.plan.limits.cpu_ms = 10'000;
    if (!through_gateway_) return sup::start_with_test_permit(*mgr_, std::move(r));
    gateway::AuthorityClaim c;
    c.epoch = epoch_;
    c.grant_id = "g-bench";
    c.lease_id = lease_id_;
    gateway::Caller caller{r.caller.uid, r.caller.gid, {}, false};
    return gateway::start_and_wait(*gw_, io_, caller, std::move(r), c);
  }

  bool drive(std::function<bool()> const& pred, std::chrono::milliseconds timeout) {
    return drive_until(io_, pred, timeout);
  }

  bool wait_exited(std::string const& id) {
    std::optional<Result<core::TerminalRecord>> got;
    mgr_->wait(id, 10s, [&](Result<core::TerminalRecord> r) {
      got = std::move(r);
      io_.stop();
    });
    drive([&] { return got.has_value(); }, 15s);
    return got && *got && (*got)->classification == core::Classification::exited;
  }

 private:
  void setup_authority() {
    gateway::Grant g;
    g.id = "g-bench";
    g.principal =
        gateway::Principal{gateway::PrincipalKind::uid, static_cast<std::uint32_t>(::geteuid())};
    g.operations = {gateway::OperationClass::exec_native};
    g.executables = {gateway::ExecutableRule{"/", true}};
    g.workspaces = {
        gateway::WorkspaceRule{"w1", (dir_ / "ws").string(), core::WorkspaceAccess::writable}};
    g.environment_ids = {"env1"};
    g.resource_ids = {"res1"};
    g.ceilings.wall_ms = 60'000;
    g.budget.executions = 1'000'000;
    g.budget.cpu_ms = 1'000'000'000;
    gateway::Caller admin{
        static_cast<std::uint32_t>(::geteuid()), static_cast<std::uint32_t>(::getegid()), {}, true};
    if (auto r = gw_->grant(admin, g); !r) {
      error_ = r.error().message();
      return;
    }
    auto l = gw_->acquire_lease(admin, "w1", "bench");
    if (!l) {
      error_ = l.error().message();
      return;
    }
    lease_id_ = l->id;
    auto e = gw_->epoch();
    if (!e) {
      error_ = e.error().message();
      return;
    }
    epoch_ = *e;
  }

  bool through_gateway_;
  boost::asio::io_context io_;
  std::string subtree_;
  fs::path dir_;
  std::string error_;
  std::unique_ptr<registry::Registry> reg_;
  std::unique_ptr<sup::RegistrySink> inner_;
  std::unique_ptr<gateway::RegistryDatabase> db_;
  std::unique_ptr<gateway::AuthorityStore> store_;
  std::unique_ptr<gateway::ExecutionGateway> gw_;
  std::unique_ptr<sup::ExecutionManager> mgr_;
  std::uint64_t seq_ = 0;
  std::uint64_t epoch_ = 0;
  std::string lease_id_;
};

// Median start+wait of the no-op in ms, alternating blocks of both sides so drift of the host
// (page cache, CPU frequency) lands on both equally.
bool measure(Env const& env, double& floor_ms, double& value_ms, std::string& why) {
  GatewayHarness base(env, "gw-floor", false);
  GatewayHarness gated(env, "gw-value", true);
  if (!base.error().empty() || !gated.error().empty()) {
    why = "set-up failed: " + base.error() + gated.error();
    return false;
  }
  std::size_t const blocks = env.quick ? 4 : 20;
  std::size_t const per_block = 10;
  std::vector<double> fl;
  std::vector<double> va;
  for (std::size_t b = 0; b < blocks && Clock::now() < env.deadline; ++b) {
    for (int side = 0; side < 2; ++side) {
      GatewayHarness& h = side == 0 ? base : gated;
      for (std::size_t i = 0; i < per_block; ++i) {
        auto const t0 = Clock::now();
        auto r = h.start(env.noop_path);
        if (!r) {
          why = std::string{side == 0 ? "floor" : "gateway"} +
                " start failed: " + r.error().message();
          return false;
        }
        if (!h.wait_exited(r->execution_id)) {
          why = "the no-op did not end as exited";
          return false;
        }
        (side == 0 ? fl : va).push_back(seconds_since(t0) * 1000.0);
      }
    }
  }
  if (fl.empty() || va.empty()) {
    why = "no time left in the run";
    return false;
  }
  floor_ms = median(fl);
  value_ms = median(va);
  return true;
}

}  // namespace

std::vector<Row> gateway_rows(Env const& env, Floors const& /*floors*/) {
  Row r;
  r.name = "gateway: exec.start+wait with authorization (grant, budget, writable lease)";
  r.unit = "ms";
  r.floor_name = "the same start+wait with the registry's claim and no authority check, same run";
  r.target = 1.2;
  r.better = Better::lower;
  double floor_ms = 0;
  double value_ms = 0;
  std::string why;
  if (measure(env, floor_ms, value_ms, why)) {
    r.floor_value = floor_ms;
    r.value = value_ms;
    r.note = "medians of alternating blocks of 10";
  } else {
    r.note = why;
  }
  return {r};
}

}  // namespace custos::bench
