// chat/tool_formats.h — the "block" tool-call formats: calls written between an opening and a
//   closing marker in a model family's own syntax (DeepSeek V3.1 and DSML, Kimi K2, MiniMax M1/M2,
//   Functionary v3.1/v3.2, Command R7B / R+, gpt-oss harmony; the layouts are listed at
//   chat::ToolCallFormat). One table says, per format, where calls start and end, which marker
//   texts are layout to drop from content, and which reasoning markers the family uses; one function
//   per format reads the text between the markers back into calls.
// Owns: BlockFormat (the table) and parse_block_calls (marker text → calls, typed by the tools'
//   schemas where values are written raw).
// Must not: stream or hold state (chat/output_parser.cpp drives these), know about tokens.
// Threading: plain data and pure functions; safe from any thread.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat.h"

namespace kiln::chat {

struct BlockFormat {
  std::string_view open;   // the marker that starts the calls
  std::string_view close;  // the marker that ends them; "" = the calls run to the end of the output
  // Layout markers removed from content wherever they appear (Command R7B's response markers,
  // harmony's channel headers).
  std::vector<std::string_view> drop;
  // Reasoning markers of the family when they are not <think>…</think> ("" = the template's own).
  std::string_view reasoning_start, reasoning_end;
  // FunctionaryV32: the output starts inside a ">>>" header (the generation prompt wrote ">>>").
  bool starts_with_recipient = false;
};

// The table entry of a block format, or nullptr for the formats OutputParser handles itself
// (<tool_call> forms, Mistral, Llama 3).
const BlockFormat* block_format(ToolCallFormat f);

struct ParsedCall {
  std::string name;
  std::string arguments;  // compact JSON text (raw JSON arguments are kept as the model wrote them)
  std::string id;         // the id the format carries (Kimi's functions.NAME:I); "" = generate one
};

// The text between the format's open and close markers (markers excluded) → calls. False when it
// is not a well-formed call block (the caller then keeps the text as content). `tools` types raw
// XML values (MiniMax, DSML string="false" is JSON-decoded regardless).
bool parse_block_calls(ToolCallFormat f, std::string_view body, const std::vector<Tool>& tools,
                       std::vector<ParsedCall>& calls);

// The marker texts a tool-call format writes (every format, not only the block ones). Models have
// most of them as single special tokens; the server preserves those (engine::Request::preserved_tokens).
std::vector<std::string_view> tool_call_markers(ToolCallFormat f);

// Tool-call format of a template source, for the block formats (None when it is none of them).
ToolCallFormat detect_block_format(std::string_view template_source);

// One XML / raw parameter value typed by the parameter's schema (tool_calls.cpp: strings stay
// strings, other types JSON-decoded when they parse).
ojson typed_param_value(const std::string& raw, const Tool* tool, const std::string& param);

}  // namespace kiln::chat
