// model/placement.cpp — the MoE offload flags and the expert placement decision (see placement.h).
#include "model/placement.h"

#include <fmt/format.h>

#include <cctype>
#include <regex>

namespace kiln::model {
namespace {

constexpr const char* kOt = "-ot/--override-tensor";

bool valid_device(const std::string& d) {
  if (d == "CPU") return true;
  return d.size() > 4 && d.rfind("CUDA", 0) == 0 && d.find_first_not_of("0123456789", 4) == std::string::npos;
}

// blk.<il>.<rest>: il, or -1 for tensors outside the blocks (token_embd, output, ...).
int64_t block_of(std::string_view name, std::string_view* rest = nullptr) {
  if (name.rfind("blk.", 0) != 0) return -1;
  size_t i = 4;
  int64_t il = 0;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) il = il * 10 + (name[i++] - '0');
  if (i == 4 || i >= name.size() || name[i] != '.') return -1;
  if (rest) *rest = name.substr(i + 1);
  return il;
}

}  // namespace

Result<std::vector<TensorOverride>> parse_tensor_overrides(const std::string& value) {
  std::vector<TensorOverride> out;
  size_t b = 0;
  while (b <= value.size()) {
    const size_t e = std::min(value.find(',', b), value.size());
    const std::string item = value.substr(b, e - b);
    b = e + 1;
    const size_t eq = item.rfind('=');
    if (eq == std::string::npos)
      return err("{} '{}': expected PATTERN=DEVICE[,PATTERN=DEVICE...] (e.g. 'exps=CPU')", kOt, value);
    TensorOverride o{item.substr(0, eq), item.substr(eq + 1)};
    if (o.pattern.empty()) return err("{} '{}': empty pattern in '{}'", kOt, value, item);
    if (!valid_device(o.device))
      return err("{} '{}': unknown device '{}' (CPU or CUDA<i>, as llama.cpp names them; see `kiln devices`)", kOt,
                 value, o.device);
    try {
      std::regex re(o.pattern);
    } catch (const std::regex_error& ex) {
      return err("{} '{}': bad regular expression '{}': {}", kOt, value, o.pattern, ex.what());
    }
    out.push_back(std::move(o));
  }
  return out;
}

Result<PlacementOptions> placement_options(bool cpu_moe, int n_cpu_moe, const std::vector<std::string>& ot) {
  if (n_cpu_moe < 0) return err("--n-cpu-moe {}: expected a number of layers >= 0", n_cpu_moe);
  PlacementOptions p;
  p.n_cpu_moe = cpu_moe ? kCpuMoeAll : n_cpu_moe;
  for (const std::string& v : ot) {
    auto r = parse_tensor_overrides(v);
    KILN_TRY(r);
    p.overrides.insert(p.overrides.end(), r->begin(), r->end());
  }
  return p;
}

bool is_expert_tensor(std::string_view name, int64_t* block) {
  std::string_view rest;
  const int64_t il = block_of(name, &rest);
  if (il < 0) return false;
  if (rest != "ffn_gate_exps.weight" && rest != "ffn_up_exps.weight" && rest != "ffn_down_exps.weight") return false;
  if (block) *block = il;
  return true;
}

int64_t ExpertPlacement::n_host() const {
  int64_t n = 0;
  for (uint8_t h : host) n += h;
  return n;
}

int64_t ExpertPlacement::n_host_trunk(int64_t n_layer) const {
  int64_t n = 0;
  for (size_t i = 0; i < host.size() && int64_t(i) < n_layer; ++i) n += host[i];
  return n;
}

Result<ExpertPlacement> place_experts(const gguf::File& f, const ModelConfig& c, const BlockDevices& d,
                                      const PlacementOptions& o) {
  const int64_t n_blocks = c.n_layer + c.n_nextn;
  ExpertPlacement p;
  p.host.assign(size_t(n_blocks), 0);
  if (!o.given()) return p;
  std::vector<std::regex> res;
  for (const TensorOverride& r : o.overrides) res.emplace_back(r.pattern);  // checked when parsed
  std::vector<uint8_t> matched(o.overrides.size(), 0);
  // Per block: how many of its three expert tensors go to the host, and how many were named at all.
  std::vector<int> n_exp(size_t(n_blocks), 0), n_exp_host(size_t(n_blocks), 0);
  bool any_expert = false;
  const std::string gpu = fmt::format("CUDA{}", d.main_gpu);
  const bool gpu_used = d.gpu_layers > 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    int64_t il = -1;
    const bool expert = is_expert_tensor(t.name, &il) && il < n_blocks;
    any_expert = any_expert || expert;
    // The first -ot rule that matches, then --n-cpu-moe for expert tensors.
    const TensorOverride* rule = nullptr;
    for (size_t i = 0; i < res.size() && !rule; ++i)
      if (std::regex_search(t.name, res[i])) {
        matched[i] = 1;
        rule = &o.overrides[i];
      }
    if (!gpu_used) continue;  // everything runs on the host: nothing to move
    bool want_host = false;
    if (rule) {
      if (!rule->cpu() && rule->device != gpu)
        return err("{} '{}': {} is not the GPU kiln runs on ({}; -mg/-dev choose it)", kOt, rule->spec(), rule->device,
                   gpu);
      want_host = rule->cpu();
    } else if (expert && il < o.n_cpu_moe) {
      want_host = true;
    } else {
      continue;
    }
    // Where the tensor is without the rule: its block's device; outside blocks, output and
    // output_norm with the output, the rest (token_embd) on the host.
    const int64_t blk = block_of(t.name);
    const bool on_gpu = blk >= 0 ? d.on_gpu(blk)
                                 : ((t.name == "output.weight" || t.name == "output_norm.weight") && d.gpu_layers > c.n_layer);
    if (want_host == !on_gpu) continue;  // already there
    if (expert && on_gpu && want_host) {
      ++n_exp_host[size_t(il)];
      continue;
    }
    const std::string where = blk >= 0 ? fmt::format("block {} runs on {}", blk, on_gpu ? gpu : "the CPU")
                                       : fmt::format("it stays on {}", on_gpu ? gpu : "the CPU");
    return err("{} '{}' would move {} to {}, but {} (-ngl): kiln moves only the expert tensors "
               "(ffn_{{gate,up,down}}_exps) of GPU layers to the CPU; other tensors follow their layer",
               kOt, rule ? rule->spec() : std::string("--n-cpu-moe"), t.name, want_host ? "the CPU" : gpu, where);
  }
  for (size_t i = 0; i < o.overrides.size(); ++i)
    if (!matched[i]) return err("{} '{}': the pattern matches no tensor of {}", kOt, o.overrides[i].spec(), f.path());
  if (o.n_cpu_moe > 0 && !any_expert)
    return err("{}: {} ({}) has no expert tensors (blk.N.ffn_{{gate,up,down}}_exps.weight)",
               o.n_cpu_moe >= kCpuMoeAll ? std::string("--cpu-moe") : fmt::format("--n-cpu-moe {}", o.n_cpu_moe),
               f.path(), c.arch_str);
  for (const gguf::TensorInfo& t : f.tensors()) {
    int64_t il = -1;
    if (is_expert_tensor(t.name, &il) && il < n_blocks) ++n_exp[size_t(il)];
  }
  for (int64_t il = 0; il < n_blocks; ++il) {
    const int h = n_exp_host[size_t(il)];
    if (h == 0) continue;
    if (h != n_exp[size_t(il)])
      return err("{} / --n-cpu-moe: {} of the expert tensors of block {} would go to the CPU and the others stay on {}: "
                 "kiln keeps a block's ffn_gate_exps, ffn_up_exps and ffn_down_exps together",
                 kOt, h, il, gpu);
    p.host[size_t(il)] = 1;
  }
  return p;
}

}  // namespace kiln::model
