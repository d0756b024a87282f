// kiln — one binary, many subcommands. `kiln --help` lists them; `kiln CMD --help` explains one.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "subcommand.h"

namespace kiln::tools {
namespace {
struct Entry {
  std::string_view name, summary;
  SubcommandFn fn;
};
std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}

void print_help() {
  std::printf(
      "kiln %s — GGUF inference engine and OpenAI-compatible server\n\n"
      "usage: kiln <command> [options]\n\ncommands:\n",
      KILN_VERSION);
  auto r = registry();
  std::sort(r.begin(), r.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  for (const auto& e : r) std::printf("  %-12.*s %.*s\n", int(e.name.size()), e.name.data(), int(e.summary.size()), e.summary.data());
  std::printf("\n`kiln <command> --help` describes a command.\n");
}
}  // namespace

SubcommandReg::SubcommandReg(std::string_view name, std::string_view summary, SubcommandFn fn) {
  registry().push_back({name, summary, fn});
}
}  // namespace kiln::tools

int main(int argc, char** argv) {
  using namespace kiln::tools;
  kiln::init_logging();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    print_help();
    return argc < 2 ? 1 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("kiln %s\n", KILN_VERSION);
    return 0;
  }
  for (const auto& e : registry()) {
    if (e.name == argv[1]) {
      std::string prog = std::string("kiln ") + argv[1];
      std::vector<char*> args(argv + 1, argv + argc);
      args[0] = prog.data();
      return e.fn(static_cast<int>(args.size()), args.data());
    }
  }
  std::fprintf(stderr, "kiln: unknown command '%s' (see `kiln --help`)\n", argv[1]);
  return 2;
}
