// custos gc: retries every unfinished output publication and runs the retention sweep now
// (host.gc); prints what it did and what the output store holds after it.
#include <fmt/core.h>

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace {

std::uint64_t u64_field(boost::json::object const& o, std::string_view key) {
  auto const* v = o.if_contains(key);
  return v != nullptr && v->is_number() ? v->to_number<std::uint64_t>() : 0;
}

}  // namespace

void add_gc(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand(
      "gc", "Retry unfinished output publications and apply the output retention policy now");
  sub->callback([&g] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    auto r = client->call("host.gc", boost::json::object{});
    if (!r) {
      g.exit_code = report(r.error());
      return;
    }
    g.exit_code = kExitOk;
    if (g.json || !r->is_object()) {
      fmt::print("{}\n", boost::json::serialize(*r));
      return;
    }
    auto const& o = r->get_object();
    fmt::print("publication: {} execution(s) retried, {} stream(s) published, {} still failing\n",
               u64_field(o, "executions_retried"), u64_field(o, "streams_published"),
               u64_field(o, "streams_failed"));
    fmt::print("retention: {} artifact(s) and {} spool(s) removed, {} bytes freed\n",
               u64_field(o, "artifacts_removed"), u64_field(o, "spools_removed"),
               u64_field(o, "bytes_freed"));
    if (auto const* s = o.if_contains("store"); s != nullptr && s->is_object()) {
      auto const& st = s->get_object();
      fmt::print("store: {} artifact(s), {} bytes; {} spool(s), {} bytes\n",
                 u64_field(st, "artifacts"), u64_field(st, "artifact_bytes"),
                 u64_field(st, "spool_executions"), u64_field(st, "spool_bytes"));
    }
  });
}

}  // namespace custos::cli
