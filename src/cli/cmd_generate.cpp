// custos completion bash|zsh|fish, custos manpage custos|custos-daemon|custos.toml: hidden
// subcommands that print a completion script or a man page generated from the app itself, so
// neither can drift from the options it parses. The build runs them (cmake/CustosShellDocs.cmake)
// and the package installs what they print.
#include <fmt/core.h>

#include <functional>
#include <memory>
#include <utility>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "shell_doc.hpp"

namespace custos::cli {

namespace {

using Generator = std::function<std::string(CommandDoc const&)>;

// A hidden subcommand `name WHAT` printing generators[WHAT] of the whole app.
void add_printer(CLI::App& app, Globals& g, std::string const& name, std::string const& what,
                 std::vector<std::pair<std::string, Generator>> generators) {
  auto chosen = std::make_shared<std::string>();
  auto* sub = app.add_subcommand(name, "Print a " + name + " generated from this command line");
  sub->group("");  // hidden: neither in --help nor in what the generators print
  std::vector<std::string> names;
  for (auto const& [n, gen] : generators) names.push_back(n);
  sub->add_option(what, *chosen, "The " + what)->required()->check(one_of(names));
  sub->callback([&app, &g, chosen, generators = std::move(generators)] {
    for (auto const& [n, gen] : generators) {
      if (n == *chosen) fmt::print("{}", gen(describe(app)));
    }
    g.exit_code = kExitOk;
  });
}

}  // namespace

void add_generators(CLI::App& app, Globals& g) {
  add_printer(app, g, "completion", "shell",
              {{"bash", bash_completion}, {"zsh", zsh_completion}, {"fish", fish_completion}});
  add_printer(app, g, "manpage", "page",
              {{"custos", manpage_custos},
               {"custos-daemon", manpage_daemon},
               {"custos.toml", manpage_toml}});
}

}  // namespace custos::cli
