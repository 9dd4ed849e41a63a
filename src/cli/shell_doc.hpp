// The command line as data, read from the CLI::App itself: what the shell completions and the
// man pages are generated from (shell_completion.cpp, manpage.cpp). Private to cli/.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace custos::cli {

struct OptionDoc {
  std::vector<std::string> longs;   // "--follow"
  std::vector<std::string> shorts;  // "-f"
  std::string help;
  std::string value;  // the value's CLI11 type name ("TEXT", "UINT"); empty for a flag
  std::vector<std::string> choices;  // from a CLI::IsMember or one_of check, else empty
  std::string default_value;         // a captured default, else empty
  std::string env;                   // environment variable read when the option is absent
  bool repeatable = false;
  bool required = false;
  bool configurable = true;  // also a key of the configuration file (custos.toml)

  [[nodiscard]] bool flag() const { return value.empty(); }
  // The first long name ("--follow"), else the first short one.
  [[nodiscard]] std::string const& name() const;
  // Every name, long ones first.
  [[nodiscard]] std::vector<std::string> names() const;
};

struct PositionalDoc {
  std::string name;
  std::string help;
  bool required = false;
  bool many = false;  // takes every remaining argument
};

struct CommandDoc {
  std::vector<std::string> path;  // {} for custos itself, {"grant", "add"} for `custos grant add`
  std::string description;
  std::vector<OptionDoc> options;  // this command's own, in definition order (--help first)
  std::vector<PositionalDoc> positionals;
  std::vector<CommandDoc> subcommands;
  bool needs_subcommand = false;

  // "grant add"; "" for custos itself.
  [[nodiscard]] std::string joined() const;
  // The command at `path` below this one; nullptr when there is none.
  [[nodiscard]] CommandDoc const* find(std::vector<std::string> const& sub) const;
};

// Every subcommand and option of `app` that --help shows: hidden ones (empty group) are left
// out, so the generators leave themselves out.
[[nodiscard]] CommandDoc describe(CLI::App const& app);

// The root's options that every subcommand accepts too (the app falls through): all but
// --help and --version.
[[nodiscard]] std::vector<OptionDoc> inherited_options(CommandDoc const& root);

// Every command in depth-first order, the root first.
[[nodiscard]] std::vector<CommandDoc const*> all_commands(CommandDoc const& root);

}  // namespace custos::cli

namespace custos::cli {

// The scripts `custos completion bash|zsh|fish` prints (shell_completion.cpp).
[[nodiscard]] std::string bash_completion(CommandDoc const& root);
[[nodiscard]] std::string zsh_completion(CommandDoc const& root);
[[nodiscard]] std::string fish_completion(CommandDoc const& root);

// The man pages `custos manpage custos|custos-daemon|custos.toml` prints, roff (manpage.cpp).
[[nodiscard]] std::string manpage_custos(CommandDoc const& root);
[[nodiscard]] std::string manpage_daemon(CommandDoc const& root);
[[nodiscard]] std::string manpage_toml(CommandDoc const& root);

}  // namespace custos::cli
