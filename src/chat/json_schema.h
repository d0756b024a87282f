// chat/json_schema.h — JSON Schema → GBNF (the grammar format engine/grammar.h compiles), for
//   response_format json_schema / json_object, llama-server's json_schema field and tool-call
//   arguments.
//
// Owns: the translation of a schema into grammar rules that derive only JSON texts valid against
//   the schema: type (and lists of types), properties / required / additionalProperties,
//   enum / const, items / prefixItems / minItems / maxItems, anyOf / oneOf / allOf (objects
//   merged), $ref into #/$defs or #/definitions (recursion allowed), string minLength / maxLength,
//   pattern (a regular-expression subset), format (date, time, date-time, uuid), integer
//   minimum / maximum / exclusive bounds. The grammar may be stricter than the schema (properties
//   come in the schema's order; keys not declared are not generated when `properties` is given;
//   whitespace is bounded), never looser — except oneOf, generated as anyOf.
//   A keyword it cannot express (uniqueItems, not, if/then/else, number bounds, …) is an error that
//   names it, with the JSON path of the keyword: never silently ignored.
// Must not: know about tokens or the engine (the server compiles the text with engine::Grammar).
// Threading: plain functions over values; safe from any thread.
#pragma once
#include <string>
#include <string_view>

#include "chat/chat.h"

namespace kiln::chat {

// GBNF text whose rule `root` derives the JSON texts the schema accepts. `field` is the request
// path of the schema ("response_format.json_schema.schema"), the prefix of every error's field.
RequestResult<std::string> json_schema_to_gbnf(const ojson& schema, const std::string& field);

// GBNF for any JSON object (response_format {"type": "json_object"}).
std::string json_object_gbnf();

// Grammars for many schemas in one text (tool calls: one argument schema per tool). Each added
// schema's rules are prefixed by its name; the caller writes the root rule.
class GbnfBuilder {
 public:
  GbnfBuilder();
  ~GbnfBuilder();
  GbnfBuilder(GbnfBuilder&&) noexcept;
  // Adds the rules of `schema`; returns the name of its top rule ("<prefix>"). `root` (default:
  // `schema` itself) is the document its $refs point into — a property's schema inside a tool's
  // parameters resolves "#/$defs/…" against the parameters. `root` must outlive the builder's use.
  RequestResult<std::string> add_schema(const ojson& schema, const std::string& field, const std::string& prefix,
                                        const ojson* root = nullptr);
  // Replaces the body of a shared primitive rule before its first use: "json-string" (strings of
  // no declared length), "json-char" (one character of a length-bounded string), "ws", … Used by
  // chat/tool_grammar.h to keep tool-call markers out of argument strings.
  void override_primitive(const std::string& name, const std::string& body);
  // Adds a shared primitive ("json-date", "json-uuid", "ws", …) and returns its rule name.
  std::string primitive(const std::string& name);
  // A rule `name ::= body` written as given.
  void add_rule(const std::string& name, const std::string& body);
  // GBNF of a JSON string literal (quotes and escapes included) for the text s: "\"{\\\"a\\\"\"".
  static std::string literal(std::string_view s);
  std::string text() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::chat
