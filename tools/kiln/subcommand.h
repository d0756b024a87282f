// tools/kiln/subcommand.h — registration of `kiln <subcommand>` entry points.
// Each cmd_*.cpp file registers itself at static-init time:
//   KILN_SUBCOMMAND(gguf, "inspect, generate and check GGUF files", cmd_gguf);
// The function receives argv with argv[0] = "kiln <name>" and returns the exit code.
#pragma once
#include <string_view>

namespace kiln::tools {
using SubcommandFn = int (*)(int argc, char** argv);
struct SubcommandReg {
  SubcommandReg(std::string_view name, std::string_view summary, SubcommandFn fn);
};
}  // namespace kiln::tools

#define KILN_SUBCOMMAND(name, summary, fn) \
  static ::kiln::tools::SubcommandReg kiln_subcommand_reg_##name(#name, summary, fn)
