// custos: one binary, the daemon and its CLI.
#include "custos/cli/app.hpp"

int main(int argc, char** argv) {
  return custos::cli::run_main(argc, argv);
}
