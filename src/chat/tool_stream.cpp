// chat/tool_stream.cpp — incremental tool-call reading: the JSON object scanner and the per-format
//   call headers (see tool_stream.h).
#include "chat/tool_stream.h"

#include "chat/text_util.h"
#include "chat/tool_formats.h"

namespace kiln::chat {

namespace {

using text::dump_safe;
using text::is_ws;
using text::trim;
bool valid_name(std::string_view n) { return text::valid_tool_name(n); }
size_t partial_suffix(std::string_view s, std::string_view marker) { return text::partial_marker_suffix(s, marker); }

using M = int;  // 0 Need, 1 No, 2 Yes (CallStreamer::Match's values)
constexpr M kNeed = 0, kNo = 1, kYes = 2;

// A cursor over a prefix of the body: each step says whether the text so far matches, cannot match,
// or needs more text.
struct Cur {
  std::string_view s;
  size_t i = 0;
  void ws() {
    while (i < s.size() && is_ws(s[i])) ++i;
  }
  M lit(std::string_view l) {
    size_t n = std::min(l.size(), s.size() - i);
    if (s.substr(i, n) != l.substr(0, n)) return kNo;
    if (n < l.size()) return kNeed;
    i += n;
    return kYes;
  }
  // The next byte is `c` (not consumed).
  M peek(char c) const { return i >= s.size() ? kNeed : s[i] == c ? kYes : kNo; }
  // A JSON string without escapes.
  M str(std::string& out) {
    if (i >= s.size()) return kNeed;
    if (s[i] != '"') return kNo;
    for (size_t j = i + 1; j < s.size(); ++j) {
      if (s[j] == '"') {
        out = std::string(s.substr(i + 1, j - i - 1));
        i = j + 1;
        return kYes;
      }
      if (s[j] == '\\' || static_cast<unsigned char>(s[j]) < 0x20 || j - i > 200) return kNo;
    }
    return kNeed;
  }
  // Text up to `marker` (consumed with it); No when what is there cannot be a name.
  M until(std::string_view marker, std::string& out, std::string_view bad = "<>{}[]\"\n") {
    std::string_view rest = s.substr(i);
    size_t f = rest.find(marker);
    if (f == std::string_view::npos) {
      std::string_view head = rest.substr(0, rest.size() - partial_suffix(rest, marker));
      if (head.size() > 200 || trim(head).find_first_of(bad) != std::string_view::npos) return kNo;
      return kNeed;
    }
    // The same checks as on a partial text, so that the decision does not depend on the chunking.
    if (f > 200 || trim(rest.substr(0, f)).find_first_of(bad) != std::string_view::npos) return kNo;
    out = std::string(rest.substr(0, f));
    i += f + marker.size();
    return kYes;
  }
};

#define KILN_STEP(expr)           \
  do {                            \
    M m_ = (expr);            \
    if (m_ != kYes) return m_;    \
  } while (0)

// {"name": "N", "arguments"|"parameters": {   (the cursor is left on the arguments' "{")
M json_header(Cur& c, std::string& name) {
  std::string key;
  c.ws();
  KILN_STEP(c.lit("{"));
  c.ws();
  KILN_STEP(c.str(key));
  if (key != "name") return kNo;
  c.ws();
  KILN_STEP(c.lit(":"));
  c.ws();
  KILN_STEP(c.str(name));
  if (!valid_name(name)) return kNo;
  c.ws();
  KILN_STEP(c.lit(","));
  c.ws();
  KILN_STEP(c.str(key));
  if (key != "arguments" && key != "parameters") return kNo;
  c.ws();
  KILN_STEP(c.lit(":"));
  c.ws();
  return c.peek('{');
}

// A name read up to a marker, trimmed and checked.
M name_until(Cur& c, std::string_view marker, std::string& name) {
  std::string raw;
  KILN_STEP(c.until(marker, raw));
  name = std::string(trim(raw));
  return valid_name(name) ? kYes : kNo;
}

// Formats whose arguments are kept exactly as written (the templates render them back raw).
#undef KILN_STEP

bool raw_arguments(ToolCallFormat f) {
  return f == ToolCallFormat::DeepseekV31 || f == ToolCallFormat::KimiK2 || f == ToolCallFormat::FunctionaryV31 ||
         f == ToolCallFormat::FunctionaryV32 || f == ToolCallFormat::Harmony;
}

}  // namespace

bool streams_arguments(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::QwenXml:  // a <tool_call> may hold the JSON form
    case ToolCallFormat::HermesJson:
    case ToolCallFormat::ArgKeyXml:
    case ToolCallFormat::MistralToolCalls:
    case ToolCallFormat::Llama3Json:
    case ToolCallFormat::DeepseekV31:
    case ToolCallFormat::KimiK2:
    case ToolCallFormat::MiniMaxJson:
    case ToolCallFormat::FunctionaryV31:
    case ToolCallFormat::FunctionaryV32:
    case ToolCallFormat::Harmony: return true;
    default: return false;
  }
}

// ---------------------------------------------------------------------------------------------
// JsonArgsScanner

JsonArgsScanner JsonArgsScanner::rest_of_object() {
  JsonArgsScanner r(true);
  r.started_ = r.confirmed_ = true;
  r.stack_ = {'{'};
  r.expect_ = Expect::CommaOrEnd;
  return r;
}

JsonArgsScanner::Status JsonArgsScanner::after_value() {
  if (stack_.empty()) return Status::Done;
  expect_ = Expect::CommaOrEnd;
  return Status::More;
}

JsonArgsScanner::Status JsonArgsScanner::flush_scalar(std::string& out) {
  if (scalar_ == "true" || scalar_ == "false" || scalar_ == "null") {
    out += scalar_;
  } else {
    ojson j = ojson::parse(scalar_, nullptr, false);
    if (j.is_discarded() || !j.is_number()) return Status::Invalid;
    out += scalar_;
  }
  scalar_.clear();
  return after_value();
}

JsonArgsScanner::Status JsonArgsScanner::feed(char c, std::string& out) {
  if (!started_) {
    if (c != '{') return Status::Invalid;
    started_ = true;
    stack_.push_back('{');
    expect_ = Expect::KeyOrEnd;
    out += c;
    return Status::More;
  }
  if (in_string_) {
    if (!esc_.empty()) {
      esc_ += c;
      if (esc_.size() == 2) {
        if (c == 'u') return Status::More;
        if (std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos) return Status::Invalid;
      } else if (!std::isxdigit(static_cast<unsigned char>(c))) {
        return Status::Invalid;
      } else if (esc_.size() < 6) {
        return Status::More;
      }
      out += esc_;
      esc_.clear();
      return Status::More;
    }
    if (c == '\\') {
      esc_ = "\\";
      return Status::More;
    }
    if (static_cast<unsigned char>(c) < 0x20) return Status::Invalid;
    out += c;
    if (c == '"') {
      in_string_ = false;
      if (string_is_key_) {
        expect_ = Expect::Colon;
        return Status::More;
      }
      return after_value();
    }
    return Status::More;
  }
  if (!scalar_.empty()) {
    const bool part = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '+' || c == '-';
    if (part) {
      if (scalar_.size() > 400) return Status::Invalid;
      scalar_ += c;
      return Status::More;
    }
    if (Status s = flush_scalar(out); s != Status::More) {
      if (s == Status::Done) return Status::Invalid;  // cannot happen: a scalar is never the top level
      return s;
    }
  }
  if (is_ws(c)) {
    if (!minify_) out += c;
    return Status::More;
  }
  switch (expect_) {
    case Expect::KeyOrEnd:
    case Expect::Key:
      if (c == '}' && expect_ == Expect::KeyOrEnd) break;
      if (c != '"') return Status::Invalid;
      in_string_ = true, string_is_key_ = true;
      out += c;
      return Status::More;
    case Expect::Colon:
      if (c != ':') return Status::Invalid;
      confirmed_ = true;
      out += c;
      expect_ = Expect::Value;
      return Status::More;
    case Expect::CommaOrEnd:
      if (c == ',') {
        out += c;
        expect_ = stack_.back() == '{' ? Expect::Key : Expect::Value;
        return Status::More;
      }
      if (c != (stack_.back() == '{' ? '}' : ']')) return Status::Invalid;
      break;
    case Expect::Value:
    case Expect::ValueOrEnd:
      if (c == ']' && expect_ == Expect::ValueOrEnd) break;
      if (c == '{' || c == '[') {
        if (stack_.size() > 256) return Status::Invalid;
        stack_.push_back(c);
        expect_ = c == '{' ? Expect::KeyOrEnd : Expect::ValueOrEnd;
        out += c;
        return Status::More;
      }
      if (c == '"') {
        in_string_ = true, string_is_key_ = false;
        out += c;
        return Status::More;
      }
      if (c == '-' || std::isdigit(static_cast<unsigned char>(c)) || c == 't' || c == 'f' || c == 'n') {
        scalar_ = std::string(1, c);
        return Status::More;
      }
      return Status::Invalid;
  }
  // A closing bracket.
  out += c;
  stack_.pop_back();
  if (stack_.empty()) confirmed_ = true;
  return after_value();
}

// ---------------------------------------------------------------------------------------------
// CallStreamer

CallStreamer::CallStreamer(ToolCallFormat format, bool in_tool_call, const std::vector<Tool>* tools)
    : format_(format), in_tool_call_(in_tool_call), tools_(tools), json_(!raw_arguments(format) || in_tool_call) {
  if (!in_tool_call && !streams_arguments(format)) state_ = State::Failed;
}

void CallStreamer::give_up() {
  pending_ = false;
  state_ = committed_ ? State::Skip : State::Failed;
}

void CallStreamer::begin(std::string name, std::string id) {
  pending_ = true;
  pending_name_ = std::move(name);
  pending_id_ = std::move(id);
  pending_args_.clear();
  json_ = JsonArgsScanner(!raw_arguments(format_) || in_tool_call_);
}

void CallStreamer::confirm(std::vector<CallEvent>& out) {
  if (!pending_) return;
  pending_ = false;
  committed_ = true;
  ++n_calls_;
  CallEvent e;
  e.begin = true;
  e.name = std::move(pending_name_);
  e.id = std::move(pending_id_);
  out.push_back(std::move(e));
  if (!pending_args_.empty()) out.push_back({false, {}, {}, std::move(pending_args_)});
  pending_args_.clear();
}

void CallStreamer::piece(std::string text, std::vector<CallEvent>& out) {
  if (text.empty()) return;
  if (pending_) pending_args_ += text;
  else out.push_back({false, {}, {}, std::move(text)});
}

CallStreamer::Match CallStreamer::header(std::string_view s, size_t& len, std::string& name, std::string& id) {
  Cur c{s};
  auto done = [&](M m) {
    len = c.i;
    return static_cast<CallStreamer::Match>(m);
  };
  auto ret = [&](M m) { return m == kYes ? done(m) : static_cast<CallStreamer::Match>(m); };
#define KILN_HSTEP(expr)                \
  do {                                  \
    M m_ = (expr);                      \
    if (m_ != kYes) return ret(m_);     \
  } while (0)
  if (in_tool_call_) {
    c.ws();
    if (c.i >= s.size()) return Match::Need;
    if (s[c.i] == '{') return ret(json_header(c, name));
    KILN_HSTEP(c.lit("<function="));
    KILN_HSTEP(name_until(c, ">", name));
    xml_name_ = name;
    return done(kYes);
  }
  switch (format_) {
    case ToolCallFormat::Llama3Json: {
      KILN_HSTEP(json_header(c, name));
      return ret(find_tool(*tools_, name) ? kYes : kNo);
    }
    case ToolCallFormat::MiniMaxJson: return ret(json_header(c, name));
    case ToolCallFormat::MistralToolCalls: {
      c.ws();
      if (n_calls_ == 0 && c.peek('[') == kYes) {
        mistral_array_ = true;
        ++c.i;
      }
      if (mistral_array_) return ret(json_header(c, name));
      KILN_HSTEP(c.until("[ARGS]", name, "\n"));
      if (size_t k = name.find("[CALL_ID]"); k != std::string::npos) name.resize(k);
      name = std::string(trim(name));
      if (!valid_name(name)) return Match::No;
      c.ws();
      return ret(c.peek('{'));
    }
    case ToolCallFormat::DeepseekV31:
      c.ws();
      KILN_HSTEP(c.lit("<｜tool▁call▁begin｜>"));
      KILN_HSTEP(name_until(c, "<｜tool▁sep｜>", name));
      if (name == "function") return Match::No;  // V3 / R1's fenced form: read whole
      c.ws();
      return ret(c.peek('{'));
    case ToolCallFormat::KimiK2: {
      c.ws();
      KILN_HSTEP(c.lit("<|tool_call_begin|>"));
      KILN_HSTEP(name_until(c, "<|tool_call_argument_begin|>", id));
      std::string_view n = id;
      if (n.substr(0, 10) == "functions.") n.remove_prefix(10);
      if (size_t colon = n.rfind(':'); colon != std::string_view::npos) n = n.substr(0, colon);
      if (!valid_name(n)) return Match::No;
      name = std::string(n);
      c.ws();
      return ret(c.peek('{'));
    }
    case ToolCallFormat::FunctionaryV31:
      KILN_HSTEP(name_until(c, ">", name));
      c.ws();
      return ret(c.peek('{'));
    case ToolCallFormat::FunctionaryV32:
      KILN_HSTEP(name_until(c, "\n", name));
      if (name == "all") return Match::No;
      c.ws();
      return ret(c.peek('{'));
    case ToolCallFormat::Harmony: {
      std::string head;
      KILN_HSTEP(c.until("<|message|>", head, "{}[]\"\n"));
      name = std::string(trim(std::string_view(head).substr(0, head.find_first_of(" <"))));
      if (!valid_name(name)) return Match::No;
      c.ws();
      return ret(c.peek('{'));
    }
    default: return Match::No;
  }
#undef KILN_HSTEP
}

// After a call's arguments: the call's closing layout, then either the next call or the end.
CallStreamer::Match CallStreamer::after_json(std::string_view s, size_t& len, bool& next_call) {
  Cur c{s};
  auto tail = [&](std::string_view close, bool next) -> Match {
    c.ws();
    Match m = static_cast<Match>(c.lit(close));
    if (m == Match::Yes) len = c.i, next_call = next;
    return m;
  };
  // {"name": …, "arguments": {…} …}: the rest of the call's object (other members are ignored).
  auto rest_of_call = [&](bool next) -> Match {
    JsonArgsScanner r = JsonArgsScanner::rest_of_object();
    std::string sink;
    for (; c.i < s.size(); ++c.i) {
      JsonArgsScanner::Status st = r.feed(s[c.i], sink);
      if (st == JsonArgsScanner::Status::Invalid) return Match::No;
      if (st == JsonArgsScanner::Status::Done) {
        len = ++c.i, next_call = next;
        return Match::Yes;
      }
    }
    return Match::Need;
  };
  if (in_tool_call_) return rest_of_call(false);
  switch (format_) {
    case ToolCallFormat::DeepseekV31: return tail("<｜tool▁call▁end｜>", true);
    case ToolCallFormat::KimiK2: return tail("<|tool_call_end|>", true);
    case ToolCallFormat::MiniMaxJson: return rest_of_call(true);
    case ToolCallFormat::Llama3Json: return rest_of_call(false);
    case ToolCallFormat::FunctionaryV32: return tail(">>>", true);
    case ToolCallFormat::MistralToolCalls: {
      if (!mistral_array_) return tail("[TOOL_CALLS]", true);
      Match m = rest_of_call(false);
      if (m != Match::Yes) return m;
      c.ws();
      if (c.i >= s.size()) return Match::Need;
      if (s[c.i] == ',' || s[c.i] == ']') {
        next_call = s[c.i] == ',';
        len = c.i + 1;
        return Match::Yes;
      }
      return Match::No;
    }
    default: return Match::No;  // one call per body: the rest is dropped
  }
}

bool CallStreamer::xml_step(std::string_view s, bool complete, size_t& len, std::vector<CallEvent>& out) {
  auto close = [&] {
    if (xml_open_) piece("}", out);
    xml_open_ = false;
  };
  Cur c{s};
  c.ws();
  Match end = static_cast<Match>(c.lit("</function>"));
  if (end == Match::Yes) {
    close();
    confirm(out);
    state_ = State::Skip;
    len = c.i;
    return true;
  }
  c.i = 0;
  c.ws();
  Match par = static_cast<Match>(c.lit("<parameter="));
  if (par == Match::Yes) {
    std::string pname;
    Match pm = static_cast<Match>(c.until(">", pname, "\n"));
    if (pm == Match::Yes) {
      pname = std::string(trim(pname));
      std::string_view rest = s.substr(c.i);
      size_t e = rest.find("</parameter>");
      if (e != std::string_view::npos && !pname.empty() && pname.find('\n') == std::string::npos) {
        std::string_view value = rest.substr(0, e);
        if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
        if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
        const Tool* tool = find_tool(*tools_, xml_name_);
        std::string piece = xml_params_++ ? "," : "";
        piece += dump_safe(ojson(pname)) + ":" + dump_safe(typed_param_value(std::string(value), tool, pname));
        this->piece(std::move(piece), out);
        confirm(out);
        len = c.i + e + 12;
        return true;
      }
      if (e == std::string_view::npos && !complete) return false;
    } else if (pm == Match::Need && !complete) {
      return false;
    }
  } else if ((par == Match::Need || end == Match::Need) && !complete) {
    return false;
  }
  // Anything else (or the body ended inside a parameter): the call ends here — or, when nothing of it
  // was sent, the body is not a streamable call.
  close();
  if (pending_) {
    give_up();
  } else {
    state_ = State::Skip;
  }
  len = s.size();
  return true;
}

void CallStreamer::feed(std::string_view body, bool complete, std::vector<CallEvent>& out) {
  for (;;) {
    std::string_view s = body.substr(pos_);
    switch (state_) {
      case State::Failed: return;
      case State::Skip: pos_ = body.size(); return;
      case State::Header: {
        size_t len = 0;
        std::string name, id;
        Match m = header(s, len, name, id);
        if (m == Match::Need && !complete) return;
        if (m != Match::Yes) {
          give_up();
          continue;
        }
        pos_ += len;
        begin(std::move(name), std::move(id));
        if (in_tool_call_ && !xml_name_.empty()) {
          piece("{", out);
          xml_open_ = true;
          state_ = State::XmlParams;
        } else {
          state_ = State::Json;
        }
        continue;
      }
      case State::XmlParams: {
        size_t len = 0;
        if (!xml_step(s, complete, len, out)) return;
        pos_ += len;
        continue;
      }
      case State::Json: {
        std::string text;
        JsonArgsScanner::Status st = JsonArgsScanner::Status::More;
        size_t i = 0;
        for (; i < s.size(); ++i) {
          st = json_.feed(s[i], text);
          if (st != JsonArgsScanner::Status::More) break;
        }
        if (st == JsonArgsScanner::Status::Invalid && pending_ && !json_.confirmed()) {
          give_up();  // not JSON arguments after all: read whole (or dropped in a sent block)
          continue;
        }
        piece(std::move(text), out);
        if (json_.confirmed()) confirm(out);
        if (st == JsonArgsScanner::Status::Invalid) {
          state_ = State::Skip;  // the arguments end where they stopped being JSON
          continue;
        }
        if (st == JsonArgsScanner::Status::Done) {
          pos_ += i + 1;
          state_ = State::AfterJson;
          continue;
        }
        pos_ = body.size();
        if (complete) {
          cut_ = !pending_;
          if (pending_) give_up();
          state_ = committed_ ? State::Skip : State::Failed;
        }
        return;
      }
      case State::AfterJson: {
        size_t len = 0;
        bool next = false;
        Match m = after_json(s, len, next);
        if (m == Match::Need && !complete) return;
        if (m != Match::Yes) {
          state_ = State::Skip;
          continue;
        }
        pos_ += len;
        state_ = next ? State::Header : State::Skip;
        continue;
      }
    }
  }
}

}  // namespace kiln::chat
