// chat/jinja/jinja.h — kiln's own Jinja2 engine for chat templates (public API).
// Owns: lexing, parsing and rendering of Jinja2 templates with the semantics of Python
//       jinja2 as configured by HF transformers (trim_blocks, lstrip_blocks, loopcontrols,
//       HF `tojson`, `raise_exception`, `strftime_now`, `{% generation %}`), in a
//       SandboxedEnvironment that lets templates mutate lists/dicts (`ns.ids.append(x)`, as
//       llama-server renders them) unless Options::immutable_sandbox asks for HF's
//       ImmutableSandboxedEnvironment. See docs/jinja.md for the supported subset.
// Must not: know about tokens, models or the engine; let exceptions escape; abort on a bad
//       template (every template/data problem is a returned kiln::Error).
// Threading: a parsed Template is immutable; render() may be called concurrently from many
//       threads (each call has its own runtime state).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/result.h"

namespace kiln::chat::jinja {

struct Options {
  bool trim_blocks = true;    // drop the first newline after a block/comment tag
  bool lstrip_blocks = true;  // strip spaces/tabs from line start up to a block/comment tag
  size_t max_output_bytes = 16 << 20;  // rendered text (and any built string) larger → error
  size_t max_steps = 50'000'000;       // evaluation steps (nodes + loop iterations) → error
  size_t max_recursion = 200;          // nested macro calls → error
  // true: HF transformers' ImmutableSandboxedEnvironment (list.append, dict.update, … are
  // security errors). false: jinja2's SandboxedEnvironment, as llama-server renders templates.
  bool immutable_sandbox = false;
  // strftime_now(fmt) inside templates. Null → real local time (std::strftime).
  std::function<std::string(const std::string& fmt)> strftime_now;
};

namespace detail {
struct Program;  // parsed AST + options (internal)
}

class Template {
 public:
  // Parses `source`. Errors: "template line L: <construct>: message".
  static kiln::Result<Template> parse(std::string_view source, const Options& opt = {});
  // Renders with `context` (a JSON object; its keys become template variables).
  // Errors (template raised, undefined misuse, type errors, limits):
  // "template line L: <construct>: message". raise_exception(msg) → "…: raise_exception: msg".
  kiln::Result<std::string> render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const detail::Program> prog_;
};

// strftime on a fixed date/time "YYYY-MM-DD" or "YYYY-MM-DDTHH:MM[:SS]" (for --now and tests).
// Returns an error for a malformed date.
kiln::Result<std::function<std::string(const std::string&)>> fixed_strftime(std::string_view when);

}  // namespace kiln::chat::jinja
