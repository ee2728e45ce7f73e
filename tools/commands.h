// Subcommands of the `gdr` command line, each registered from its own file.
#pragma once

#include <CLI/CLI.hpp>

namespace gdr::tools {

// `gdr verify`: every available CPU path against the float64 reference on random cases.
void add_verify_command(CLI::App& app);

// `gdr demo`: a small end-to-end run.
void add_demo_command(CLI::App& app);

}  // namespace gdr::tools
