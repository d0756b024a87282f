// Actions of `kiln gguf`; argv[0] is the action name.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/gen/gen.h"

namespace kiln::tools {
int gguf_info_main(int argc, char** argv);  // gguf_info.cpp
int gguf_gen_main(int argc, char** argv);   // gguf_gen.cpp
int gguf_gen_mmproj_main(int argc, char** argv);  // gguf_gen_mmproj.cpp (gen with --mmproj)

// Shared by the two generators (gguf_gen.cpp): a plan's tensor bytes and parameter count; the --dry-run
// table (name column `name_width` wide) with its totals line; the write's progress callback (percent of
// tensors on stderr, prefixed with `what`; nothing when quiet).
struct GenTotals {
  uint64_t bytes = 0, params = 0;
};
GenTotals gen_totals(const std::vector<model::gen::PlannedTensor>& pl);
void print_gen_plan(const std::vector<model::gen::PlannedTensor>& pl, int name_width);
std::function<void(size_t, size_t)> gen_progress(const char* what, bool quiet);
}  // namespace kiln::tools
