// `kiln logits` (developer command, not in the help list's main commands): runs token sequences
// through a model and writes the logits of every position, for the oracle tests
// (tests/py/test_model_*.py).
//   kiln logits -m FILE (--tokens "1,2,3;4,5" | --prompt TEXT) -o out.npy|out.f32
//               [-c CTX] [-t N] [-ctk T] [-ctv T] [-fa on|off|auto] [--chunk N] [--delta-chunk N]
// Sequences (separated by ';') are decoded together: each batch holds up to --chunk tokens of
// every unfinished sequence (so prefill chunks of several sequences share a batch). Output rows
// are all positions of sequence 0, then sequence 1, ...: float32 [n_rows, n_vocab].
// --mtp (qwen35* with an MTP block): the MTP block's logits instead — row p is its prediction from
// token p paired with the trunk's hidden state of token p - 1 (zeros for p = 0), one draft step
// (Context::mtp_draft) after decoding tokens 0..p-1 with the MTP catch-up; sequences one at a time.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "model/vocab_loader.h"
#include "model_cli.h"
#include "subcommand.h"

namespace {
using namespace kiln;

Result<std::vector<std::vector<int32_t>>> parse_tokens(const std::string& s) {
  std::vector<std::vector<int32_t>> out(1);
  std::string num;
  auto flush = [&]() -> Status {
    if (num.empty()) return {};
    try {
      out.back().push_back(int32_t(std::stol(num)));
    } catch (...) {
      return err("--tokens: '{}' is not a number", num);
    }
    num.clear();
    return {};
  };
  for (char ch : s) {
    if (ch == ',' || ch == ' ') KILN_TRY(flush());
    else if (ch == ';') {
      KILN_TRY(flush());
      out.emplace_back();
    } else num += ch;
  }
  KILN_TRY(flush());
  std::erase_if(out, [](const auto& v) { return v.empty(); });
  if (out.empty()) return err("--tokens: no tokens");
  return out;
}

Status write_out(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return err("{}: cannot open for writing", path);
  if (path.size() >= 4 && path.substr(path.size() - 4) == ".npy") {
    std::string hdr = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
    const size_t total = 10 + hdr.size() + 1;
    hdr.append((64 - total % 64) % 64, ' ');
    hdr += '\n';
    const uint16_t hl = uint16_t(hdr.size());
    f.write("\x93NUMPY\x01\x00", 8);
    f.write(reinterpret_cast<const char*>(&hl), 2);
    f.write(hdr.data(), std::streamsize(hdr.size()));
  }
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size() * sizeof(float)));
  if (!f) return err("{}: write error", path);
  return {};
}

int cmd_logits(int argc, char** argv) {
  CLI::App app{"dump all-position logits (oracle tests)", "kiln logits"};
  std::string model_path, tokens, prompt, out_path;
  int64_t ctx = 0, chunk = 512;
  int threads = 0, delta_chunk = 0;
  app.add_option("-m,--model", model_path, "GGUF model")->required();
  app.add_option("--tokens", tokens, "token ids: \"1,2,3;4,5\" (';' separates sequences)");
  app.add_option("-p,--prompt", prompt, "text (tokenized with the model's vocabulary, BOS per the file)");
  app.add_option("-o,--output", out_path, "output .npy or raw .f32")->required();
  app.add_option("-c,--ctx-size", ctx, "context size (default: longest sequence)");
  app.add_option("-t,--threads", threads, "threads");
  tools::ModelFlags flags;
  flags.add(app, "K cache type", "V cache type");  // no --load-mode: always mmap
  app.add_option("--chunk", chunk, "tokens per sequence per batch");
  app.add_option("--delta-chunk", delta_chunk, "runs of >= N tokens use the chunked gated delta rule (0: never)");
  bool mtp = false;
  app.add_flag("--mtp", mtp, "the MTP block's logits (row p: token p with the hidden state of token p - 1)");
  tools::normalize_llama_flags(argc, argv);
  CLI11_PARSE(app, argc, argv);

  auto fail = [](const Error& e) {
    std::fprintf(stderr, "kiln logits: %s\n", e.message.c_str());
    return 1;
  };
  model::MemoryOptions mo;
  model::ContextOptions co;
  auto lm = flags.resolve(mo, co);
  if (!lm) return fail(lm.error());
  lm->mtp = mtp;
  auto m = tools::load_model_cli(model_path, *lm, false);
  if (!m) return fail(m.error());
  std::vector<std::vector<int32_t>> seqs;
  if (!tokens.empty()) {
    auto s = parse_tokens(tokens);
    if (!s) return fail(s.error());
    seqs = std::move(*s);
  } else if (!prompt.empty()) {
    auto tk = model::load_tokenizer((*m)->file());
    if (!tk) return fail(tk.error());
    seqs.push_back((*tk)->encode(prompt));
  } else {
    return fail(err("one of --tokens or --prompt is required"));
  }
  int64_t longest = 0, total = 0;
  for (auto& s : seqs) longest = std::max<int64_t>(longest, int64_t(s.size())), total += int64_t(s.size());
  if (chunk <= 0) return fail(err("--chunk must be positive"));
  mo.n_ctx = ctx > 0 ? ctx : longest;
  mo.n_seq = int(seqs.size());
  mo.mtp = co.mtp = mtp;
  auto mem = model::Memory::create(**m, mo);
  if (!mem) return fail(mem.error());
  co.n_batch = chunk * int64_t(seqs.size());
  co.n_threads = threads;
  co.delta_chunk_min = delta_chunk;
  model::Context cx(**m, co);
  const int64_t V = (*m)->config().n_vocab;
  std::vector<float> out(size_t(total * V));
  std::vector<int64_t> row0(seqs.size(), 0);
  for (size_t i = 1; i < seqs.size(); ++i) row0[i] = row0[i - 1] + int64_t(seqs[i - 1].size());
  std::vector<int64_t> done(seqs.size(), 0);
  model::Batch b;
  std::vector<std::pair<size_t, int64_t>> rows;  // (seq, position) of each output row
  for (size_t i = 0; i < seqs.size() && mtp; ++i)
    for (size_t p = 0; p < seqs[i].size(); ++p) {
      const model::Context::MtpRow r{int32_t(i), seqs[i][p], 1};
      std::vector<std::vector<int32_t>> drafted;
      auto st = cx.mtp_draft(std::span(&r, 1), 0.f, **mem, drafted, /*keep_logits=*/true);
      if (!st) return fail(st.error());
      std::copy_n(cx.logits(0), V, out.data() + (row0[i] + int64_t(p)) * V);
      b.clear();
      b.add(seqs[i][p], int32_t(p), int32_t(i), false);
      st = cx.decode(b, **mem);
      if (!st) return fail(st.error());
    }
  for (; !mtp;) {
    b.clear();
    rows.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t n = std::min<int64_t>(chunk, int64_t(seqs[i].size()) - done[i]);
      for (int64_t j = 0; j < n; ++j) {
        b.add(seqs[i][size_t(done[i] + j)], int32_t(done[i] + j), int32_t(i), true);
        rows.emplace_back(i, done[i] + j);
      }
      done[i] += n;
    }
    if (b.size() == 0) break;
    auto st = cx.decode(b, **mem);
    if (!st) return fail(st.error());
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(cx.logits(int64_t(r)), V, out.data() + (row0[rows[r].first] + rows[r].second) * V);
  }
  auto st = write_out(out_path, out, total, V);
  if (!st) return fail(st.error());
  return 0;
}

}  // namespace

KILN_SUBCOMMAND(logits, "(dev) dump all-position logits of token sequences to .npy", cmd_logits);
