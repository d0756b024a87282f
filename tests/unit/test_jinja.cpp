// Unit tests for kiln's Jinja engine (src/chat/jinja).
// Construct cases: tests/unit/jinja_cases.json holds [template, expected] pairs whose expected
// text was produced by Python jinja2 3.1 configured like HF transformers, with context
// kCtx below and strftime_now pinned to 2026-11-30; tests/py/test_jinja_oracle.py re-checks
// every pair against jinja2 so the fixture cannot drift. Error/limit cases below assert
// that rendering fails cleanly (jinja2 raises for the same templates, see comments).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "chat/jinja/jinja.h"

namespace jj = kiln::chat::jinja;
using json = nlohmann::ordered_json;

namespace {

const char* kCtx = R"({"d": {"a": 1, "b": [1, 2]}, "l": [3, 1, 2], "s": "Hello World", "n": null,
  "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";

jj::Options opts() {
  jj::Options o;
  o.strftime_now = jj::fixed_strftime("2026-11-30").value();
  return o;
}

kiln::Result<std::string> render(const std::string& src, const json& ctx = json::object(), jj::Options o = opts()) {
  auto t = jj::Template::parse(src, o);
  if (!t) return t.error();
  return t->render(ctx);
}

std::string error_of(const std::string& src, const json& ctx = json::object(), jj::Options o = opts()) {
  auto r = render(src, ctx, o);
  EXPECT_FALSE(r.ok()) << "expected an error for: " << src << "\n got: " << (r.ok() ? *r : "");
  return r.ok() ? "" : r.error().message;
}

std::string source_dir() {
  const char* e = std::getenv("KILN_SOURCE_DIR");
  return e ? e : KILN_SOURCE_DIR;
}

}  // namespace

TEST(Jinja, ConstructsMatchJinja2Fixture) {
  std::ifstream f(source_dir() + "/tests/unit/jinja_cases.json");
  ASSERT_TRUE(f) << "missing tests/unit/jinja_cases.json";
  json cases = json::parse(f);
  ASSERT_GE(cases.size(), 20u);
  json ctx = json::parse(kCtx);
  for (const auto& c : cases) {
    std::string src = c[0].get<std::string>(), want = c[1].get<std::string>();
    auto got = render(src, ctx);
    ASSERT_TRUE(got.ok()) << src << "\n error: " << got.error().message;
    EXPECT_EQ(*got, want) << "template: " << src;
  }
}

TEST(Jinja, TemplateIsReusableAndCopyable) {
  auto t = jj::Template::parse("{{ x }}-{{ x * 2 }}");
  ASSERT_TRUE(t.ok());
  jj::Template copy = *t;
  for (int i = 0; i < 100; i++) {
    auto r = copy.render(json{{"x", i}});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, std::to_string(i) + "-" + std::to_string(2 * i));
  }
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  std::string e = error_of("line1\nline2\n{% if x %}\nno end");
  EXPECT_NE(e.find("template line"), std::string::npos) << e;
  e = error_of("a\nb\n{{ 1 + }}");
  EXPECT_EQ(e.rfind("template line 3: ", 0), 0u) << e;
  e = error_of("{% for %}");
  EXPECT_NE(e.find("syntax"), std::string::npos) << e;
  error_of("{{ 'unterminated }}");
  error_of("{# never closed");
  error_of("{% endfor %}");
  error_of("{% unknowntag %}");
  error_of("{% break %}");  // outside a loop: jinja2 fails to compile it too
  error_of("{{ (((((((((( 1 }}");
}

TEST(Jinja, UnknownFilterIsACompileErrorOutsideIf) {
  // jinja2: TemplateAssertionError at compile time ...
  std::string e = error_of("{{ x | no_such_filter }}");
  EXPECT_NE(e.find("no_such_filter"), std::string::npos) << e;
  // ... but inside an if-statement only when executed.
  auto ok = render("{% if false %}{{ x | no_such_filter }}{% endif %}ok");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(*ok, "ok");
  error_of("{% if true %}{{ x | no_such_filter }}{% endif %}ok");
}

TEST(Jinja, UndefinedSemantics) {
  // Printing / testing / defaulting undefined is fine (jinja2 default Undefined) ...
  auto r = render("[{{ nope }}][{{ nope|default('d') }}][{{ nope is defined }}][{{ nope|length }}]");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "[][d][False][0]");
  // ... attribute of undefined, arithmetic with undefined and calling it raise (UndefinedError).
  std::string e = error_of("a\n{{ nope.attr }}");
  EXPECT_EQ(e.rfind("template line 2: ", 0), 0u) << e;
  EXPECT_NE(e.find("'nope' is undefined"), std::string::npos) << e;
  error_of("{{ nope + 1 }}");
  error_of("{{ nope() }}");
  error_of("{{ nope['k'] }}");
  error_of("{{ nope|tojson }}");
}

TEST(Jinja, RaiseExceptionCarriesMessage) {
  std::string e = error_of("\n\n{{ raise_exception('Only user and assistant roles!') }}");
  EXPECT_EQ(e, "template line 3: raise_exception: Only user and assistant roles!");
}

TEST(Jinja, SandboxBlocksMutation) {
  // ImmutableSandboxedEnvironment: list.append / dict.update are SecurityErrors.
  error_of("{% set l = [] %}{{ l.append(1) }}");
  error_of("{% set d = {} %}{{ d.update({'a': 1}) }}");
  error_of("{% set x = 1 %}{% set x.attr = 2 %}");  // only namespaces take attribute sets
}

TEST(Jinja, TypeErrorsFail) {
  error_of("{{ 'a' + 1 }}");
  error_of("{{ 1 / 0 }}");
  error_of("{{ none < 1 }}");
  error_of("{% for x in 5 %}{% endfor %}");
  error_of("{{ 5|length }}");
  error_of("{{ (1, 2)|tojson(indent='x', separators=1) }}");
}

TEST(Jinja, InfiniteMacroRecursionIsBounded) {
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(e.find("recursion"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(Jinja, HugeRangeIsRejected) {
  // jinja2's sandbox: "Range too big" (MAX_RANGE = 100000).
  std::string e = error_of("{% for i in range(10**9) %}x{% endfor %}");
  EXPECT_NE(e.find("Range too big"), std::string::npos) << e;
}

TEST(Jinja, StepLimitStopsLongLoops) {
  jj::Options o = opts();
  o.max_steps = 100000;
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", json::object(), o);
  EXPECT_NE(e.find("max_steps"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(Jinja, OutputLimit) {
  jj::Options o = opts();
  o.max_output_bytes = 1000;
  std::string e = error_of("{% for i in range(1000) %}0123456789{% endfor %}", json::object(), o);
  EXPECT_NE(e.find("max_output_bytes"), std::string::npos) << e;
  error_of("{{ 'x' * 100000 }}", json::object(), o);
  auto ok = render("{% for i in range(10) %}0123456789{% endfor %}", json::object(), o);
  EXPECT_TRUE(ok.ok());
}

TEST(Jinja, HostileInputsNeverAbort) {
  // Random byte soup built from template syntax fragments: must return ok or an error.
  const char* frags[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", "if", "for", "x", " in ", "(", ")", "[", "]",
                         "'", "\"", "|", "tojson", ".", "endif", "endfor", "macro", "set", "=", ",", "\n", "\xff", "~"};
  uint32_t seed = 12345;
  for (int i = 0; i < 3000; i++) {
    std::string src;
    int n = 1 + i % 25;
    for (int k = 0; k < n; k++) {
      seed = seed * 1103515245u + 12345u;
      src += frags[(seed >> 8) % (sizeof frags / sizeof *frags)];
    }
    auto t = jj::Template::parse(src);
    if (t) (void)t->render(json{{"x", json::array({1, 2})}});
  }
}

TEST(Jinja, FixedStrftime) {
  auto f = jj::fixed_strftime("2026-11-30T08:05:09");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)("%Y-%m-%d %H:%M:%S %A"), "2026-11-30 08:05:09 Monday");
  EXPECT_FALSE(jj::fixed_strftime("30/11/2026").ok());
}
