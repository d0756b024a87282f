// chat/output_parser.cpp — incremental content / reasoning / tool-call splitter.
#include "chat/output_parser.h"

#include "chat/text_util.h"

#include <algorithm>
#include <random>

namespace kiln::chat {

namespace {

constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

constexpr const char* kWs = " \t\n\r";

// Length of s's leading whitespace; the length of s without its trailing whitespace.
size_t ws_prefix(std::string_view s) { return std::min(s.find_first_not_of(kWs), s.size()); }
size_t without_trailing_ws(std::string_view s) {
  size_t last = s.find_last_not_of(kWs);
  return last == std::string_view::npos ? 0 : last + 1;
}

using text::partial_marker_suffix;

}  // namespace

void Delta::append(const Delta& o) {
  content += o.content;
  reasoning_content += o.reasoning_content;
  for (const auto& c : o.tool_calls) {
    if (!c.first() && !tool_calls.empty() && tool_calls.back().index == c.index) tool_calls.back().arguments += c.arguments;
    else tool_calls.push_back(c);
  }
}

std::string ParsedMessage::finish_reason(std::string_view engine_reason) const {
  if (last_call_cut && engine_reason == "length") return "length";
  return tool_calls.empty() ? std::string(engine_reason) : std::string("tool_calls");
}

std::string random_tool_call_id() {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int> dist(0, 61);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[dist(rng)];
  return id;
}

OutputParser::OutputParser(ParserConfig cfg) : cfg_(std::move(cfg)) {
  block_ = block_format(cfg_.tool_format);
  const bool split = cfg_.reasoning_format != ReasoningFormat::None && !cfg_.reasoning_start.empty() &&
                     !cfg_.reasoning_end.empty();
  if (!split) {
    mode_ = Mode::Content;
  } else if (cfg_.starts_in_reasoning) {
    mode_ = Mode::Reasoning;
  } else {
    mode_ = Mode::Start;
  }
}

Delta OutputParser::feed(std::string_view text) {
  KILN_CHECK(!finished_, "OutputParser::feed after finish");
  buf_.append(text);
  return process(false);
}

Delta OutputParser::finish() {
  KILN_CHECK(!finished_, "OutputParser::finish called twice");
  Delta d = process(true);
  finished_ = true;
  return d;
}

void OutputParser::add_content(std::string_view text, Delta& d) {
  if (text.empty()) return;
  d.content.append(text);
  msg_.content.append(text);
}

void OutputParser::emit_reasoning(std::string_view text, bool closing, Delta& d) {
  if (!reasoning_started_) {
    text.remove_prefix(ws_prefix(text));
    if (!text.empty()) {
      reasoning_started_ = true;
      if (cfg_.reasoning_in_content) add_content(cfg_.reasoning_start, d);
    }
  }
  if (!text.empty()) {
    size_t end = without_trailing_ws(text);
    if (end > 0) {
      std::string out = reasoning_ws_;
      out.append(text.substr(0, end));
      reasoning_ws_.clear();
      if (cfg_.reasoning_in_content) {
        add_content(out, d);
      } else {
        d.reasoning_content += out;
        msg_.reasoning_content += out;
      }
    }
    reasoning_ws_.append(text.substr(end));
  }
  if (closing) {
    reasoning_ws_.clear();
    if (cfg_.reasoning_in_content && reasoning_started_) add_content(cfg_.reasoning_end, d);
  }
}

void OutputParser::emit_content(std::string_view text, Delta& d) {
  if (content_skip_ws_) {
    text.remove_prefix(ws_prefix(text));
    if (text.empty()) return;
    content_skip_ws_ = false;
  }
  if (text.empty()) return;
  size_t end = without_trailing_ws(text);
  if (end > 0) {
    std::string out = std::move(content_ws_);
    content_ws_.clear();
    out.append(text.substr(0, end));
    add_content(out, d);
  }
  content_ws_.append(text.substr(end));
}

void OutputParser::emit_tool_call(std::string name, std::string arguments, Delta& d, std::string id) {
  ToolCallDelta call;
  call.index = static_cast<int>(msg_.tool_calls.size());
  call.id = !id.empty() ? std::move(id) : cfg_.make_tool_call_id ? cfg_.make_tool_call_id() : random_tool_call_id();
  if (call.id.empty()) call.id = random_tool_call_id();
  call.name = std::move(name);
  call.arguments = std::move(arguments);
  msg_.tool_calls.push_back(ToolCall{call.id, call.name, call.arguments});
  d.tool_calls.push_back(std::move(call));
}

void OutputParser::add_arguments(std::string_view piece, Delta& d) {
  if (piece.empty() || msg_.tool_calls.empty()) return;
  msg_.tool_calls.back().arguments.append(piece);
  const int index = static_cast<int>(msg_.tool_calls.size()) - 1;
  if (!d.tool_calls.empty() && d.tool_calls.back().index == index) {
    d.tool_calls.back().arguments.append(piece);
  } else {
    ToolCallDelta c;
    c.index = index;
    c.arguments = std::string(piece);
    d.tool_calls.push_back(std::move(c));
  }
}

void OutputParser::run_streamer(std::string_view body, bool complete, Delta& d) {
  std::vector<CallEvent> events;
  streamer_->feed(body, complete, events);
  for (auto& e : events) {
    if (e.begin) emit_tool_call(std::move(e.name), "", d, std::move(e.id));
    else add_arguments(e.args, d);
  }
}

void OutputParser::flush_content_ws(Delta& d) {
  add_content(content_ws_, d);
  content_ws_.clear();
}

Delta OutputParser::process(bool final) {
  Delta d;
  for (;;) {
    switch (mode_) {
      case Mode::Start: {
        // Only at the very beginning may the model open a reasoning block itself.
        size_t i = ws_prefix(buf_);
        std::string_view rest = std::string_view(buf_).substr(i);
        const std::string& open = cfg_.reasoning_start;
        if (rest.size() >= open.size() && rest.substr(0, open.size()) == open) {
          buf_.erase(0, i + open.size());
          mode_ = Mode::Reasoning;
          continue;
        }
        if (!final && std::string_view(open).substr(0, rest.size()) == rest) return d;  // undecided
        mode_ = Mode::Content;
        continue;
      }
      case Mode::Reasoning: {
        const std::string& close = cfg_.reasoning_end;
        size_t pos = buf_.find(close);
        if (pos != std::string::npos) {
          emit_reasoning(std::string_view(buf_).substr(0, pos), /*closing=*/true, d);
          buf_.erase(0, pos + close.size());
          mode_ = Mode::Content;
          content_skip_ws_ = true;
          continue;
        }
        size_t hold = final ? 0 : partial_marker_suffix(buf_, close);
        emit_reasoning(std::string_view(buf_).substr(0, buf_.size() - hold), /*closing=*/false, d);
        buf_.erase(0, buf_.size() - hold);
        if (final) reasoning_ws_.clear();  // unterminated reasoning: trimmed, left open
        return d;
      }
      case Mode::Content: {
        if (block_) {
          if (process_block_content(final, d)) continue;
          return d;
        }
        if (!cfg_.parse_tool_calls) {
          emit_content(buf_, d);
          buf_.clear();
          if (final) flush_content_ws(d);
          return d;
        }
        if (cfg_.tool_format == ToolCallFormat::Llama3Json) {
          // Llama 3.x: the whole output is the call, so only its very start can open one.
          if (!llama_decided_) {
            size_t i = ws_prefix(buf_);
            std::string_view rest = std::string_view(buf_).substr(i);
            if (rest.empty() && !final) return d;
            if (!rest.empty() && rest[0] == '{') {
              tail_marker_.clear();
              tool_ws_ = buf_.substr(0, i);
              buf_.erase(0, i);
              mode_ = Mode::TailCalls;
              continue;
            }
            if (rest.substr(0, kPythonTag.size()) == kPythonTag) {
              tail_marker_ = kPythonTag;
              tool_ws_ = buf_.substr(0, i);
              buf_.erase(0, i + kPythonTag.size());
              mode_ = Mode::TailCalls;
              continue;
            }
            if (!final && kPythonTag.substr(0, rest.size()) == rest) return d;
            llama_decided_ = true;
          }
          emit_content(buf_, d);
          buf_.clear();
          if (final) flush_content_ws(d);
          return d;
        }
        const std::string_view open_marker =
            cfg_.tool_format == ToolCallFormat::MistralToolCalls ? kMistralOpen : kToolOpen;
        size_t pos = buf_.find(open_marker);
        if (pos != std::string::npos) {
          emit_content(std::string_view(buf_).substr(0, pos), d);
          // Whitespace between content and a call is layout, not content; kept aside in case
          // the call turns out malformed.
          tool_ws_ = std::move(content_ws_);
          content_ws_.clear();
          buf_.erase(0, pos + open_marker.size());
          if (open_marker == kMistralOpen) {
            tail_marker_ = kMistralOpen;
            mode_ = Mode::TailCalls;
          } else {
            mode_ = Mode::ToolCall;
            scan_from_ = 0;
          }
          continue;
        }
        size_t hold = final ? 0 : partial_marker_suffix(buf_, open_marker);
        emit_content(std::string_view(buf_).substr(0, buf_.size() - hold), d);
        buf_.erase(0, buf_.size() - hold);
        if (final) flush_content_ws(d);
        return d;
      }
      case Mode::TailCalls: {
        // Mistral [TOOL_CALLS] / Llama 3 JSON: the calls run to the end of the output.
        if (!streamer_) streamer_.emplace(cfg_.tool_format, false, &cfg_.tools);
        run_streamer(buf_, final, d);
        if (!final) return d;
        if (streamer_->committed()) {
          msg_.last_call_cut = streamer_->cut();
          buf_.clear();
          streamer_.reset();
          return d;
        }
        streamer_.reset();
        std::vector<std::pair<std::string, std::string>> calls;
        if (parse_tail_tool_calls(cfg_.tool_format, buf_, cfg_.tools, calls)) {
          for (auto& [name, args] : calls) emit_tool_call(std::move(name), std::move(args), d);
        } else {
          std::string raw = tool_ws_ + tail_marker_ + buf_;
          content_skip_ws_ = false;
          emit_content(raw, d);
          flush_content_ws(d);
        }
        buf_.clear();
        return d;
      }
      case Mode::Block:
        if (process_block(final, d)) continue;
        return d;
      case Mode::ToolCall: {
        size_t pos = buf_.find(kToolClose, scan_from_);
        if (!streamer_) streamer_.emplace(cfg_.tool_format, true, &cfg_.tools);
        const size_t avail = pos != std::string::npos ? pos
                             : final                  ? buf_.size()
                                                      : buf_.size() - partial_marker_suffix(buf_, kToolClose);
        run_streamer(std::string_view(buf_).substr(0, avail), pos != std::string::npos || final, d);
        if (streamer_->committed() && (pos != std::string::npos || final)) {
          // The call was streamed: it is final; the rest of its body was layout.
          msg_.last_call_cut = streamer_->cut();
          buf_.erase(0, pos == std::string::npos ? buf_.size() : pos + kToolClose.size());
          streamer_.reset();
          mode_ = Mode::Content;
          content_skip_ws_ = true;
          continue;
        }
        if (pos == std::string::npos) {
          if (!final) {
            scan_from_ = buf_.size() >= kToolClose.size() ? buf_.size() - kToolClose.size() + 1 : 0;
            return d;
          }
          streamer_.reset();
          // Unterminated call at the end of generation: the raw text becomes content.
          std::string raw = tool_ws_ + std::string(kToolOpen) + buf_;
          buf_.clear();
          mode_ = Mode::Content;
          content_skip_ws_ = false;
          emit_content(raw, d);
          flush_content_ws(d);
          return d;
        }
        streamer_.reset();
        std::string_view body = std::string_view(buf_).substr(0, pos);
        std::string name, args;
        if (parse_tool_call_body(body, cfg_.tools, name, args)) {
          emit_tool_call(std::move(name), std::move(args), d);
          buf_.erase(0, pos + kToolClose.size());
          mode_ = Mode::Content;
          content_skip_ws_ = true;
        } else {
          // Not a call after all: keep the text, verbatim, as content.
          std::string raw = tool_ws_ + std::string(kToolOpen);
          raw.append(body);
          raw.append(kToolClose);
          buf_.erase(0, pos + kToolClose.size());
          mode_ = Mode::Content;
          content_skip_ws_ = false;
          emit_content(raw, d);
        }
        continue;
      }
    }
  }
}

bool OutputParser::process_block_content(bool final, Delta& d) {
  if (block_->starts_with_recipient && !recipient_decided_) {
    // Functionary v3.2: the prompt ended with ">>>", so the output opens with a recipient line:
    // "all\n" (text follows) or a tool's name (the calls follow, to the end).
    size_t nl = buf_.find('\n');
    if (nl == std::string::npos && !final && buf_.size() <= 130) return false;
    recipient_decided_ = true;
    std::string_view first = std::string_view(buf_).substr(0, nl == std::string::npos ? buf_.size() : nl);
    if (first == "all") {
      buf_.erase(0, nl + 1);
    } else if (cfg_.parse_tool_calls && nl != std::string::npos && find_tool(cfg_.tools, first)) {
      tail_marker_.clear();
      tool_ws_.clear();
      mode_ = Mode::Block;
      return true;
    }
    return true;
  }
  // The earliest marker: the calls' opening one (when parsing calls) or a layout marker to drop.
  size_t best = std::string::npos, best_len = 0;
  bool best_open = false;
  size_t hold = 0;
  auto consider = [&](std::string_view m, bool open) {
    size_t p = buf_.find(m);
    if (p != std::string::npos && (best == std::string::npos || p < best)) best = p, best_len = m.size(), best_open = open;
    hold = std::max(hold, partial_marker_suffix(buf_, m));
  };
  if (cfg_.parse_tool_calls) consider(block_->open, true);
  for (std::string_view m : block_->drop) consider(m, false);
  if (best != std::string::npos) {
    emit_content(std::string_view(buf_).substr(0, best), d);
    if (!best_open) {
      buf_.erase(0, best + best_len);
      return true;
    }
    tool_ws_ = std::move(content_ws_);
    content_ws_.clear();
    tail_marker_ = std::string(block_->open);
    buf_.erase(0, best + best_len);
    mode_ = Mode::Block;
    scan_from_ = 0;
    return true;
  }
  if (final) hold = 0;
  emit_content(std::string_view(buf_).substr(0, buf_.size() - hold), d);
  buf_.erase(0, buf_.size() - hold);
  if (final) flush_content_ws(d);
  return false;
}

bool OutputParser::process_block(bool final, Delta& d) {
  const std::string_view close = block_->close;
  size_t pos = close.empty() ? std::string::npos : buf_.find(close, scan_from_);
  if (!streamer_) streamer_.emplace(cfg_.tool_format, false, &cfg_.tools);
  const size_t avail = pos != std::string::npos       ? pos
                       : final || close.empty()       ? buf_.size()
                                                      : buf_.size() - partial_marker_suffix(buf_, close);
  run_streamer(std::string_view(buf_).substr(0, avail), pos != std::string::npos || final, d);
  if (pos == std::string::npos && !final) {
    // Not closed yet (or the calls run to the end of the output).
    if (!close.empty()) scan_from_ = buf_.size() >= close.size() ? buf_.size() - close.size() + 1 : 0;
    return false;
  }
  const bool streamed = streamer_->committed();
  msg_.last_call_cut = streamer_->cut();
  streamer_.reset();
  // At the end without the closing marker (the model stopped at end-of-generation right after the
  // last call): the block is read as it is.
  const size_t body_len = pos == std::string::npos ? buf_.size() : pos;
  std::vector<ParsedCall> calls;
  if (streamed) {  // the block's calls were streamed and are final; the rest of it was layout
    content_skip_ws_ = true;
  } else if (parse_block_calls(cfg_.tool_format, std::string_view(buf_).substr(0, body_len), cfg_.tools, calls)) {
    for (auto& c : calls) emit_tool_call(std::move(c.name), std::move(c.arguments), d, std::move(c.id));
    content_skip_ws_ = true;
  } else {
    std::string raw = tool_ws_ + tail_marker_ + buf_.substr(0, pos == std::string::npos ? buf_.size() : pos + close.size());
    content_skip_ws_ = false;
    emit_content(raw, d);
  }
  buf_.erase(0, pos == std::string::npos ? buf_.size() : pos + close.size());
  mode_ = Mode::Content;
  if (final && buf_.empty()) {
    flush_content_ws(d);
    return false;
  }
  return true;
}

ParsedMessage parse_output(std::string_view text, const ParserConfig& cfg) {
  OutputParser p(cfg);
  (void)p.feed(text);
  (void)p.finish();
  return p.message();
}

namespace {
std::string dump_safe(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }
std::string safe_string(const std::string& s) {
  // Round-trip through dump/parse replaces invalid UTF-8 so the server can always serialise.
  return ojson::parse(dump_safe(ojson(s))).get<std::string>();
}
}  // namespace

ojson delta_to_json(const Delta& d) {
  ojson j = ojson::object();
  if (!d.content.empty()) j["content"] = safe_string(d.content);
  if (!d.reasoning_content.empty()) j["reasoning_content"] = safe_string(d.reasoning_content);
  if (!d.tool_calls.empty()) {
    ojson arr = ojson::array();
    for (const auto& c : d.tool_calls) {
      if (c.first())
        arr.push_back({{"index", c.index},
                       {"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", safe_string(c.name)}, {"arguments", safe_string(c.arguments)}}}});
      else
        arr.push_back({{"index", c.index}, {"function", {{"arguments", safe_string(c.arguments)}}}});
    }
    j["tool_calls"] = std::move(arr);
  }
  return j;
}

ojson message_to_json(const ParsedMessage& m) {
  ojson j = ojson::object();
  j["role"] = "assistant";
  if (m.content.empty() && !m.tool_calls.empty()) j["content"] = nullptr;
  else j["content"] = safe_string(m.content);
  if (!m.reasoning_content.empty()) j["reasoning_content"] = safe_string(m.reasoning_content);
  if (!m.tool_calls.empty()) {
    ojson arr = ojson::array();
    for (const auto& c : m.tool_calls)
      arr.push_back({{"id", c.id},
                     {"type", "function"},
                     {"function", {{"name", safe_string(c.name)}, {"arguments", safe_string(c.arguments)}}}});
    j["tool_calls"] = std::move(arr);
  }
  return j;
}

}  // namespace kiln::chat
