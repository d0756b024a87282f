// chat/tool_stream.h — streaming tool calls piece by piece: the header of a call (its name) as soon
//   as it is written, then its arguments as the model writes them.
// Owns: JsonArgsScanner (an incremental, validating reader of one JSON object that emits its text —
//   as written, or with the whitespace between tokens removed — as bytes arrive) and CallStreamer
//   (per tool-call format: where a call's name and arguments sit in the text between the format's
//   markers, read incrementally; Qwen XML parameters are sent one whole parameter at a time).
// Must not: find the markers that open / close a call or block (chat/output_parser.cpp does, and
//   hands this the body text before the closing marker), hold tokens, fail: text it cannot stream is
//   reported (failed()) so that the caller parses the whole body as before.
// Threading: one CallStreamer per call block, used by one thread at a time.
//
// Determinism: every decision is taken on a prefix of the body, byte by byte, so the events do not
// depend on how the body was chunked (OutputParser's chunking invariance).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat.h"

namespace kiln::chat {

// One JSON object, read byte by byte. Numbers and literals are held until they end (and checked);
// string bytes are passed on at once (an escape once complete).
class JsonArgsScanner {
 public:
  enum class Status { More, Done, Invalid };
  explicit JsonArgsScanner(bool minify) : minify_(minify) {}
  // A scanner placed just after a member value of an object (reads the rest of that object).
  static JsonArgsScanner rest_of_object();
  // c: the next byte. Appends what can be emitted to `out`. Done: c closed the object. Invalid: c
  // cannot continue a JSON object (nothing appended; the scanner must not be fed again).
  Status feed(char c, std::string& out);
  // The object has shown it is one: its first key and colon were read, or it closed empty.
  bool confirmed() const { return confirmed_; }

 private:
  enum class Expect { Value, KeyOrEnd, Key, Colon, CommaOrEnd, ValueOrEnd };
  Status after_value();
  Status flush_scalar(std::string& out);
  bool minify_;
  bool started_ = false, confirmed_ = false;
  std::vector<char> stack_;  // '{' / '['
  Expect expect_ = Expect::Value;
  bool in_string_ = false, string_is_key_ = false;
  std::string esc_;      // an escape being read ("\\", "\\u12")
  std::string scalar_;   // a number or literal being read
};

// Events of a call block: a call begins (name, and the id the format carries or ""), or a piece of
// the current call's arguments.
struct CallEvent {
  bool begin = false;
  std::string name, id;  // begin only
  std::string args;      // a piece of the current call's arguments (begin: "")
};

class CallStreamer {
 public:
  // `in_tool_call`: the body of a <tool_call>…</tool_call> (Qwen XML / Hermes JSON); else the body
  // of `format`'s block (chat/tool_formats.h) or, for Mistral / Llama 3, the text after the marker.
  CallStreamer(ToolCallFormat format, bool in_tool_call, const std::vector<Tool>* tools);

  // body: the whole body so far (it only grows; the streamer remembers how far it has read).
  // complete: the body is whole (its closing marker arrived, or the output ended).
  void feed(std::string_view body, bool complete, std::vector<CallEvent>& out);

  // A call was sent: the streamer owns the block (its calls are final, the rest of the body is layout
  // or dropped). Until then, failed() says that the body is not in a streamable form.
  bool committed() const { return committed_; }
  bool failed() const { return state_ == State::Failed; }
  // The body ended inside a sent call's JSON arguments (they are incomplete).
  bool cut() const { return cut_; }

 private:
  enum class State { Header, Json, AfterJson, XmlParams, Skip, Failed };
  enum class Match { Need, No, Yes };
  Match header(std::string_view s, size_t& len, std::string& name, std::string& id);
  Match after_json(std::string_view s, size_t& len, bool& next_call);
  bool xml_step(std::string_view s, bool complete, size_t& len, std::vector<CallEvent>& out);
  void begin(std::string name, std::string id);             // a call's header was read
  void confirm(std::vector<CallEvent>& out);                  // …and its arguments look right
  void piece(std::string text, std::vector<CallEvent>& out);  // held until confirmed
  void give_up();

  ToolCallFormat format_;
  bool in_tool_call_;
  const std::vector<Tool>* tools_;
  State state_ = State::Header;
  size_t pos_ = 0;
  bool committed_ = false, cut_ = false;
  int n_calls_ = 0;
  // The header of the current call is held (not yet an event) until its arguments show a first
  // key (JSON) or a first closed parameter (Qwen XML): a body that is not a call after all still
  // falls back to the whole-body parse (and to content).
  bool pending_ = false;
  std::string pending_name_, pending_id_, pending_args_;
  bool mistral_array_ = false;  // Mistral Nemo: [{…}, …]
  JsonArgsScanner json_{true};
  int xml_params_ = 0;       // Qwen XML: parameters sent so far in the current call
  bool xml_open_ = false;    // Qwen XML: "{" sent, "}" not yet
  std::string xml_name_;     // Qwen XML: the current call's tool
};

// Whether `format` streams a call's arguments as they are written (JSON arguments written in
// order) — the others send a call whole when it closes (Qwen XML: one parameter at a time).
bool streams_arguments(ToolCallFormat format);

}  // namespace kiln::chat
