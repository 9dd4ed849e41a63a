#pragma once

namespace custos::cli {

// Parses the command line and runs one subcommand. Returns the process exit code
// (docs/cli.md lists every code).
int run_main(int argc, char** argv);

}  // namespace custos::cli
