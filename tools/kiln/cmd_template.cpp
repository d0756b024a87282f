// `kiln template render` — render a Jinja chat template with kiln's own Jinja engine.
// Single mode prints the rendered text exactly (no newline added); batch mode renders many
// contexts in one process and prints a JSON array of {"ok", "text" | "error"}.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/jinja/jinja.h"
#include "core/read_file.h"
#include "subcommand.h"

namespace {

using kiln::read_file;

const char* kUsage =
    "usage: kiln template render --template FILE (--context JSON_FILE | --batch JSON_FILE) [--now DATE]\n"
    "                            [--immutable]\n"
    "\n"
    "Renders a Jinja2 chat template with kiln's Jinja engine (HF transformers semantics:\n"
    "trim_blocks, lstrip_blocks, loop controls, tojson, raise_exception, strftime_now;\n"
    "list/dict methods such as append and update allowed, as llama-server renders).\n"
    "\n"
    "options:\n"
    "  --template FILE      the template source (.jinja)\n"
    "  --context FILE       a JSON object whose keys become template variables\n"
    "                       (messages, tools, add_generation_prompt, bos_token, ...);\n"
    "                       the rendered text is printed to stdout exactly, no newline added\n"
    "  --batch FILE         a JSON array of context objects; prints a JSON array with one\n"
    "                       {\"ok\": true, \"text\": ...} or {\"ok\": false, \"error\": ...} per context\n"
    "  --now DATE           pin strftime_now() to DATE (YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS])\n"
    "                       instead of the local time\n"
    "  --immutable          HF transformers' ImmutableSandboxedEnvironment: list.append,\n"
    "                       dict.update, ... are errors\n"
    "\n"
    "exit status: 0 rendered (batch: always 0 once the inputs are read), 1 template or\n"
    "context error (message on stderr), 2 usage error.\n";

int cmd_template(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "render") != 0) {
    std::fprintf(stderr, "kiln template: unknown action '%s'\n%s", argv[1], kUsage);
    return 2;
  }
  std::string tpl_path, ctx_path, batch_path, now;
  bool immutable = false;
  for (int i = 2; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    auto need = [&](std::string& dst) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kiln template render: %s needs a value\n", a.c_str());
        return false;
      }
      dst = argv[++i];
      return true;
    };
    bool ok = true;
    if (a == "--template") ok = need(tpl_path);
    else if (a == "--context") ok = need(ctx_path);
    else if (a == "--batch") ok = need(batch_path);
    else if (a == "--now") ok = need(now);
    else if (a == "--immutable") immutable = true;
    else {
      std::fprintf(stderr, "kiln template render: unknown option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (!ok) return 2;
  }
  if (tpl_path.empty() || (ctx_path.empty() == batch_path.empty())) {
    std::fprintf(stderr, "kiln template render: need --template and exactly one of --context / --batch\n%s", kUsage);
    return 2;
  }
  namespace jj = kiln::chat::jinja;
  jj::Options opt;
  opt.immutable_sandbox = immutable;
  if (!now.empty()) {
    auto f = jj::fixed_strftime(now);
    if (!f) {
      std::fprintf(stderr, "kiln template render: %s\n", f.error().message.c_str());
      return 2;
    }
    opt.strftime_now = *f;
  }
  std::string src;
  if (!read_file(tpl_path, src)) {
    std::fprintf(stderr, "kiln template render: cannot read template '%s'\n", tpl_path.c_str());
    return 1;
  }
  const std::string& in_path = ctx_path.empty() ? batch_path : ctx_path;
  std::string ctx_text;
  if (!read_file(in_path, ctx_text)) {
    std::fprintf(stderr, "kiln template render: cannot read '%s'\n", in_path.c_str());
    return 1;
  }
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(ctx_text, nullptr, false);
  if (ctx.is_discarded()) {
    std::fprintf(stderr, "kiln template render: '%s' is not valid JSON\n", in_path.c_str());
    return 1;
  }
  auto tpl = jj::Template::parse(src, opt);
  if (!batch_path.empty()) {
    if (!ctx.is_array()) {
      std::fprintf(stderr, "kiln template render: --batch '%s' must hold a JSON array of objects\n", in_path.c_str());
      return 1;
    }
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const auto& c : ctx) {
      nlohmann::ordered_json r;
      if (!tpl) {
        r["ok"] = false;
        r["error"] = tpl.error().message;
      } else {
        auto out = tpl->render(c);
        r["ok"] = out.ok();
        if (out) r["text"] = *out;
        else r["error"] = out.error().message;
      }
      results.push_back(std::move(r));
    }
    std::string s = results.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    std::fwrite(s.data(), 1, s.size(), stdout);
    return 0;
  }
  if (!tpl) {
    std::fprintf(stderr, "kiln template render: %s: %s\n", tpl_path.c_str(), tpl.error().message.c_str());
    return 1;
  }
  if (!ctx.is_object()) {
    std::fprintf(stderr, "kiln template render: --context '%s' must hold a JSON object\n", in_path.c_str());
    return 1;
  }
  auto out = tpl->render(ctx);
  if (!out) {
    std::fprintf(stderr, "kiln template render: %s: %s\n", tpl_path.c_str(), out.error().message.c_str());
    return 1;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}

}  // namespace

KILN_SUBCOMMAND(template, "render Jinja chat templates with kiln's engine (render)", cmd_template);
