// Replaced by the real implementation (foundation issue); keeps the binary linking meanwhile.
#include <cstdio>
#include "gguf_cmds.h"
int kiln::tools::gguf_info_main(int, char**) { std::fprintf(stderr, "kiln gguf: this action is being written\n"); return 2; }
