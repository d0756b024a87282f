// chat/tool_grammar.h — the grammar that forces a response to be tool calls: OpenAI
//   `tool_choice: "required"` (any of the request's tools) or a named function, in the chat
//   template's own tool-call format, each call's arguments valid against that tool's `parameters`
//   schema (through chat/json_schema.h), one call or several (`parallel_tool_calls`).
//
// Owns: the GBNF text for one request: the call layout of each format exactly as OutputParser
//   (chat/output_parser.h) reads it back —
//     qwen-xml     <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>
//     hermes-json  <tool_call>\n{"name": "NAME", "arguments": {…}}\n</tool_call>
//     arg-key-xml  <tool_call>NAME<arg_key>P</arg_key><arg_value>VALUE</arg_value>…</tool_call>
//     mistral      [TOOL_CALLS][{"name": "NAME", "arguments": {…}}, …]   (Nemo)
//                  [TOOL_CALLS]NAME[ARGS]{…}[TOOL_CALLS]…                (templates that use [ARGS])
//     llama3-json  {"name": "NAME", "parameters": {…}}                    (one call)
//   XML / arg_key values are written as the templates write them: strings raw, other types as JSON.
//   A tool whose parameters cannot be written that way (a string parameter with a `pattern`, a
//   top-level anyOf, a property name with markup characters) is called in the JSON body form,
//   which the parser reads inside <tool_call> in every format. Argument strings never contain the
//   format's closing markers (</tool_call>, </parameter>, </arg_value>, [TOOL_CALLS]): raw values
//   and unbounded JSON strings exclude them exactly (an Aho–Corasick automaton written as
//   right-linear rules); length-bounded strings exclude the markers' first character (JSON strings
//   can still carry it as a \u escape).
// Must not: know about tokens or the engine (the server compiles the text with engine::Grammar).
// Threading: plain functions over values; safe from any thread.
#pragma once
#include <string>
#include <vector>

#include "chat/chat.h"

namespace kiln::chat {

struct ToolGrammarOptions {
  ToolCallFormat format = ToolCallFormat::None;
  bool mistral_args = false;  // mistral: the template writes NAME[ARGS]{…} (Small 3.2, Devstral)
  bool parallel = true;       // parallel_tool_calls: several calls allowed (false: exactly one)
};

// GBNF (start rule `root`) deriving exactly the outputs that are tool calls for `req`
// (req.tool_choice Required or Named; req.tools non-empty). Errors name the request field:
// "tool_choice" when the template has no tool-call format, "tools[1].function.parameters.…" for a
// schema keyword that cannot be enforced.
RequestResult<std::string> tool_call_gbnf(const ChatRequest& req, const ToolGrammarOptions& opt);

// GBNF alternatives for one "unit" sequence that never contains any of `words` (ASCII, non-empty):
// rules `<name>-s<k>` (one per proper prefix of the words, s0 the empty prefix) are appended to
// `rules` as (name, body); returns "<name>-s0". `other` is a GBNF alternative for any unit that is
// no character of a word ("[^…]" or a group); the words' characters are matched one by one.
std::string excluding_rules(const std::string& name, const std::vector<std::string>& words, const std::string& other,
                            std::vector<std::pair<std::string, std::string>>& rules);

}  // namespace kiln::chat
