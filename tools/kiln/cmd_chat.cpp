// `kiln chat …` — apply a chat template to an OpenAI request, or parse model output, and print
// the result as JSON. For debugging templates and for the Python oracle tests (tests/py/test_chat_*.py).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <random>

#include "chat/chat.h"
#include "chat/jinja/jinja.h"
#include "chat/output_parser.h"
#include "core/read_file.h"
#include "subcommand.h"

namespace {

using kiln::chat::ojson;
using kiln::read_file;

int fail(const std::string& msg) {
  std::fprintf(stderr, "kiln chat: %s\n", msg.c_str());
  return 1;
}

struct Common {
  std::string template_path, request_path, bos, eos, kwargs, now, reasoning_format = "auto";
  bool no_preserve = false;
  void add(CLI::App& app) {
    app.add_option("--template", template_path, "chat template file (.jinja)")->required();
    app.add_option("--request", request_path, "OpenAI chat request body (JSON file)")->required();
    app.add_option("--bos", bos, "bos_token");
    app.add_option("--eos", eos, "eos_token");
    app.add_option("--chat-template-kwargs", kwargs, "server-level kwargs (JSON object)");
    app.add_option("--now", now, "fixed date for strftime_now (YYYY-MM-DD)");
    app.add_option("--reasoning-format", reasoning_format, "none|auto|deepseek|deepseek-legacy");
    app.add_flag("--no-reasoning-preserve", no_preserve, "drop reasoning_content of earlier turns");
  }
};

// Applies the template; on success fills prompt and returns 0, else prints and returns non-zero.
int apply(const Common& c, kiln::chat::Prompt& prompt, kiln::chat::TemplateCaps& caps, kiln::chat::ChatRequest& req) {
  std::string src, body;
  if (!read_file(c.template_path, src)) return fail("cannot read " + c.template_path);
  if (!read_file(c.request_path, body)) return fail("cannot read " + c.request_path);
  ojson j = ojson::parse(body, nullptr, false);
  if (j.is_discarded()) return fail(c.request_path + ": not valid JSON");
  auto r = kiln::chat::parse_chat_request(j);
  if (!r.ok()) {
    std::printf("%s\n", ojson({{"error", {{"field", r.error().field}, {"message", r.error().message}}}}).dump(1).c_str());
    return 1;
  }
  req = r.value();
  kiln::chat::TemplateConfig tc;
  tc.name = c.template_path;
  tc.bos_token = c.bos;
  tc.eos_token = c.eos;
  if (!c.now.empty()) {
    auto f = kiln::chat::jinja::fixed_strftime(c.now);
    if (!f.ok()) return fail(f.error().message);
    tc.strftime_now = f.value();
  }
  auto t = kiln::chat::ChatTemplate::create(src, tc);
  if (!t.ok()) return fail(t.error().message);
  kiln::chat::ApplyOptions opt;
  opt.reasoning_preserve = !c.no_preserve;
  auto rf = kiln::chat::parse_reasoning_format(c.reasoning_format);
  if (!rf) return fail("unknown --reasoning-format " + c.reasoning_format);
  opt.reasoning_format = *rf;
  if (!c.kwargs.empty()) {
    opt.default_kwargs = ojson::parse(c.kwargs, nullptr, false);
    if (!opt.default_kwargs.is_object()) return fail("--chat-template-kwargs must be a JSON object");
  }
  auto p = t->apply(req, opt);
  if (!p.ok()) return fail(p.error().message);
  prompt = std::move(p).value();
  caps = t->caps();
  return 0;
}

ojson caps_json(const kiln::chat::TemplateCaps& c) {
  return {{"supports_tools", c.supports_tools},
          {"supports_typed_content", c.supports_typed_content},
          {"supports_system_role", c.supports_system_role},
          {"supports_thinking", c.supports_thinking},
          {"reasoning_start", c.reasoning_start},
          {"reasoning_end", c.reasoning_end},
          {"tool_format", kiln::chat::tool_call_format_name(c.tool_format)}};
}

int render_main(int argc, char** argv) {
  CLI::App app{"kiln chat render: OpenAI request → template context and prompt (JSON on stdout)"};
  Common c;
  c.add(app);
  CLI11_PARSE(app, argc, argv);
  kiln::chat::Prompt p;
  kiln::chat::TemplateCaps caps;
  kiln::chat::ChatRequest req;
  if (int rc = apply(c, p, caps, req)) return rc;
  ojson out = {{"prompt", p.text},
               {"context", p.context},
               {"image_urls", p.image_urls},
               {"starts_in_reasoning", p.starts_in_reasoning},
               {"caps", caps_json(caps)},
               {"parser",
                {{"reasoning_format", kiln::chat::reasoning_format_name(p.parser.reasoning_format)},
                 {"reasoning_in_content", p.parser.reasoning_in_content},
                 {"starts_in_reasoning", p.parser.starts_in_reasoning},
                 {"parse_tool_calls", p.parser.parse_tool_calls}}}};
  std::printf("%s\n", out.dump(1, ' ', false, ojson::error_handler_t::replace).c_str());
  return 0;
}

int parse_main(int argc, char** argv) {
  CLI::App app{"kiln chat parse: model output → streamed deltas and the final message (JSON on stdout)"};
  Common c;
  std::string output_path;
  int max_chunk = 1;
  unsigned seed = 0;
  c.add(app);
  app.add_option("--output", output_path, "file holding the generated text")->required();
  app.add_option("--max-chunk", max_chunk, "feed random chunks of 1..N bytes (1 = byte by byte)");
  app.add_option("--seed", seed, "chunking seed");
  CLI11_PARSE(app, argc, argv);
  kiln::chat::Prompt p;
  kiln::chat::TemplateCaps caps;
  kiln::chat::ChatRequest req;
  if (int rc = apply(c, p, caps, req)) return rc;
  std::string text;
  if (!read_file(output_path, text)) return fail("cannot read " + output_path);
  kiln::chat::OutputParser parser(p.parser);
  std::mt19937 rng(seed);
  ojson chunks = ojson::array();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t n = 1 + (max_chunk > 1 ? rng() % static_cast<unsigned>(max_chunk) : 0);
    auto d = parser.feed(std::string_view(text).substr(pos, n));
    pos += n;
    if (!d.empty()) chunks.push_back(kiln::chat::delta_to_json(d));
  }
  auto d = parser.finish();
  if (!d.empty()) chunks.push_back(kiln::chat::delta_to_json(d));
  ojson out = {{"chunks", chunks},
               {"message", kiln::chat::message_to_json(parser.message())},
               {"finish_reason", parser.message().finish_reason("stop")}};
  std::printf("%s\n", out.dump(1, ' ', false, ojson::error_handler_t::replace).c_str());
  return 0;
}

int cmd_chat(int argc, char** argv) {
  const char* usage =
      "usage: kiln chat <action> [options]\n\n"
      "actions:\n"
      "  render --template F --request R.json   print the template context and rendered prompt\n"
      "  parse  --template F --request R.json --output T.txt [--max-chunk N --seed S]\n"
      "                                         stream-parse generated text; print deltas and message\n";
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "render")) return render_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "parse")) return parse_main(argc - 1, argv + 1);
  std::fprintf(stderr, "kiln chat: unknown action '%s'\n%s", argv[1], usage);
  return 2;
}

}  // namespace

KILN_SUBCOMMAND(chat, "chat templates and output parsing (render, parse)", cmd_chat);
