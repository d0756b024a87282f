// server/constraint.h — the request fields that constrain generation: OpenAI `response_format`
//   ({"type": "json_object"} and {"type": "json_schema", "json_schema": {…, "schema", "strict"}}),
//   llama-server's `json_schema` (a schema) and `grammar` (GBNF text), turned into the engine's
//   compiled grammar (engine::Request::grammar).
// Owns: reading and checking those fields (only one of them per request), JSON Schema → GBNF
//   through chat/json_schema.h, compiling with engine::Grammar::parse, the 400 errors that name the
//   field, the schema keyword or the grammar line.
// Must not: do I/O or talk to the engine thread (compiling is pure; the engine builds token masks).
// Threading: plain functions; safe from any HTTP thread.
#pragma once
#include <optional>

#include "server/api.h"

namespace kiln::server {

// Sets out.req.grammar when the body asks for a constraint; nullopt when fine (also when none).
std::optional<ApiError> parse_constraint(const json& body, GenParams& out);

// Compiles GBNF text for the request field `field` (errors: "field: line 2, column 5: …").
std::optional<ApiError> compile_grammar(const std::string& text, const std::string& field, GenParams& out);

}  // namespace kiln::server
