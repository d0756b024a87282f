// Byte-level BPE vocabulary for generated models: the 256 byte symbols, merges learned
// deterministically from a small built-in English text, the special tokens of the family, and
// a chat template written for kiln (ChatML-style with tools and thinking for the Qwen archs,
// header-style for llama).
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/gen/gen.h"

namespace kiln::model::gen {
namespace {

// Our own training text (plain English, digits, punctuation, a little code) for the merges.
constexpr std::string_view kCorpus = R"(The kiln is hot and the clay is ready. A potter shapes the bowl on the wheel, then lets it dry in the
shade before the first firing. When the fire is lit, the temperature rises slowly: 100 degrees, then
300, then 600, and at last more than 1000 degrees. The glaze melts and turns to glass. After two days
the kiln is opened, and the potter looks at every piece with care. Some pieces crack; most survive.

Language models read text as tokens. A token may be a whole word, a part of a word, or a single byte.
The model predicts the next token from the ones before it, one step at a time. It has layers of
attention and feed forward networks, and some newer models mix attention with recurrent layers that
keep a small state for each sequence. The state is updated for every token, so the cost of reading a
long document grows only linearly with its length.

Questions and answers:
What is the capital of France? Paris is the capital of France.
How many days are in a week? There are seven days in a week.
Can you write a short poem about the sea? The sea is wide, the sea is deep; it sings the sailors
off to sleep.
Please call the weather tool for Berlin and tell me if I need an umbrella today.
I think the answer is 42, but let me check the numbers again: 6 times 7 is 42.

def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i))

{"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius"}}

The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. Peter
Piper picked a peck of pickled peppers. In the morning the market opens at eight, and people
come to buy bread, cheese, fruit, and fresh vegetables from the farms around the town. The
children walk to school, the workers go to the station, and the old men sit in the square and
talk about the weather, the news, and the game they watched last night.

Thank you for your help! You are welcome. Have a nice day, and see you tomorrow.
)";

// GPT-2 byte-level mapping: printable bytes map to themselves, the others to U+0100 + n.
std::vector<std::string> byte_symbols() {
  std::vector<int> cp(256, -1);
  for (int b = 0; b < 256; ++b)
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) cp[b] = b;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (cp[b] < 0) cp[b] = 256 + n++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const int c = cp[b];
    std::string s;
    if (c < 0x80) {
      s.push_back(char(c));
    } else {  // all code points here are < 0x800: two UTF-8 bytes
      s.push_back(char(0xC0 | (c >> 6)));
      s.push_back(char(0x80 | (c & 0x3F)));
    }
    out[b] = s;
  }
  return out;
}

bool is_alpha(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

// A crude pre-tokenizer in the spirit of the GPT-2 split: " word", "word", single digits,
// runs of punctuation with an optional leading space, newlines, and other whitespace.
std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    const unsigned char c = text[i];
    if (c == ' ' && i + 1 < text.size() && (is_alpha(text[i + 1]) || !std::isspace((unsigned char)text[i + 1]))) {
      ++j;  // leading space joins the next word
    }
    const unsigned char d = text[j];
    if (is_alpha(d)) {
      while (j < text.size() && is_alpha(text[j])) ++j;
    } else if (is_digit(d)) {
      ++j;
    } else if (d == '\n') {
      while (j < text.size() && text[j] == '\n') ++j;
    } else if (std::isspace(d)) {
      while (j < text.size() && text[j] != '\n' && std::isspace((unsigned char)text[j])) ++j;
    } else {
      while (j < text.size() && !is_alpha(text[j]) && !is_digit(text[j]) && !std::isspace((unsigned char)text[j])) ++j;
    }
    if (j == i) ++j;
    words.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return words;
}

struct Special {
  const char* text;
  int32_t type;  // 3 CONTROL, 4 USER_DEFINED
};

// The added tokens of the Qwen3 / Qwen3.5 tokenizers (special = true -> CONTROL, else USER_DEFINED,
// as llama.cpp's converter marks them).
constexpr Special kQwenSpecials[] = {
    {"<|endoftext|>", 3},   {"<|im_start|>", 3},     {"<|im_end|>", 3},       {"<|object_ref_start|>", 3},
    {"<|object_ref_end|>", 3}, {"<|box_start|>", 3}, {"<|box_end|>", 3},      {"<|quad_start|>", 3},
    {"<|quad_end|>", 3},    {"<|vision_start|>", 3}, {"<|vision_end|>", 3},   {"<|vision_pad|>", 3},
    {"<|image_pad|>", 3},   {"<|video_pad|>", 3},    {"<tool_call>", 4},      {"</tool_call>", 4},
    {"<|fim_prefix|>", 4},  {"<|fim_middle|>", 4},   {"<|fim_suffix|>", 4},   {"<|fim_pad|>", 4},
    {"<|repo_name|>", 4},   {"<|file_sep|>", 4},     {"<tool_response>", 4},  {"</tool_response>", 4},
    {"<think>", 4},         {"</think>", 4},
};

// Llama-3 style control tokens.
constexpr Special kLlamaSpecials[] = {
    {"<|begin_of_text|>", 3}, {"<|end_of_text|>", 3},        {"<|reserved_special_token_0|>", 3},
    {"<|reserved_special_token_1|>", 3}, {"<|finetune_right_pad_id|>", 3}, {"<|reserved_special_token_2|>", 3},
    {"<|start_header_id|>", 3}, {"<|end_header_id|>", 3},    {"<|eom_id|>", 3},
    {"<|eot_id|>", 3},        {"<|python_tag|>", 3},
};

// ChatML-style template with tools and thinking, written for kiln.
// Variables: messages, tools, add_generation_prompt, enable_thinking (default: thinking on).
constexpr std::string_view kQwenTemplate =
    R"({%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
<|im_start|>system
{% if has_system %}{{ messages[0].content }}

{% endif %}# Tools

You may call the functions described below. Each signature is a JSON object inside <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

To call a function, reply with one JSON object per call, each wrapped in <tool_call></tool_call>:
<tool_call>
{"name": "function-name", "arguments": {"argument": "value"}}
</tool_call><|im_end|>
{% elif has_system -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'user' or m.role == 'system' -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' -%}
<|im_start|>assistant
{% if m.reasoning_content %}<think>
{{ m.reasoning_content | trim }}
</think>

{% endif %}{{ m.content if m.content else '' }}
{%- if m.tool_calls %}{% for tc in m.tool_calls %}{% set f = tc.function if tc.function else tc %}
{% if loop.first and m.content %}
{% endif %}<tool_call>
{"name": "{{ f.name }}", "arguments": {{ f.arguments if f.arguments is string else (f.arguments | tojson) }}}
</tool_call>
{%- endfor %}{% endif %}<|im_end|>
{% elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user
{%- endif %}
<tool_response>
{{ m.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif -%}
{%- endif -%})";

// Header-style template (Llama 3 layout), written for kiln.
constexpr std::string_view kLlamaTemplate =
    R"({{- bos_token -}}
{%- if tools -%}
<|start_header_id|>system<|end_header_id|>

{% if messages and messages[0].role == 'system' %}{{ messages[0].content | trim }}

{% endif %}You can call these functions. Answer with a JSON object {"name": ..., "parameters": ...}.
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|eot_id|>
{%- endif -%}
{%- for m in messages -%}
{%- if not (tools and m.role == 'system' and loop.first) -%}
<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>

{{ m.content | trim if m.content else '' }}
{%- if m.tool_calls %}{% for tc in m.tool_calls %}{% set f = tc.function if tc.function else tc %}{"name": "{{ f.name }}", "parameters": {{ f.arguments if f.arguments is string else (f.arguments | tojson) }}}{% endfor %}{% endif -%}
<|eot_id|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|start_header_id|>assistant<|end_header_id|>

{% endif -%})";

bool is_qwen(std::string_view arch) { return arch == "qwen3" || arch == "qwen35" || arch == "qwen35moe"; }

std::vector<Special> specials_for(std::string_view arch) {
  if (is_qwen(arch)) return {std::begin(kQwenSpecials), std::end(kQwenSpecials)};
  return {std::begin(kLlamaSpecials), std::end(kLlamaSpecials)};
}

// Learns up to max_merges merges from the corpus. Deterministic: the most frequent pair wins,
// ties go to the lexicographically smallest (left, right).
std::vector<std::pair<std::string, std::string>> learn_merges(size_t max_merges) {
  const auto sym = byte_symbols();
  std::map<std::string, int64_t> word_count;
  for (const auto& w : split_words(kCorpus)) ++word_count[w];
  std::vector<std::vector<std::string>> words;
  std::vector<int64_t> counts;
  for (const auto& [w, c] : word_count) {
    std::vector<std::string> s;
    for (unsigned char ch : w) s.push_back(sym[ch]);
    words.push_back(std::move(s));
    counts.push_back(c);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < max_merges) {
    std::map<std::pair<std::string, std::string>, int64_t> pc;
    for (size_t wi = 0; wi < words.size(); ++wi)
      for (size_t k = 0; k + 1 < words[wi].size(); ++k) pc[{words[wi][k], words[wi][k + 1]}] += counts[wi];
    if (pc.empty()) break;
    auto best = pc.begin();
    for (auto it = pc.begin(); it != pc.end(); ++it)
      if (it->second > best->second) best = it;  // map order gives the lexicographic tie-break
    const auto pair = best->first;
    merges.push_back(pair);
    const std::string joined = pair.first + pair.second;
    for (auto& w : words) {
      std::vector<std::string> out;
      out.reserve(w.size());
      for (size_t k = 0; k < w.size(); ++k) {
        if (k + 1 < w.size() && w[k] == pair.first && w[k + 1] == pair.second) {
          out.push_back(joined);
          ++k;
        } else {
          out.push_back(w[k]);
        }
      }
      w = std::move(out);
    }
  }
  return merges;
}

}  // namespace

int64_t min_vocab(std::string_view arch) { return 256 + static_cast<int64_t>(specials_for(arch).size()) + 64; }

Result<Vocabulary> build_vocabulary(std::string_view arch, int64_t n_vocab) {
  const auto specials = specials_for(arch);
  if (n_vocab < min_vocab(arch))
    return err("vocabulary of {} tokens is too small for arch '{}' (need at least {})", n_vocab, arch, min_vocab(arch));
  Vocabulary v;
  v.model = "gpt2";
  v.pre = is_qwen(arch) ? "qwen2" : "llama-bpe";
  const int64_t n_special = static_cast<int64_t>(specials.size());
  const int64_t merge_budget = n_vocab - 256 - n_special;
  const auto merges = learn_merges(static_cast<size_t>(merge_budget));

  for (const auto& s : byte_symbols()) {
    v.tokens.push_back(s);
    v.token_type.push_back(1);
  }
  for (const auto& [a, b] : merges) {
    v.tokens.push_back(a + b);
    v.token_type.push_back(1);
    v.merges.push_back(a + " " + b);
  }
  std::unordered_map<std::string, int32_t> id;
  for (const auto& s : specials) {
    id[s.text] = static_cast<int32_t>(v.tokens.size());
    v.tokens.push_back(s.text);
    v.token_type.push_back(s.type);
  }
  // The corpus ran out of merges: pad like the converter does for a model vocab larger than the
  // tokenizer ([PADn], type UNUSED).
  for (int64_t i = 0; static_cast<int64_t>(v.tokens.size()) < n_vocab; ++i) {
    v.tokens.push_back("[PAD" + std::to_string(v.tokens.size()) + "]");
    v.token_type.push_back(5);
  }
  KILN_CHECK(static_cast<int64_t>(v.tokens.size()) == n_vocab, "vocab size mismatch");
  if (is_qwen(arch)) {
    v.bos = id["<|endoftext|>"];
    v.eos = id["<|im_end|>"];
    v.pad = id["<|endoftext|>"];
    v.add_bos = false;
    v.chat_template = std::string(kQwenTemplate);
  } else {
    v.bos = id["<|begin_of_text|>"];
    v.eos = id["<|eot_id|>"];
    v.eot = id["<|eot_id|>"];
    v.pad = id["<|finetune_right_pad_id|>"];
    v.add_bos = true;
    v.chat_template = std::string(kLlamaTemplate);
  }
  return v;
}

}  // namespace kiln::model::gen
