// RegistrySink: the OwnershipSink backed by the SQLite registry — the wiring the daemon passes
// in ManagerConfig::sink. Each call is one registry write; the registry decides durability
// (the claim is FULL-synced; ownership and phases survive a daemon crash) and fires its crash
// failpoints (docs/durability.md).
#pragma once

#include "custos/registry/registry.hpp"
#include "custos/supervisor/ownership_sink.hpp"

namespace custos::supervisor {

class RegistrySink final : public OwnershipSink {
 public:
  // `registry` must outlive the sink (the daemon owns both).
  explicit RegistrySink(registry::Registry& registry) noexcept : registry_(&registry) {}

  // consume_claim(action_id, process_id) + create the record (phase authorized). A claim that
  // was ever consumed before is registry.claim_consumed: nothing is launched.
  [[nodiscard]] Result<> record_authorized(std::string const& execution_id,
                                           core::ExecutionIdentity const& identity,
                                           core::ExecutionPlan const& plan,
                                           std::string const& plan_digest) override;
  [[nodiscard]] Result<> record_staged(std::string const& execution_id,
                                       sys::PidfsIdentity const& identity, Boundary boundary,
                                       std::string const& cgroup_path,
                                       std::string const& marker_value) override;
  [[nodiscard]] Result<> record_committed(std::string const& execution_id) override;
  [[nodiscard]] Result<> record_phase(std::string const& execution_id, core::Phase phase) override;
  [[nodiscard]] Result<> record_trigger(std::string const& execution_id,
                                        core::Trigger trigger) override;
  [[nodiscard]] Result<> record_output(std::string const& execution_id, StreamId stream,
                                       core::StreamAccounting const& accounting) override;
  [[nodiscard]] Result<> record_terminal(std::string const& execution_id,
                                         core::TerminalRecord const& record) override;

 private:
  registry::Registry* registry_;
};

}  // namespace custos::supervisor
