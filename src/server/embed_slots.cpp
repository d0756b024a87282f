// server/embed_slots.cpp — Server::Impl's embedding endpoints (POST /v1/embeddings, /embeddings,
//   /embedding: one engine request per input with Request::embed, then server/embeddings.h shapes
//   the answer) and llama-server's slot actions (POST /slots/{id}?action=save|restore|erase through
//   Engine::slot_action, files under --slot-save-path).
// Must not: touch tensors or the engine's state directly (the engine thread runs slot actions).
// Threading: HTTP worker threads; each handler waits only on its own requests / action.
#include <filesystem>

#include "server/embeddings.h"
#include "server/impl.h"

namespace kiln::server {

void Server::Impl::h_embeddings(const httplib::Request& req, httplib::Response& res) { embeddings(req, res, true); }
void Server::Impl::h_embedding(const httplib::Request& req, httplib::Response& res) { embeddings(req, res, false); }

// POST /v1/embeddings (oai) and /embedding: one engine request per input (Request::embed), run
// concurrently in the slots, then normalized and shaped (server/embeddings.h).
engine::Pooling Server::Impl::pooling() const {
  std::string p = opt.pooling;
  if (p.empty()) {
    const int t = info().pooling_type;
    p = t == 1 ? "mean" : t == 2 ? "cls" : t == 3 ? "last" : "none";
  }
  return p == "mean" ? engine::Pooling::Mean : p == "cls" ? engine::Pooling::Cls
       : p == "last" ? engine::Pooling::Last : engine::Pooling::None;
}
void Server::Impl::embeddings(const httplib::Request& req, httplib::Response& res, bool oai) {
  if (!opt.embedding)
    return send_error(res, error_of(501, "not_supported_error",
                                    "This server does not support embeddings. Start it with `--embeddings`"));
  json body;
  if (!parse_body(req, res, body)) return;
  const engine::Pooling pool = pooling();
  if (oai && pool == engine::Pooling::None)
    return send_error(res, error_of(400, "invalid_request_error",
                                    "pooling type 'none' is not OpenAI-compatible: start the server with --pooling "
                                    "mean, cls or last"));
  const std::string field = !oai && body.contains("content") ? "content" : "input";
  std::vector<std::vector<int32_t>> inputs;
  if (auto e = parse_embedding_inputs(body, field, info().n_vocab, [this](const std::string& t) { return tokenize_prompt(t); },
                                      inputs))
    return send_error(res, *e);
  int norm = 2;
  if (auto e = parse_embd_normalize(body, norm)) return send_error(res, *e);
  bool base64 = false;
  if (auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64"))
      return send_error(res, bad_request("encoding_format", "expected \"float\" or \"base64\""));
    base64 = *f == "base64";
  }
  int64_t n_tokens = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (int64_t(inputs[i].size()) > info().n_ctx_slot)
      return send_error(res, bad_request(inputs.size() > 1 ? fmt::format("{}[{}]", field, i) : field,
                                         fmt::format("{} tokens exceed the slot's context of {}", inputs[i].size(),
                                                     info().n_ctx_slot)));
    n_tokens += int64_t(inputs[i].size());
  }
  std::vector<engine::RequestHandle> hs;
  for (auto& ids : inputs) {
    engine::Request r;
    r.prompt = std::move(ids);
    r.embed = true;
    r.pooling = pool;
    hs.push_back(eng->submit(std::move(r)));
  }
  std::vector<std::vector<float>> embs(hs.size());
  for (size_t i = 0; i < hs.size(); ++i) {
    std::optional<engine::Event> fin;
    while (!fin) {
      if (stopping.load()) return send_error(res, error_of(503, "unavailable_error", "the server is shutting down"));
      auto ev = hs[i].next(std::chrono::milliseconds(100));
      if (ev && ev->final()) fin = std::move(ev);
    }
    if (fin->finish == engine::FinishReason::Error)
      return send_error(res, error_of(500, "server_error", "embedding failed: " + fin->error));
    embs[i] = std::move(fin->embedding);
    normalize_embedding(embs[i], info().n_embd, norm);
  }
  if (oai) return send_json(res, oai_embeddings_json(embs, model_id, n_tokens, base64));
  send_json(res, native_embedding_json(embs, info().n_embd));
}

// POST /slots/{id}?action=save|restore|erase (llama-server's; files under --slot-save-path).
void Server::Impl::h_slot_action(const httplib::Request& req, httplib::Response& res) {
  if (opt.slot_save_path.empty())
    return send_error(res, error_of(501, "not_supported_error",
                                    "This server does not support slot actions. Start it with `--slot-save-path`"));
  const std::string action = req.has_param("action") ? req.get_param_value("action") : "";
  int64_t id = -1;
  if (req.matches.size() > 1) {
    const std::string s = req.matches[1].str();
    if (!s.empty() && s.size() < 10) id = std::stoll(s);
  }
  if (id < 0 || id >= eng->options().n_parallel)
    return send_error(res, bad_request("id_slot", fmt::format("no slot {} ({} slots)", req.matches.size() > 1 ? req.matches[1].str() : "", eng->options().n_parallel)));
  engine::Engine::SlotAction act;
  if (action == "save") act = engine::Engine::SlotAction::Save;
  else if (action == "restore") act = engine::Engine::SlotAction::Restore;
  else if (action == "erase") act = engine::Engine::SlotAction::Erase;
  else return send_error(res, bad_request("action", "expected save, restore or erase"));
  std::string filename;
  if (act != engine::Engine::SlotAction::Erase) {
    json body;
    if (!parse_body(req, res, body)) return;
    auto f = body.find("filename");
    if (f == body.end() || !f->is_string()) return send_error(res, bad_request("filename", "expected a string"));
    filename = f->get<std::string>();
    if (!valid_slot_filename(filename))
      return send_error(res, bad_request("filename", "invalid file name (a plain name: no path separators, no leading dot)"));
  }
  const std::string path = filename.empty() ? "" : opt.slot_save_path + "/" + filename;
  if (act == engine::Engine::SlotAction::Save) {
    std::error_code ec;
    std::filesystem::create_directories(opt.slot_save_path, ec);  // an error shows up when the file is written
  }
  auto r = eng->slot_action(act, int(id), path);
  if (!r) return send_error(res, bad_request(filename.empty() ? "id_slot" : "filename", r.error().message));
  if (act == engine::Engine::SlotAction::Erase) return send_json(res, {{"id_slot", id}, {"n_erased", r->n_tokens}});
  const bool save = act == engine::Engine::SlotAction::Save;
  send_json(res, {{"id_slot", id},
                  {"filename", filename},
                  {save ? "n_saved" : "n_restored", r->n_tokens},
                  {save ? "n_written" : "n_read", r->n_bytes},
                  {"timings", {{save ? "save_ms" : "restore_ms", r->ms}}}});
}
bool Server::Impl::valid_slot_filename(const std::string& f) {
  if (f.empty() || f.size() > 255 || f[0] == '.') return false;
  for (unsigned char c : f)
    if (c < 0x20 || c == '/' || c == '\\' || c == ':' || c == '*' || c == '?' || c == '"' || c == '<' || c == '>' ||
        c == '|' || c == 0x7f)
      return false;
  return true;
}

}  // namespace kiln::server
