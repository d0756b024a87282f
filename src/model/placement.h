// model/placement.h — which weights of a GPU-placed block stay in host memory: llama.cpp's MoE
//   offload flags (`--cpu-moe`, `--n-cpu-moe N`, `-ot/--override-tensor PATTERN=DEVICE`), their one
//   parser (kiln serve's option table and the tools' flags both call it), and the placement decision
//   the loader (model/loader.cpp) and the memory planner (model/fit.h) share, so the plan and the
//   load cannot disagree.
// Rules (docs/memory.md "Expert offload"):
//   - -ngl places whole blocks (the last N trunk layers, the output when N > n_layer; with MTP the
//     MTP blocks go with the last trunk layer, so to the GPU when N >= 1). A block on the GPU may keep its expert tensors
//     (blk.N.ffn_{gate,up,down}_exps.weight) in host memory; the Context then runs the routed
//     experts of that block on the host (model/experts.cpp). Nothing else moves by tensor.
//   - -ot rules are matched first, in the order given (the first whose regex is found in a tensor's
//     name decides, as llama.cpp's std::regex_search), then --cpu-moe / --n-cpu-moe (the expert
//     tensors of blocks il < N; --cpu-moe: every block, the MTP blocks included).
//   - Errors (never a silent change): a rule that matches no tensor of the file; a device other than
//     CPU or the one GPU in use; a rule that would move anything but a GPU block's expert tensors
//     off the block's device; a block whose three expert tensors would be split.
//   - When the model runs on the CPU alone (no GPU layers), the rules are checked for matching and
//     have nothing to move.
// Must not: read tensor data or allocate. Threading: pure functions.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "gguf/reader.h"
#include "model/config.h"

namespace kiln::model {

// --cpu-moe: the expert tensors of every block (an --n-cpu-moe larger than any block count).
inline constexpr int kCpuMoeAll = 1 << 30;

// One -ot rule: tensors whose name contains a match of `pattern` (ECMAScript regex) go to `device`
// ("CPU" or "CUDA<i>", llama.cpp's buffer-type names).
struct TensorOverride {
  std::string pattern;
  std::string device;
  bool cpu() const { return device == "CPU"; }
  std::string spec() const { return pattern + "=" + device; }
};

struct PlacementOptions {
  int n_cpu_moe = 0;                      // --n-cpu-moe N (blocks il < N); kCpuMoeAll: --cpu-moe
  std::vector<TensorOverride> overrides;  // -ot, in order
  bool given() const { return n_cpu_moe > 0 || !overrides.empty(); }
};

// "PATTERN=DEVICE[,PATTERN=DEVICE...]" (one -ot value; the flag may be repeated). Errors name the
// flag and the value: no '=', an empty pattern, a bad regex, a device other than CPU / CUDA<i>.
Result<std::vector<TensorOverride>> parse_tensor_overrides(const std::string& value);
// The options of --cpu-moe (a flag), --n-cpu-moe (< 0: an error) and the -ot values, as every
// entry point takes them.
Result<PlacementOptions> placement_options(bool cpu_moe, int n_cpu_moe, const std::vector<std::string>& ot);

// blk.<il>.ffn_{gate,up,down}_exps.weight: sets *block to il.
bool is_expert_tensor(std::string_view name, int64_t* block = nullptr);

// Where the blocks run, as the loader resolves -ngl: trunk layers il >= first_gpu and (mtp_on_gpu)
// the MTP blocks run on the GPU; gpu_layers == 0: nothing does.
struct BlockDevices {
  int64_t n_layer = 0, n_nextn = 0;
  int gpu_layers = 0;       // resolved -ngl: 0..n_layer + 1 (> n_layer: the output too)
  bool mtp_on_gpu = false;  // the MTP blocks run (LoadOptions::mtp) with the last trunk layer, on the GPU
  int main_gpu = 0;         // the CUDA device (CUDA<main_gpu>)
  // The loader's rule for a resolved -ngl (0..n_layer + 1) and LoadOptions::mtp.
  static BlockDevices of(const ModelConfig& c, int gpu_layers, bool mtp, int main_gpu = 0) {
    return {c.n_layer, c.n_nextn, gpu_layers, mtp && gpu_layers >= 1, main_gpu};
  }
  bool on_gpu(int64_t block) const {
    if (gpu_layers <= 0) return false;
    return block < n_layer ? block >= n_layer - std::min<int64_t>(gpu_layers, n_layer) : mtp_on_gpu;
  }
};

// The resolved decision: per block (n_layer + n_nextn), 1 when the block runs on the GPU and its
// expert tensors stay in host memory.
struct ExpertPlacement {
  std::vector<uint8_t> host;
  bool on_host(int64_t block) const { return block >= 0 && size_t(block) < host.size() && host[size_t(block)]; }
  int64_t n_host() const;                 // blocks whose experts are on the host (trunk and MTP)
  int64_t n_host_trunk(int64_t n_layer) const;
};

// Applies the options to the file's tensor names (see the rules above). `path` names the file in errors.
Result<ExpertPlacement> place_experts(const gguf::File& f, const ModelConfig& c, const BlockDevices& d,
                                      const PlacementOptions& o);

}  // namespace kiln::model
