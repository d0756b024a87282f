// server/constraint.h — the request fields that constrain generation: OpenAI `response_format`
//   ({"type": "json_object"} and {"type": "json_schema", "json_schema": {…, "schema", "strict"}}),
//   llama-server's `json_schema` (a schema) and `grammar` (GBNF text), turned into the engine's
//   compiled grammar (engine::Request::grammar); tool_choice "required" / named (apply_tool_choice).
// Owns: reading and checking those fields (only one of them per request), JSON Schema → GBNF
//   through chat/json_schema.h, compiling with engine::Grammar::parse, the 400 errors that name the
//   field, the schema keyword or the grammar line.
// Must not: do I/O or talk to the engine thread (compiling is pure; the engine builds token masks).
// Threading: plain functions; safe from any HTTP thread.
#pragma once
#include <optional>
#include <vector>

#include "chat/chat.h"
#include "server/api.h"

namespace kiln::tokenizer {
class Tokenizer;
}

namespace kiln::server {

// Sets out.req.grammar when the body asks for a constraint; nullopt when fine (also when none).
std::optional<ApiError> parse_constraint(const json& body, GenParams& out);

// tool_choice "required" or a named function (chat/tool_grammar.h): the output must be calls in the
// template's tool-call format whose arguments validate against the tools' parameter schemas;
// parallel_tool_calls false allows exactly one. Nothing for "auto" / "none". A 400 naming
// "tool_choice" when a response_format / json_schema / grammar constraint is also given or the
// template has no tool-call format; schema errors name "tools[i].function.parameters.…".
std::optional<ApiError> apply_tool_choice(const chat::ChatRequest& req, const chat::TemplateCaps& caps,
                                          const std::string& template_source, GenParams& out);

// The control tokens of `tok` whose text is one of the format's tool-call markers (chat::
// tool_call_markers): engine::Request::preserved_tokens, llama-server's preserved tokens. Sorted.
std::vector<int32_t> preserved_marker_tokens(const tokenizer::Tokenizer& tok, chat::ToolCallFormat format);

// Compiles GBNF text for the request field `field` (errors: "field: line 2, column 5: …").
std::optional<ApiError> compile_grammar(const std::string& text, const std::string& field, GenParams& out);

}  // namespace kiln::server
