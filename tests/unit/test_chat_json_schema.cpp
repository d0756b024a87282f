// JSON Schema → GBNF tests: each schema's grammar (compiled by engine::Grammar) derives the valid
// instances listed and none of the invalid ones; unsupported keywords are errors naming them.
// (End-to-end validation of sampled outputs with the `jsonschema` package: tests/py/test_server_grammar.py.)
#include <gtest/gtest.h>

#include "chat/json_schema.h"
#include "engine/grammar.h"

using namespace kiln;
using kiln::chat::ojson;

namespace {

std::shared_ptr<const engine::Grammar> compile(const char* schema) {
  auto text = chat::json_schema_to_gbnf(ojson::parse(schema), "schema");
  EXPECT_TRUE(text.ok()) << (text.ok() ? "" : text.error().to_string());
  if (!text.ok()) return nullptr;
  auto g = engine::Grammar::parse(*text);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message) << "\n" << *text;
  return g.ok() ? *g : nullptr;
}

struct Case {
  const char* schema;
  std::vector<const char*> valid, invalid;
};

std::string error_of(const char* schema) {
  auto text = chat::json_schema_to_gbnf(ojson::parse(schema), "response_format.json_schema.schema");
  return text.ok() ? std::string("(converted)") : text.error().to_string();
}

}  // namespace

TEST(JsonSchema, ValidAndInvalidInstances) {
  const std::vector<Case> cases = {
      {R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false})",
       {R"({"name":"Ann","age":31})", R"({ "name" : "Bo\"b\u00e9", "age": -2 })", "{\"name\": \"\", \"age\": 0}"},
       {R"({"name":"Ann"})", R"({"age":31,"name":"Ann"})", R"({"name":"Ann","age":3.5})", R"({"name":"Ann","age":31,"x":1})",
        R"({"name":"Ann","age":01})"}},
      {R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"},"c":{"type":"number"}}})",
       {"{}", R"({"a":true})", R"({"b":null,"c":1.5e3})", R"({"a":false,"b":null,"c":-0.25})"},
       {R"({"a":1})", R"({,"b":null})", R"({"b":null,})"}},
      {R"({"enum":["red","green",3,null,{"k":[1]}]})", {R"("red")", "3", "null", R"({"k":[1]})"}, {R"("blue")", "4", R"({"k":[2]})"}},
      {R"({"const":"x\"y"})", {R"("x\"y")"}, {R"("xy")"}},
      {R"({"type":"array","items":{"type":"integer","minimum":-5,"maximum":120},"minItems":1,"maxItems":3})",
       {"[-5]", "[0,120,7]", "[ 99 , -1 ]"}, {"[]", "[121]", "[-6]", "[1,2,3,4]", "[007]"}},
      {R"({"type":"integer","exclusiveMinimum":9,"exclusiveMaximum":1000})", {"10", "999", "500"}, {"9", "1000", "-1", "1e3"}},
      {R"({"type":"integer","minimum":0})", {"0", "7", "123456789012"}, {"-1", "00"}},
      {R"({"type":"integer","maximum":-10})", {"-10", "-999"}, {"-9", "0", "5"}},
      {R"({"type":"string","minLength":2,"maxLength":4})", {R"("ab")", R"("abcd")", R"("é😀")", R"("\n\t")"}, {R"("a")", R"("abcde")"}},
      {R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})", {R"("AB-123")"}, {R"("AB-12")", R"("ab-123")", R"("AB-1234")"}},
      {R"({"type":"string","pattern":"^(cat|dog)s?$"})", {R"("cat")", R"("dogs")"}, {R"("cow")", R"("catss")"}},
      {R"({"type":"string","pattern":"a\"b"})", {R"("a\"b")", R"("xxa\"byy")"}, {R"("ab")"}},
      {R"({"type":"string","format":"date-time"})", {R"("2024-02-29T23:59:59Z")", R"("1999-12-31T00:00:00.123+05:30")"},
       {R"("2024-13-01T00:00:00Z")", R"("2024-01-01")"}},
      {R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"}},
      {R"({"anyOf":[{"type":"string","maxLength":3},{"type":"array","items":{"type":"boolean"}}]})",
       {R"("abc")", "[true,false]", "[]"}, {R"("abcd")", "[1]"}},
      {R"({"type":["string","null"]})", {R"("x")", "null"}, {"1"}},
      {R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
       {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":2,"next":{"v":3,"next":null}}})"}, {R"({"v":1})", R"({"v":1,"next":{"v":2}})"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"}})", {"{}", R"({"a":1,"b":2})"}, {R"({"a":"x"})"}},
      {R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})", {R"(["a",1])"}, {R"(["a"])", R"(["a",1,2])", R"([1,"a"])"}},
      {R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"string"}},"required":["b"]}]})",
       {R"({"a":1,"b":"x"})"}, {R"({"a":1})"}},
      {"{}", {"1", R"({"a":[null,{"b":"c"}]})", R"("s")"}, {"", "{"}},
      {R"({"type":"object","properties":{"deep":{"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"],"additionalProperties":false}}}}}})",
       {R"({"deep":[[[{"x":1}],[]],[]]})", "{}"}, {R"({"deep":[[[{"y":1}]]]})"}},
  };
  for (const auto& c : cases) {
    auto g = compile(c.schema);
    ASSERT_TRUE(g) << c.schema;
    for (const char* v : c.valid) EXPECT_TRUE(g->matches(v)) << c.schema << "\n  should accept " << v << "\n" << g->text();
    for (const char* v : c.invalid) EXPECT_FALSE(g->matches(v)) << c.schema << "\n  should reject " << v;
  }
}

TEST(JsonSchema, JsonObjectGrammar) {
  auto g = engine::Grammar::parse(chat::json_object_gbnf());
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE((*g)->matches("{}"));
  EXPECT_TRUE((*g)->matches(R"({"a": [1, 2.5, "x", {"b": null}], "c": true})"));
  EXPECT_FALSE((*g)->matches("[]"));
  EXPECT_FALSE((*g)->matches("\"x\""));
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  const std::string p = "response_format.json_schema.schema";
  EXPECT_EQ(error_of(R"({"type":"array","uniqueItems":true})"), p + ".uniqueItems: the JSON Schema keyword 'uniqueItems' is not supported");
  EXPECT_EQ(error_of(R"({"type":"object","properties":{"x":{"not":{"type":"string"}}}})"),
            p + ".properties.x.not: the JSON Schema keyword 'not' is not supported");
  EXPECT_EQ(error_of(R"({"type":"number","minimum":0})"), p + ".minimum: 'minimum' on type 'number' is not supported (it is on 'integer')");
  EXPECT_EQ(error_of(R"({"type":"string","format":"email"})"), p + ".format: format 'email' is not supported (date, time, date-time, uuid are)");
  EXPECT_EQ(error_of(R"({"$ref":"https://example.com/s.json"})"),
            p + ".$ref: $ref 'https://example.com/s.json' is not supported (only '#', '#/$defs/NAME' and '#/definitions/NAME')");
  EXPECT_EQ(error_of(R"({"$ref":"#/$defs/missing"})"), p + ".$ref: $ref '#/$defs/missing' points to nothing");
  EXPECT_EQ(error_of(R"({"type":"strin"})"), p + ".type: unknown type 'strin'");
  EXPECT_EQ(error_of(R"({"type":"string","pattern":"(?=a)b"})"), p + ".pattern: pattern: lookaround and named groups are not supported");
  EXPECT_EQ(error_of(R"({"type":"string","pattern":"(a)\\1"})"), p + ".pattern: pattern: \\1 is not supported");
  EXPECT_EQ(error_of(R"({"type":"object","properties":{"a":{}},"required":["b"]})"), p + ".required[0]: 'b' is not among the properties");
  EXPECT_EQ(error_of(R"({"type":"object","patternProperties":{"^x":{}}})"), p + ".patternProperties: the JSON Schema keyword 'patternProperties' is not supported");
  EXPECT_EQ(error_of(R"({"type":"integer","multipleOf":2})"), p + ".multipleOf: the JSON Schema keyword 'multipleOf' is not supported");
  EXPECT_EQ(error_of(R"(false)"), p + ": the schema 'false' accepts nothing");
}
