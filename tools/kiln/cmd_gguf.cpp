// `kiln gguf …` — inspect, generate and check GGUF files. Each action lives in its own file.
#include <cstdio>
#include <cstring>

#include "gguf_cmds.h"
#include "subcommand.h"

namespace {
int cmd_gguf(int argc, char** argv) {
  const char* usage =
      "usage: kiln gguf <action> [options]\n\n"
      "actions:\n"
      "  info FILE [--json]     print metadata and the tensor table of a GGUF file\n"
      "  gen [options] -o FILE  write a random-weight model (see `kiln gguf gen --help`), or with\n"
      "                         --mmproj a vision projector (`kiln gguf gen --mmproj --help`)\n";
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "info")) return kiln::tools::gguf_info_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "gen")) return kiln::tools::gguf_gen_main(argc - 1, argv + 1);
  std::fprintf(stderr, "kiln gguf: unknown action '%s'\n%s", argv[1], usage);
  return 2;
}
}  // namespace

KILN_SUBCOMMAND(gguf, "inspect and generate GGUF files (info, gen)", cmd_gguf);
