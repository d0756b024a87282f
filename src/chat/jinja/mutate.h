// chat/jinja/mutate.h — Python's mutating list and dict methods (append, pop, update, …) on
// kiln's Jinja values, as jinja2's SandboxedEnvironment (and llama-server) runs them.
// Owns: the mutators' Python semantics and error messages, the reference-cycle check and the
//       work accounting of each mutation.
// Must not: register the mutator names (methods.cpp's registry tables do), decide whether
//       mutation is allowed (objects.cpp does: Options::immutable_sandbox), evaluate templates,
//       or keep references into a container across a call.
// Threading: mutates the container shared by every Value that refers to it (Python reference
//       semantics); such Values belong to one render call.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja/value.h"

namespace kiln::chat::jinja {

// What a mutator needs from the interpreter.
struct MutateEnv {
  std::function<void(size_t n)> steps;                      // charge n evaluation steps (max_steps)
  std::function<bool(const Value&, const Value&)> less;     // Python a < b (fails on mixed types)
  std::function<std::vector<Value>(const Value&)> iterate;  // Python iter(v) as a list
};

// Calls list/dict mutator `name` on `self` (a list that is not a tuple/generator, or a dict).
// Returns what Python returns (None for append/extend/…). Throws JinjaError on misuse, on a
// container that would contain itself, and (via env.steps) when the work exceeds max_steps:
// every element or key added or scanned is charged, so growth is bounded by max_steps.
Value call_mutator(const Value& self, const std::string& name, CallArgs& a, const MutateEnv& env);

// Fails ("construct: …") when storing `v` inside container `target` would make `target`
// reachable from itself (Python allows such cycles; kiln refuses them so that printing,
// comparing and freeing values stay bounded). Charges one step per container visited.
void check_no_cycle(const Value& target, const Value& v, const MutateEnv& env, const std::string& construct);

}  // namespace kiln::chat::jinja
