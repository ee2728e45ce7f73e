// The `gdr` command line: gdr --help, gdr --version, gdr <subcommand>.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "commands.h"
#include "gdr/api.h"
#include "gdr/version.h"

int main(int argc, char** argv) {
  CLI::App app{"gdr: the gated delta rule (forward, backward, decode) on CPU and CUDA"};
  app.set_version_flag("--version",
                       std::string("gdr ") + GDR_VERSION_STRING +
                           (gdr::cuda_available() ? " (CUDA paths built)" : " (CPU only)"));
  app.require_subcommand(1);
  gdr::tools::add_verify_command(app);
  gdr::tools::add_demo_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
