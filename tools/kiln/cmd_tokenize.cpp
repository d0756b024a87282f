// `kiln tokenize` — text → token ids (or ids → text with --detok) using a GGUF file's vocabulary.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "gguf/reader.h"
#include "model/vocab_loader.h"
#include "model_cli.h"
#include "core/read_file.h"
#include "subcommand.h"

namespace {

using kiln::tokenizer::TokenId;

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{
      "Tokenize text with the vocabulary of a GGUF file (llama.cpp-compatible), or detokenize ids.\n"
      "Prints the ids space-separated (or JSON with --json). Input: -p TEXT, -f FILE, or stdin.",
      "kiln tokenize"};
  std::string model, prompt, file, add_bos = "auto";
  bool no_parse_special = false, json = false, detok = false, pieces = false, bench = false, jsonl = false;
  int bench_iters = 3;
  app.add_option("-m,--model", model, "GGUF file (a vocab-only file is enough)")->required();
  app.add_option("-p,--prompt", prompt, "text to tokenize (with --detok: ids, space or comma separated)");
  app.add_option("-f,--file", file, "read the text (or ids) from this file");
  app.add_flag("--no-parse-special", no_parse_special, "treat control-token text like <|im_start|> as plain text");
  app.add_option("--add-bos", add_bos, "auto: as the vocabulary says (also EOS); on: always BOS; off: no BOS/EOS")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_flag("--json", json, "print JSON: {\"ids\": [...], \"pieces\": [...]} (or {\"text\": ...} with --detok)");
  app.add_flag("--pieces", pieces, "print one 'id<TAB>piece' line per token instead of the id list");
  app.add_flag("--detok", detok, "detokenize: the input is token ids; prints the text");
  app.add_flag("--jsonl", jsonl,
               "batch mode: every input line is a JSON string; prints one JSON id array per line");
  app.add_flag("--bench", bench, "time tokenization of the input (tokens/s, MB/s on stderr)");
  app.add_option("--bench-iters", bench_iters, "iterations for --bench (default 3)")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!prompt.empty() && !file.empty()) {
    std::fprintf(stderr, "kiln tokenize: use either -p or -f, not both\n");
    return 2;
  }

  std::string text;
  if (!file.empty()) {
    if (!kiln::read_file(file, text)) {
      std::fprintf(stderr, "kiln tokenize: cannot read %s\n", file.c_str());
      return 1;
    }
  } else if (app.count("-p")) {
    text = prompt;
  } else {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  }

  auto f = kiln::gguf::File::open(model);
  if (!f) {
    std::fprintf(stderr, "kiln tokenize: %s\n", f.error().message.c_str());
    return 1;
  }
  auto tr = kiln::model::load_tokenizer(**f);
  if (!tr) {
    std::fprintf(stderr, "kiln tokenize: %s\n", tr.error().message.c_str());
    return 1;
  }
  const auto& tok = **tr;

  if (detok) {
    std::vector<TokenId> ids;
    for (char& c : text)
      if (c == ',' || c == '[' || c == ']') c = ' ';
    std::istringstream is(text);
    long long x;
    while (is >> x) {
      if (x < 0 || x >= tok.n_tokens()) {
        std::fprintf(stderr, "kiln tokenize: token id %lld is outside the vocabulary (%d tokens)\n", x, tok.n_tokens());
        return 1;
      }
      ids.push_back(TokenId(x));
    }
    if (!is.eof()) {
      std::fprintf(stderr, "kiln tokenize: --detok input must be integer token ids\n");
      return 1;
    }
    std::string out = tok.decode(ids, false, !no_parse_special);
    if (json) std::cout << nlohmann::json{{"text", out}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    else std::cout << out;
    return 0;
  }

  kiln::tokenizer::EncodeOptions opt;
  opt.parse_special = !no_parse_special;
  opt.add_special = add_bos == "auto";
  auto encode = [&](const std::string& s) {
    std::vector<TokenId> ids;
    if (add_bos == "on" && tok.vocab().bos != kiln::tokenizer::kNoToken) ids.push_back(tok.vocab().bos);
    auto body = tok.encode(s, opt);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  };

  if (jsonl) {
    std::istringstream ls(text);
    std::string line;
    size_t lineno = 0;
    while (std::getline(ls, line)) {
      ++lineno;
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_string()) {
        std::fprintf(stderr, "kiln tokenize: --jsonl line %zu is not a JSON string\n", lineno);
        return 1;
      }
      std::cout << nlohmann::json(encode(j.get<std::string>())).dump() << "\n";
    }
    return 0;
  }
  const std::vector<TokenId> ids = encode(text);

  if (bench) {
    double best = 1e30;
    size_t n = 0;
    for (int i = 0; i < bench_iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      n = tok.encode(text, opt).size();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s);
    }
    std::fprintf(stderr, "bench: %zu bytes -> %zu tokens, best of %d: %.4f s, %.0f tokens/s, %.2f MB/s\n", text.size(), n,
                 bench_iters, best, double(n) / best, double(text.size()) / best / 1e6);
  }

  if (json) {
    nlohmann::json j;
    j["ids"] = ids;
    std::vector<std::string> ps;
    for (TokenId id : ids) ps.push_back(tok.token_to_piece(id, true));
    j["pieces"] = ps;
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else if (pieces) {
    for (TokenId id : ids) std::cout << id << "\t" << tok.token_to_piece(id, true) << "\n";
  } else if (!bench) {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

KILN_SUBCOMMAND(tokenize, "tokenize text (or --detok ids) with a GGUF vocabulary", cmd_tokenize);
