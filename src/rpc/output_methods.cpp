// Stored output over the API: exec.get's publication view, exec.output from spool or artifact,
// and host.gc (docs/api.md; docs/durability.md, "Output").
#include <boost/asio/post.hpp>

#include "custos/core/base64.hpp"
#include "custos/core/plan_canonical.hpp"
#include "custos/registry/artifacts.hpp"
#include "custos/registry/registry.hpp"
#include "custos/rpc/methods.hpp"
#include "custos/supervisor/manager.hpp"
#include "custos/supervisor/publisher.hpp"

#include "exec_internal.hpp"

namespace custos::rpc {

namespace json = boost::json;

namespace detail {

namespace {

json::object stream_publication(registry::StreamProgress const& s) {
  json::object o{{"state", registry::publication_state_wire(s.publication)},
                 {"artifact", s.artifact.empty() ? json::value(nullptr) : json::value(s.artifact)},
                 {"bytes", s.published_bytes},
                 {"complete", s.accounting.complete}};
  if (!s.publication_error.empty()) {
    // Stored as Error::message(): "<code>: <context>".
    std::string_view const text = s.publication_error;
    auto const colon = text.find(": ");
    std::string_view const code = colon == std::string_view::npos ? text : text.substr(0, colon);
    auto const errc = errc_from_wire(code);
    o["error"] = json::object{
        {"code", code},
        {"message", text},
        {"recovery", errc ? recovery_wire(Error{*errc}.recovery()) : std::string_view{"terminal"}}};
  }
  return o;
}

}  // namespace

json::object publication_json(registry::ExecutionRecord const& record, bool pty) {
  json::object out;
  if (pty) {
    out["pty"] = stream_publication(record.out);
  } else {
    out["stdout"] = stream_publication(record.out);
    out["stderr"] = stream_publication(record.err);
  }
  return out;
}

Result<json::object> stored_output(registry::Registry& registry, std::string const& execution_id,
                                   std::string_view stream, std::uint64_t offset,
                                   std::uint64_t max_bytes) {
  auto rec = registry.get(execution_id);
  if (!rec) {
    if (rec.error().code == Errc::registry_not_found)
      return Error{Errc::exec_not_found, "no execution " + execution_id};
    return rec.error();
  }
  auto request = CUSTOS_TRY(core::decode_execution(rec->plan_canonical));
  bool const pty = request.plan.io.mode == core::IoMode::pty;
  registry::ArtifactStore const store{registry.state_dir()};
  auto slice = CUSTOS_TRY(
      registry::read_stored_output(registry, store, *rec, pty, stream, offset, max_bytes));
  return json::object{{"data_b64", core::base64_encode(slice.data)},
                      {"eof", slice.eof},
                      {"complete", slice.complete}};
}

}  // namespace detail

json::object gc_json(supervisor::CollectReport const& r) {
  return json::object{{"executions_retried", r.executions_retried},
                      {"streams_published", r.streams_published},
                      {"streams_failed", r.streams_failed},
                      {"artifacts_removed", r.sweep.artifacts_removed},
                      {"spools_removed", r.sweep.spools_removed},
                      {"bytes_freed", r.sweep.bytes_freed},
                      {"store", store_json(r.sweep.figures)}};
}

json::object store_json(registry::StoreFigures const& f) {
  return json::object{{"spool_bytes", f.spool_bytes},
                      {"spool_executions", f.spool_executions},
                      {"artifact_bytes", f.artifact_bytes},
                      {"artifacts", f.artifacts},
                      {"measured_ns", f.measured_ns}};
}

void register_output_methods(Dispatcher& d, supervisor::ExecutionManager& manager,
                             supervisor::OutputPublisher& publisher) {
  d.add(
      "host.gc", Access::admin,
      [&manager, &publisher](std::shared_ptr<Session> const&, json::object const& p, Reply reply) {
        detail::Params in(p, {});
        if (auto e = std::move(in).error()) return reply(std::move(*e));
        // Done on the publisher's thread; answered on the loop, where replies are made.
        publisher.collect([&io = manager.io(),
                           reply = std::move(reply)](Result<supervisor::CollectReport> r) mutable {
          boost::asio::post(io, [reply = std::move(reply), r = std::move(r)] {
            if (!r) return reply(r.error());
            reply(json::value(gc_json(*r)));
          });
        });
      });
}

}  // namespace custos::rpc
