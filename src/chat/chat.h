// chat/chat.h — the chat layer: OpenAI chat requests → template context → prompt text.
// Owns: validating and normalising an OpenAI `/v1/chat/completions` body's chat fields
//   (messages, tools, tool_choice, chat_template_kwargs, add_generation_prompt, reasoning_format),
//   building the Jinja context like llama.cpp / HF transformers do, rendering it with
//   chat/jinja, and detecting what a template needs downstream (reasoning markers, whether the
//   generation prompt opens a reasoning block, tool-call format). Output parsing (model text →
//   content / reasoning_content / tool_calls) lives in chat/output_parser.h.
// Must not: know about tokens, vocabularies or the engine; sampling parameters and the rest of the
//   request body are the server's business.
// Threading: ChatRequest / ChatTemplate are plain values; a ChatTemplate is immutable after
//   create() and apply() may be called from any number of threads at once.
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/result.h"

namespace kiln::chat {

using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Errors in a request body: a field path (`messages[2].role`) and a message. The server maps
// these to HTTP 400 with OpenAI's error shape ("invalid_request_error", param = field).
struct RequestError {
  std::string field;    // JSON path into the body: "messages[2].content[0].type", "tools[1].function.name"
  std::string message;  // "unknown role 'robot'"
  std::string to_string() const { return field.empty() ? message : field + ": " + message; }
};

template <class T>
class [[nodiscard]] RequestResult {
 public:
  RequestResult(T v) : v_(std::move(v)) {}
  RequestResult(RequestError e) : v_(std::move(e)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { KILN_CHECK(ok(), "RequestResult::value() on error: {}", error().to_string()); return std::get<0>(v_); }
  const T& value() const& { KILN_CHECK(ok(), "RequestResult::value() on error: {}", error().to_string()); return std::get<0>(v_); }
  T&& value() && { KILN_CHECK(ok(), "RequestResult::value() on error"); return std::get<0>(std::move(v_)); }
  const RequestError& error() const { KILN_CHECK(!ok(), "RequestResult::error() on success"); return std::get<1>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }

 private:
  std::variant<T, RequestError> v_;
};

// ---------------------------------------------------------------------------------------------
// Reasoning output handling, like llama-server's --reasoning-format.
//   None:           no split; everything the model generates goes to `content` verbatim.
//   Auto, Deepseek: `<think>…</think>` goes to `reasoning_content` (trimmed), the rest to content.
//   DeepseekLegacy: like Deepseek for a complete (non-streamed) response; when streaming the
//                   reasoning stays in `content` wrapped in <think>…</think> (llama-server
//                   sets reasoning_in_content = stream && deepseek-legacy). See ParserConfig.
enum class ReasoningFormat { None, Auto, Deepseek, DeepseekLegacy };
std::optional<ReasoningFormat> parse_reasoning_format(std::string_view s);  // "none"|"auto"|"deepseek"|"deepseek-legacy"
const char* reasoning_format_name(ReasoningFormat f);

// How a model writes tool calls.
//   None:       the template has no tool support; output is never parsed for calls.
//   QwenXml:    <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
//               (Qwen3.5, Qwen3-Coder)
//   HermesJson: <tool_call>\n{"name": NAME, "arguments": {…}}\n</tool_call> (Qwen2.5/3, Hermes)
//   ArgKeyXml:  <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call> (GLM-4.x,
//               Ling, Laguna)
//   MistralToolCalls: [TOOL_CALLS][{"name":…,"arguments":{…}}, …] (Nemo) or
//               [TOOL_CALLS]NAME[ARGS]{…} (Mistral Small 3.2, Devstral); runs to the end.
//   Llama3Json: the whole output is {"name": N, "parameters": {…}} (Llama 3.1-3.3), optionally
//               after <|python_tag|>.
// For the three <tool_call>…</tool_call> formats the output parser accepts any of the three bodies
// (XML, JSON, arg_key) whatever the template says.
// Block formats (chat/tool_formats.h: the calls sit between an opening and a closing marker):
//   DeepseekV31:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>
//   DeepseekDsml: <｜DSML｜function_calls><｜DSML｜invoke name="N"><｜DSML｜parameter name="P" string="true|false">V…
//                 (DeepSeek V3.2, V4)
//   KimiK2:       <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>{…}
//                 <|tool_call_end|>…<|tool_calls_section_end|>
//   MiniMaxXml:   <minimax:tool_call><invoke name="N"><parameter name="P">V</parameter></invoke></minimax:tool_call> (M2)
//   MiniMaxJson:  <tool_calls>\n{"name": N, "arguments": {…}}\n…</tool_calls> (M1)
//   FunctionaryV31: <function=NAME>{…}</function> (Functionary v3.1, Llama 3.1 based)
//   FunctionaryV32: after the prompt's ">>>": NAME\n{…} or all\nTEXT, more as >>>NAME\n{…} (v3.2)
//   CommandR7b:   <|START_ACTION|>[{"tool_call_id": "0", "tool_name": N, "parameters": {…}}, …]<|END_ACTION|>
//   CommandRPlus: Action:\n```json\n[{"tool_name": N, "parameters": {…}}, …]\n``` (runs to the end)
//   Harmony:      <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|> (gpt-oss)
enum class ToolCallFormat {
  None,
  QwenXml,
  HermesJson,
  ArgKeyXml,
  MistralToolCalls,
  Llama3Json,
  DeepseekV31,
  DeepseekDsml,
  KimiK2,
  MiniMaxXml,
  MiniMaxJson,
  FunctionaryV31,
  FunctionaryV32,
  CommandR7b,
  CommandRPlus,
  Harmony,
};
const char* tool_call_format_name(ToolCallFormat f);

// ---------------------------------------------------------------------------------------------
// A validated, normalised request.

struct ContentPart {
  enum class Kind { Text, Image };
  Kind kind = Kind::Text;
  std::string text;       // Kind::Text
  std::string image_url;  // Kind::Image: "https://…" or "data:image/png;base64,…" (not fetched here)
};

struct ToolCall {
  std::string id;         // may be empty in history; generated ids are "call_" + 24 alphanumerics
  std::string name;
  std::string arguments;  // a JSON text (OpenAI carries arguments as a string)
};

struct Message {
  std::string role;  // "system" | "developer" | "user" | "assistant" | "tool" (as sent)
  // Content: either a plain string, or a list of parts (content_is_parts), or absent/null.
  bool content_is_parts = false;
  bool content_is_null = false;
  std::string content;              // when !content_is_parts
  std::vector<ContentPart> parts;   // when content_is_parts
  std::optional<std::string> reasoning_content;  // assistant only
  std::vector<ToolCall> tool_calls;              // assistant only
  std::string tool_call_id;                      // tool only (may be empty)
  std::string name;                              // optional participant / tool name
};

struct Tool {
  std::string name;
  std::string description;
  ojson parameters = ojson::object();  // JSON schema of the arguments (object)
  ojson raw;                           // the tools[i] object as sent, passed to the template
};

// The tool named `name`, or nullptr.
const Tool* find_tool(const std::vector<Tool>& tools, std::string_view name);

struct ToolChoice {
  enum class Mode { Auto, None, Required, Named };
  Mode mode = Mode::Auto;
  std::string name;  // Mode::Named
};

struct ChatRequest {
  std::vector<Message> messages;
  std::vector<Tool> tools;
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  bool add_generation_prompt = true;
  ojson chat_template_kwargs = ojson::object();      // request-level kwargs (override server ones)
  std::optional<ReasoningFormat> reasoning_format;   // per-request override of --reasoning-format
  bool stream = false;
  const Tool* find_tool(std::string_view name) const { return chat::find_tool(tools, name); }
};

// Validates the chat fields of a /v1/chat/completions body. Unknown top-level keys are ignored
// (they belong to the server: sampling, max_tokens, …). Every error names the field.
RequestResult<ChatRequest> parse_chat_request(const ojson& body);

// ---------------------------------------------------------------------------------------------
// Templates.

// The text that stands in for each image part in the rendered prompt, in order; the vision code
// later maps each occurrence to the image's embeddings (llama.cpp's mtmd uses the same marker).
inline constexpr std::string_view kMediaMarker = "<__media__>";

struct TemplateCaps {
  bool supports_tools = false;          // rendering a probe tool shows the tool's name
  bool supports_typed_content = false;  // renders content given as a list of text parts
  bool supports_system_role = false;    // renders a system message's text
  bool supports_thinking = false;       // template knows reasoning markers / enable_thinking
  bool uses_enable_thinking = false;    // source reads `enable_thinking`
  bool uses_preserve_vars = false;      // source reads preserve_thinking / clear_thinking / …
  std::string reasoning_start;          // "<think>" when supports_thinking
  std::string reasoning_end;            // "</think>"
  ToolCallFormat tool_format = ToolCallFormat::None;
  bool string_arguments = false;        // history tool calls get arguments as a JSON string (the
                                        // template concatenates them; Functionary v3.2), not an object
};

struct TemplateConfig {
  std::string name = "chat template";  // for error messages (a file path or "tokenizer.chat_template")
  std::string bos_token;
  std::string eos_token;
  // strftime_now for templates that print today's date; empty = the Jinja engine's default.
  std::function<std::string(const std::string& fmt)> strftime_now;
};

// Server-level settings that shape the context (llama-server flags).
struct ApplyOptions {
  bool reasoning_preserve = true;         // --reasoning-preserve / --no-reasoning-preserve
  ojson default_kwargs = ojson::object();  // --chat-template-kwargs (the request's win)
  std::optional<bool> enable_thinking;     // --reasoning on|off (kwargs enable_thinking wins)
  ReasoningFormat reasoning_format = ReasoningFormat::Auto;  // --reasoning-format
};

// What the output parser must be configured with for one response. Build with
// Prompt::parser_config(); everything here is plain data.
struct ParserConfig {
  ReasoningFormat reasoning_format = ReasoningFormat::Auto;
  bool reasoning_in_content = false;   // stream && DeepseekLegacy: keep <think>…</think> in content
  bool starts_in_reasoning = false;    // the prompt already opened the reasoning block
  std::string reasoning_start = "<think>";
  std::string reasoning_end = "</think>";
  bool parse_tool_calls = false;       // tools present, tool_choice != none, template has a format
  ToolCallFormat tool_format = ToolCallFormat::HermesJson;  // any <tool_call> form; or Mistral / Llama3
  std::vector<Tool> tools;             // for typing XML parameter values by their schema
  // Id generator for tool calls; empty = "call_" + 24 random alphanumerics.
  std::function<std::string()> make_tool_call_id;
};

struct Prompt {
  std::string text;                     // the rendered prompt (BOS not added: the tokenizer's job)
  ojson context;                        // the exact Jinja context rendered (for debugging / tests)
  std::vector<std::string> image_urls;  // one per kMediaMarker in `text`, in order
  bool starts_in_reasoning = false;     // generation prompt ends inside an open reasoning block
  ParserConfig parser;                  // ready-to-use config for chat::OutputParser
};

class ChatTemplate {
 public:
  // Parses the template and probes its capabilities. Errors name cfg.name.
  static kiln::Result<ChatTemplate> create(std::string_view source, TemplateConfig cfg = {});

  const TemplateCaps& caps() const { return caps_; }
  const std::string& source() const { return source_; }

  // Builds the context for `req` (see build_context) and renders it. Template errors
  // (raise_exception, undefined access) come back as Error naming the template.
  kiln::Result<Prompt> apply(const ChatRequest& req, const ApplyOptions& opt = {}) const;

  // The Jinja context apply() renders, without rendering it. image_urls receives the images.
  ojson build_context(const ChatRequest& req, const ApplyOptions& opt,
                      std::vector<std::string>* image_urls = nullptr) const;

  // Renders an arbitrary context (used by the capability probes and by tests).
  kiln::Result<std::string> render(const ojson& context) const;

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

 private:
  ChatTemplate();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string source_;
  TemplateConfig cfg_;
  TemplateCaps caps_;
};

}  // namespace kiln::chat
