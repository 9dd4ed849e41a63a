// rpc-internal helpers shared by exec_methods.cpp (the manager-direct handlers) and
// gateway_methods.cpp (the same methods routed through the gateway), so each rule is written
// once. Not a public header: nothing outside src/rpc includes it.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "custos/backend/backend.hpp"
#include "custos/core/identity.hpp"
#include "custos/core/json_fields.hpp"
#include "custos/core/plan.hpp"
#include "custos/core/result.hpp"
#include "custos/rpc/dispatcher.hpp"
#include "custos/sandbox/plan.hpp"

namespace custos::registry {
class Registry;
struct ExecutionRecord;
}  // namespace custos::registry
namespace custos::supervisor {
class ExecutionManager;
struct Event;
}  // namespace custos::supervisor

namespace custos::rpc::detail {

// The codes of a method's param findings: all rpc.invalid_params.
[[nodiscard]] core::FieldCodes rpc_param_codes() noexcept;

// One method's params, read with core's field reader (core/json_fields.hpp): every problem is a
// diagnostic with its pointer ("/execution_id"), all of them reported in one error, so a typo is
// an error and not a silent default. A null member counts as absent.
//
//   Params in(p, {"execution_id", "timeout_ms"});
//   auto const id = in.required_string("execution_id");
//   auto const timeout = in.optional_u64("timeout_ms", kMaxTimeout);
//   if (auto e = std::move(in).error()) return reply(std::move(*e));
class Params {
 public:
  // Reports every member not in `allowed`.
  Params(boost::json::object const& params, std::initializer_list<std::string_view> allowed,
         core::FieldCodes codes = rpc_param_codes());

  [[nodiscard]] boost::json::object const& object() const noexcept { return params_; }
  [[nodiscard]] core::FieldReader& fields() noexcept { return fields_; }
  [[nodiscard]] static std::string at(std::string_view key);

  // A non-empty string; empty after reporting it missing or wrong.
  std::string required_string(std::string_view key);
  // A string, or nullopt when absent (or after reporting a wrong type).
  std::optional<std::string> optional_string(std::string_view key);
  // A non-negative integer up to `max`, or nullopt when absent (or after reporting it).
  std::optional<std::uint64_t> optional_u64(
      std::string_view key, std::uint64_t max = std::numeric_limits<std::uint64_t>::max());
  // A non-negative integer; 0 after reporting it missing or wrong.
  std::uint64_t required_u64(std::string_view key);
  // A boolean, `absent` when absent (or after reporting a wrong type).
  bool optional_bool(std::string_view key, bool absent = false);
  // A finding about the member `key`, with the method's code.
  void bad(std::string_view key, std::string message);

  // Nothing when every param read; else everything found, as one error.
  [[nodiscard]] std::optional<Error> error() &&;

 private:
  boost::json::object const& params_;
  core::FieldReader fields_;
};

// One exec.input call carries at most this many decoded bytes (a 512 KiB chunk stays well under
// the server's line limit once base64-encoded).
inline constexpr std::uint64_t kMaxInputChunk = 512 * 1024;

// exec.input's `data_b64`: absent or null = no bytes; otherwise padded base64 of at most
// kMaxInputChunk bytes. Anything else is a finding at /data_b64.
[[nodiscard]] std::vector<std::uint8_t> input_bytes(Params& in);

// exec.start's and exec.check's identity, plan and `subscribe`, each member's findings (the
// plan's codes, and rpc.invalid_params for subscribe) into `in`, which the caller created with
// launch_param_codes(). `subscribe` is read apart from the identity and plan, so it never
// reaches the plan, its canonical bytes or its digest.
// The plan is parsed whole, its sandbox compiled (sandbox::parse_plan); when the plan is the
// only thing refused, its error is kept as is in `plan_error` (a compilation refusal keeps its
// sandbox.* code even with several diagnostics), else its findings join the others in `in`.
// finish_launch() decides.
struct LaunchParts {
  core::ExecutionIdentity identity;
  core::ExecutionPlan plan;
  std::shared_ptr<sandbox::PlanSandbox const> sandbox;
  std::optional<Error> plan_error;
  bool subscribe = false;
};
[[nodiscard]] core::FieldCodes launch_param_codes() noexcept;
[[nodiscard]] LaunchParts read_launch(Params& in);
// Every finding of the launch params, or nothing: the plan's own error when it is the only one.
[[nodiscard]] std::optional<Error> finish_launch(Params&& in, LaunchParts& parts);

// exec.check's answer: plan_digest, sandbox_digest (null without a sandbox), backend,
// admission {admitted, missing, default_boundary} and, for a sandboxed plan, `sandbox`: the
// checked sandbox plan (every domain's effective value, and its controls).
[[nodiscard]] boost::json::object check_answer(supervisor::ExecutionManager const& m,
                                               core::ExecutionPlan const& plan,
                                               std::string plan_digest,
                                               sandbox::CheckedSandboxPlan const* sandbox,
                                               backend::Admission const& admission);

// exec.list (phase, session_id, limit, cursor): first the executions the manager holds (newest
// first), then the registry's records it does not hold, in id order. `only` (when non-null)
// restricts the listing to those execution ids (a non-admin's own executions); null lists all.
void list_executions(supervisor::ExecutionManager& manager, registry::Registry* registry,
                     boost::json::object const& params, std::set<std::string> const* only,
                     Reply const& reply);

// One subscription of a connection to one execution's events: exec.subscribe, and exec.start
// with `subscribe: true`. Events go out as exec.event notifications under the slow-subscriber
// policy (docs/api.md): an event the connection cannot queue is dropped and counted, and the
// next one delivered carries `dropped`; the terminal event is always queued and ends the
// subscription. The slot belongs to the connection (Session::add_subscription): closing the
// connection or exec.unsubscribe removes it, and with it the manager's sink; the execution is
// not affected. Everything runs on the loop thread.
class EventSubscription : public std::enable_shared_from_this<EventSubscription> {
 public:
  // Takes a subscription slot on `session` before anything else happens, so that a start whose
  // answer will carry it cannot be refused the slot after its process exists. Nothing is
  // delivered before attach(). Errors: rpc.subscription_limit; rpc.unavailable once closed.
  [[nodiscard]] static Result<std::shared_ptr<EventSubscription>> reserve(
      supervisor::ExecutionManager& manager, std::shared_ptr<Session> const& session);

  EventSubscription(supervisor::ExecutionManager& manager, std::weak_ptr<Session> session);
  EventSubscription(EventSubscription const&) = delete;
  EventSubscription& operator=(EventSubscription const&) = delete;

  // Subscribes to the execution's retained events with seq >= from_seq (all retained when
  // nullopt), then to its live ones; returns the first seq replayed (larger than from_seq when
  // older events were no longer retained). With `hold`, the replayed events are kept here, not
  // queued, until release_held(): the caller answers its call in between, so that the answer
  // precedes every event on the wire (no live event can come in between: one loop thread).
  // Errors (the slot is given back): exec.not_found; rpc.overloaded when the connection went
  // away during the replay; rpc.subscription_not_found when the slot was already removed.
  [[nodiscard]] Result<std::uint64_t> attach(std::string const& execution_id,
                                             std::optional<std::uint64_t> from_seq, bool hold);
  // Queues the events attach(hold = true) kept, in order, and stops holding.
  void release_held();
  // Gives the slot back (exec.start refused): no-op once removed.
  void cancel();

  [[nodiscard]] std::string const& id() const noexcept { return id_; }
  // False once the slot was removed (unsubscribed, ended by the terminal event, or the
  // connection closed).
  [[nodiscard]] bool active() const noexcept { return !removed_; }

 private:
  // The manager's sink: false stops the manager delivering to it.
  bool on_event(supervisor::Event const& ev);
  void deliver(supervisor::Event const& ev);
  void on_removed();

  supervisor::ExecutionManager& manager_;
  std::weak_ptr<Session> session_;
  std::string id_;
  std::string execution_id_;
  std::optional<std::uint64_t> handle_id_;  // the manager's subscription, once attached
  std::vector<supervisor::Event> held_;
  std::uint64_t dropped_ = 0;  // events lost since the last delivered one
  bool holding_ = false;
  bool ended_ = false;    // the terminal event went out
  bool removed_ = false;  // the connection no longer has the slot
};

// exec.get's `publication`: per stream of the execution's mode, its publication state, the
// artifact's digest and size, whether the stream is complete, and a failed or lost stream's
// error {code, message, recovery}.
[[nodiscard]] boost::json::object publication_json(registry::ExecutionRecord const& record,
                                                   bool pty);

// exec.output for an execution the manager holds only as terminal, or not at all: served from
// the registry's record and the stored output (registry/artifacts.hpp). Errors: exec.not_found
// (no record), the record's own (quarantined), read_stored_output's.
[[nodiscard]] Result<boost::json::object> stored_output(registry::Registry& registry,
                                                        std::string const& execution_id,
                                                        std::string_view stream,
                                                        std::uint64_t offset,
                                                        std::uint64_t max_bytes);

}  // namespace custos::rpc::detail
