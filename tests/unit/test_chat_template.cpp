// ChatTemplate: capability detection on real templates, the context it builds (llama-server
// semantics), and the parser configuration it derives. Prompt text equality against Python jinja2
// is tested in tests/py/test_chat_context.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/read_file.h"
#include "chat/chat.h"
#include "chat/output_parser.h"

using namespace kiln::chat;
using kiln::read_file;

namespace {

std::filesystem::path templates_dir() {
  const char* env = std::getenv("KILN_SOURCE_DIR");
  std::filesystem::path root = env ? env : KILN_SOURCE_DIR;
  return root / ".." / "shared" / "data" / "chat-templates";
}

std::string read(const std::filesystem::path& p) {
  std::string s;
  read_file(p.string(), s);
  return s;
}

#define LOAD_TEMPLATE(var, file)                                                        \
  auto var##_path = templates_dir() / (file);                                           \
  if (!std::filesystem::exists(var##_path)) GTEST_SKIP() << "no test data: " << var##_path; \
  auto var##_r = ChatTemplate::create(read(var##_path), TemplateConfig{(file), "<s>", "</s>", {}}); \
  ASSERT_TRUE(var##_r.ok()) << var##_r.error().message;                                 \
  ChatTemplate& var = var##_r.value()

ChatRequest req(const char* json) {
  auto r = parse_chat_request(ojson::parse(json));
  KILN_CHECK(r.ok(), "bad test request: {}", r.error().to_string());
  return std::move(r).value();
}

const char* kToolsReq = R"({"messages":[{"role":"user","content":"Weather in Oslo for 3 days?"}],
  "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
  "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}]})";

}  // namespace

TEST(ChatTemplate, CapsQwen35) {
  LOAD_TEMPLATE(t, "Qwen3.5-4B.jinja");
  const TemplateCaps& c = t.caps();
  EXPECT_TRUE(c.supports_tools);
  EXPECT_TRUE(c.supports_typed_content);
  EXPECT_TRUE(c.supports_system_role);
  EXPECT_TRUE(c.supports_thinking);
  EXPECT_TRUE(c.uses_enable_thinking);
  EXPECT_EQ(c.reasoning_start, "<think>");
  EXPECT_EQ(c.reasoning_end, "</think>");
  EXPECT_EQ(c.tool_format, ToolCallFormat::QwenXml);
}

TEST(ChatTemplate, CapsOtherFamilies) {
  {
    LOAD_TEMPLATE(t, "Qwen-Qwen2.5-7B-Instruct.jinja");
    EXPECT_EQ(t.caps().tool_format, ToolCallFormat::HermesJson);
    EXPECT_FALSE(t.caps().supports_thinking);
    EXPECT_FALSE(t.caps().supports_typed_content);  // prints message.content as a string
  }
  {
    LOAD_TEMPLATE(t, "GLM-4.7-Flash.jinja");
    EXPECT_EQ(t.caps().tool_format, ToolCallFormat::ArgKeyXml);
  }
  {
    LOAD_TEMPLATE(t, "meta-llama-Llama-3.1-8B-Instruct.jinja");
    EXPECT_TRUE(t.caps().supports_tools);
    EXPECT_EQ(t.caps().tool_format, ToolCallFormat::Llama3Json);
  }
  {
    LOAD_TEMPLATE(t, "mistralai-Mistral-Nemo-Instruct-2407.jinja");
    EXPECT_EQ(t.caps().tool_format, ToolCallFormat::MistralToolCalls);
  }
  {
    LOAD_TEMPLATE(t, "unsloth-mistral-Devstral-Small-2507.jinja");
    EXPECT_EQ(t.caps().tool_format, ToolCallFormat::MistralToolCalls);
  }
  {
    LOAD_TEMPLATE(t, "Qwen-Qwen3-0.6B.jinja");
    EXPECT_EQ(t.caps().tool_format, ToolCallFormat::HermesJson);
    EXPECT_TRUE(t.caps().supports_thinking);
  }
  {
    LOAD_TEMPLATE(t, "google-gemma-2-2b-it.jinja");
    EXPECT_FALSE(t.caps().supports_system_role);  // gemma 2 raises on a system message
    EXPECT_FALSE(t.caps().supports_tools);
  }
}

TEST(ChatTemplate, GenerationPromptOpensReasoning) {
  LOAD_TEMPLATE(t, "Qwen3.5-4B.jinja");
  auto p = t.apply(req(R"({"messages":[{"role":"user","content":"hi"}]})"));
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(p->starts_in_reasoning);
  EXPECT_TRUE(p->parser.starts_in_reasoning);
  EXPECT_FALSE(p->parser.parse_tool_calls);

  // enable_thinking=false: the template closes the block itself.
  p = t.apply(req(R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}})"));
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->starts_in_reasoning);
  EXPECT_FALSE(p->parser.starts_in_reasoning);

  // No generation prompt: nothing is open.
  p = t.apply(req(R"({"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false})"));
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->starts_in_reasoning);

  // --reasoning-format none: raw output, the parser does not start in reasoning.
  ApplyOptions none;
  none.reasoning_format = ReasoningFormat::None;
  p = t.apply(req(R"({"messages":[{"role":"user","content":"hi"}]})"), none);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->starts_in_reasoning);
  EXPECT_FALSE(p->parser.starts_in_reasoning);
  EXPECT_EQ(p->parser.reasoning_format, ReasoningFormat::None);
}

TEST(ChatTemplate, EnableThinkingPrecedence) {
  LOAD_TEMPLATE(t, "Qwen3.5-4B.jinja");
  ApplyOptions opt;
  EXPECT_EQ(t.build_context(req(R"({"messages":[{"role":"user","content":"a"}]})"), opt)["enable_thinking"], true);
  opt.enable_thinking = false;  // --reasoning off
  EXPECT_EQ(t.build_context(req(R"({"messages":[{"role":"user","content":"a"}]})"), opt)["enable_thinking"], false);
  // The request's kwargs win over the server's.
  EXPECT_EQ(t.build_context(req(R"({"messages":[{"role":"user","content":"a"}],"chat_template_kwargs":{"enable_thinking":true}})"), opt)
                ["enable_thinking"],
            true);
  opt.enable_thinking.reset();
  opt.default_kwargs = {{"enable_thinking", false}, {"custom", 3}, {"messages", "nope"}};
  ojson ctx = t.build_context(req(R"({"messages":[{"role":"user","content":"a"}]})"), opt);
  EXPECT_EQ(ctx["enable_thinking"], false);
  EXPECT_EQ(ctx["custom"], 3);
  EXPECT_TRUE(ctx["messages"].is_array());  // kwargs cannot replace the conversation
}

TEST(ChatTemplate, ToolChoiceAndFormatDriveTheParser) {
  LOAD_TEMPLATE(t, "Qwen3.5-4B.jinja");
  auto p = t.apply(req(kToolsReq));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->parser.parse_tool_calls);
  ASSERT_EQ(p->parser.tools.size(), 1u);

  ChatRequest none = req(kToolsReq);
  none.tool_choice.mode = ToolChoice::Mode::None;
  p = t.apply(none);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->parser.parse_tool_calls);

  ChatRequest legacy = req(kToolsReq);
  legacy.reasoning_format = ReasoningFormat::DeepseekLegacy;
  legacy.stream = true;
  p = t.apply(legacy);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->parser.reasoning_in_content);
  legacy.stream = false;
  p = t.apply(legacy);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->parser.reasoning_in_content);
}

TEST(ChatTemplate, EndToEndQwen35ToolCall) {
  // Prompt → (model output) → parsed message, with the request's schema typing the values.
  LOAD_TEMPLATE(t, "Qwen3.5-4B.jinja");
  auto p = t.apply(req(kToolsReq));
  ASSERT_TRUE(p.ok());
  ParsedMessage m = parse_output(
      "User asks weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
      p->parser);
  EXPECT_EQ(m.reasoning_content, "User asks weather.");
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(ojson::parse(m.tool_calls[0].arguments), ojson::parse(R"({"city":"Oslo","days":3})"));
  EXPECT_EQ(m.finish_reason("stop"), "tool_calls");
}

TEST(ChatTemplate, ContentPartsAndImages) {
  const char* body = R"({"messages":[{"role":"user","content":[{"type":"text","text":"look"},
      {"type":"image_url","image_url":{"url":"http://x/1.png"}},{"type":"text","text":"and"},
      {"type":"image_url","image_url":"http://x/2.png"}]}]})";
  {
    LOAD_TEMPLATE(t, "Qwen3.5-4B.jinja");  // typed content: parts stay a list
    std::vector<std::string> urls;
    ojson ctx = t.build_context(req(body), {}, &urls);
    const ojson& content = ctx["messages"][0]["content"];
    ASSERT_TRUE(content.is_array());
    ASSERT_EQ(content.size(), 4u);
    EXPECT_EQ(content[1], ojson({{"type", "text"}, {"text", kMediaMarker}}));
    EXPECT_EQ(urls, (std::vector<std::string>{"http://x/1.png", "http://x/2.png"}));
    auto p = t.apply(req(body));
    ASSERT_TRUE(p.ok());
    EXPECT_NE(p->text.find("look<__media__>and<__media__>"), std::string::npos) << p->text;
    EXPECT_EQ(p->image_urls.size(), 2u);
  }
  {
    LOAD_TEMPLATE(t, "Qwen-Qwen2.5-7B-Instruct.jinja");  // string-only: parts joined with "\n"
    ojson ctx = t.build_context(req(body), {});
    EXPECT_EQ(ctx["messages"][0]["content"], "look\n<__media__>\nand\n<__media__>");
  }
}

TEST(ChatTemplate, ReasoningPreserveAndRoles) {
  // A small template that prints what the context holds, plus the llama.cpp preserve variables.
  auto t = ChatTemplate::create(
      "{% if preserve_thinking %}P{% endif %}{% if clear_thinking %}C{% endif %}"
      "{% for m in messages %}[{{ m.role }}:{{ m.content }}:{{ m.reasoning_content }}:"
      "{% for c in m.tool_calls or [] %}{{ c.function.name }}({{ c.function.arguments.x }}){% endfor %}]{% endfor %}",
      TemplateConfig{"inline", "", "", {}});
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(t->caps().uses_preserve_vars);
  ChatRequest r = req(R"({"messages":[
    {"role":"developer","content":"sys"},
    {"role":"user","content":"q1"},
    {"role":"assistant","content":"a1","reasoning_content":"r1"},
    {"role":"user","content":"q2"},
    {"role":"assistant","content":null,"reasoning_content":"r2","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"x\":5}"}}]},
    {"role":"tool","tool_call_id":"c","content":"ok"}]})");
  ApplyOptions keep;
  auto p = t->apply(r, keep);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->text, "P[system:sys::][user:q1::][assistant:a1:r1:][user:q2::][assistant::r2:f(5)][tool:ok::]");
  ApplyOptions drop;
  drop.reasoning_preserve = false;
  p = t->apply(r, drop);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->text, "C[system:sys::][user:q1::][assistant:a1::][user:q2::][assistant::r2:f(5)][tool:ok::]");
}

TEST(ChatTemplate, Errors) {
  auto bad = ChatTemplate::create("{% for x in %}", TemplateConfig{"broken.jinja", "", "", {}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("broken.jinja"), std::string::npos) << bad.error().message;

  LOAD_TEMPLATE(t, "Qwen3.5-4B.jinja");
  auto p = t.apply(req(R"({"messages":[{"role":"user","content":"a"},{"role":"system","content":"late"}]})"));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("Qwen3.5-4B.jinja"), std::string::npos) << p.error().message;
  EXPECT_NE(p.error().message.find("System message must be at the beginning"), std::string::npos);
}
