// grant, lease, quiescence: their daemon methods (authority.*, lease.*, holder.quiescence) come
// with the authority issue (6). Until then these verbs say so and exit 69 (EX_UNAVAILABLE).
#include <fmt/core.h>

#include "commands.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace {

void later(CLI::App& app, Globals& g, char const* name, char const* help) {
  auto* sub = app.add_subcommand(name, std::string{help} + " (lands with issue 6)");
  sub->allow_extras();
  sub->callback([&g, name] {
    fmt::print(stderr, "custos {}: lands with issue 6 (authority and leases); not in this build\n",
               name);
    g.exit_code = kExitUnavailable;
  });
}

}  // namespace

void add_later(CLI::App& app, Globals& g) {
  later(app, g, "grant", "Manage grants (admin)");
  later(app, g, "lease", "Manage workspace mutation leases");
  later(app, g, "quiescence", "Ask whether a holder has no live or unresolved execution");
}

}  // namespace custos::cli
