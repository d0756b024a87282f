// chat/output_parser.h — model output text → OpenAI assistant message, incrementally.
// Owns: splitting generated text into content / reasoning_content / tool_calls while it streams
//   (fed arbitrary chunks, down to one byte at a time), and the final complete message.
// Must not: know about tokens, sampling or HTTP; it never fails: malformed output (an unterminated
//   tool call, bad JSON) degrades to plain content.
// Threading: one OutputParser per response, used from one thread at a time.
//
// Streaming contract: the concatenation of every Delta returned by feed() and finish() equals the
// message that a single feed(whole text) + finish() produces, for every way of chunking the text.
// No delta ever contains part of a marker (<think>, </think>, <tool_call>): a suffix that could be
// the start of one is held back until the next chunk (or finish()) decides. Tool calls stream as
// OpenAI does: a first delta with index, id and function.name (arguments ""), then pieces of
// function.arguments (index only) as the model writes them (chat/tool_stream.h; formats whose
// arguments are not JSON text send a call whole, or Qwen XML one parameter at a time). A call whose
// header was sent is final: its arguments are what was sent, in the blocking answer too.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat.h"
#include "chat/tool_formats.h"
#include "chat/tool_stream.h"

namespace kiln::chat {

struct ToolCallDelta {
  int index = 0;          // position of the call in the message's tool_calls
  std::string id;         // "call_…", unique; set on the call's first delta only ("" on later pieces)
  std::string name;       // first delta only
  std::string arguments;  // a piece of the arguments' JSON text (the pieces of a call add up to it)
  bool first() const { return !id.empty(); }
};

struct Delta {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning_content.empty() && tool_calls.empty(); }
  // Appends o; a piece of the call that ends this delta's list is merged into it.
  void append(const Delta& o);
};

// The complete assistant message.
struct ParsedMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
  // The last call's arguments were cut by the end of generation (they are the incomplete JSON that
  // was streamed; OpenAI sends the same with finish_reason "length").
  bool last_call_cut = false;
  // "tool_calls" when there are calls, else engine_reason ("stop", "length", …); "length" when the
  // engine stopped at the length limit inside a call's arguments.
  std::string finish_reason(std::string_view engine_reason) const;
};

class OutputParser {
 public:
  explicit OutputParser(ParserConfig cfg);

  // Feeds the next piece of generated text; returns what can be emitted now (maybe nothing).
  Delta feed(std::string_view text);
  // End of generation: flushes everything held back (unterminated tool call → content,
  // unterminated reasoning → reasoning_content). feed() must not be called afterwards.
  Delta finish();

  // Everything emitted so far (the complete message after finish()).
  const ParsedMessage& message() const { return msg_; }

 private:
  enum class Mode { Start, Reasoning, Content, ToolCall, TailCalls, Block };
  Delta process(bool final);
  void emit_reasoning(std::string_view text, bool closing, Delta& d);
  void emit_content(std::string_view text, Delta& d);
  void flush_content_ws(Delta& d);
  void add_content(std::string_view text, Delta& d);
  void emit_tool_call(std::string name, std::string arguments, Delta& d, std::string id = {});  // assigns index (and id)
  void add_arguments(std::string_view piece, Delta& d);  // a piece of the last call's arguments
  // Feeds the body of the open call / block to streamer_ and emits its events.
  void run_streamer(std::string_view body, bool complete, Delta& d);
  // Content of a block format (chat/tool_formats.h): drops layout markers, opens Mode::Block at the
  // format's open marker. Returns true to continue the loop, false to return.
  bool process_block_content(bool final, Delta& d);
  bool process_block(bool final, Delta& d);

  ParserConfig cfg_;
  Mode mode_;
  bool finished_ = false;
  std::string buf_;                 // text not yet consumed
  size_t scan_from_ = 0;            // ToolCall mode: where to resume searching for </tool_call>
  bool reasoning_started_ = false;  // a non-whitespace reasoning byte was emitted
  std::string reasoning_ws_;        // trailing whitespace of reasoning, held back
  bool content_skip_ws_ = false;    // drop leading whitespace (after </think> or </tool_call>)
  std::string content_ws_;          // trailing whitespace of content, held back
  std::string tool_ws_;             // whitespace dropped before the current <tool_call>
  std::string tail_marker_;         // TailCalls: the marker that opened it ("[TOOL_CALLS]", …)
  bool llama_decided_ = false;      // Llama3Json: the start of the output was not a call
  const BlockFormat* block_ = nullptr;  // the block format's table entry (tool_formats.h), or null
  bool recipient_decided_ = false;  // FunctionaryV32: the first ">>>" header was read
  std::optional<CallStreamer> streamer_;  // the open call / block, read incrementally
  ParsedMessage msg_;
};

// Non-streaming: one feed + finish.
ParsedMessage parse_output(std::string_view text, const ParserConfig& cfg);

// The body between <tool_call> and </tool_call>, in Qwen XML or JSON form. Returns false (and
// leaves name/arguments unspecified) when it is neither. XML parameter values are JSON-decoded when
// the tool's schema gives the parameter a non-string type and the text parses; else strings.
bool parse_tool_call_body(std::string_view body, const std::vector<Tool>& tools, std::string& name,
                          std::string& arguments);

// Calls that run to the end of the output: Mistral (after "[TOOL_CALLS]": a JSON array of
// {name, arguments}, or NAME[ARGS]{…} segments separated by "[TOOL_CALLS]") and Llama 3.x (a JSON
// object {name, parameters|arguments}, or an array of them; every name must be one of `tools`).
bool parse_tail_tool_calls(ToolCallFormat format, std::string_view text, const std::vector<Tool>& tools,
                           std::vector<std::pair<std::string, std::string>>& calls);

// OpenAI JSON shapes, for the server.
//   delta_to_json:   {"content":…, "reasoning_content":…, "tool_calls":[{index,id,type,function}]}
//                    (only non-empty fields; a call's later pieces: {index, function:{arguments}})
//   message_to_json: {"role":"assistant","content":…|null,"reasoning_content":… (if any),
//                     "tool_calls":[…] (if any)}
ojson delta_to_json(const Delta& d);
ojson message_to_json(const ParsedMessage& m);

// "call_" + 24 random alphanumerics (thread-safe).
std::string random_tool_call_id();

}  // namespace kiln::chat
