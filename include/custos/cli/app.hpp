#pragma once

#include <memory>

namespace CLI {
class App;
}

namespace custos::cli {

// The whole command line: one CLI::App with every subcommand registered (the hidden
// `completion` and `manpage` generators included), nothing parsed yet. run_main parses it; the
// shell completions, the man pages and their tests walk it, so none of them can drift from it.
class CommandLine {
 public:
  CommandLine();
  ~CommandLine();
  CommandLine(CommandLine const&) = delete;
  CommandLine& operator=(CommandLine const&) = delete;

  [[nodiscard]] CLI::App& app();
  // Parses argv and runs the chosen subcommand; the process exit code (docs/cli.md).
  int run(int argc, char** argv);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// CommandLine{}.run(argc, argv).
int run_main(int argc, char** argv);

}  // namespace custos::cli
