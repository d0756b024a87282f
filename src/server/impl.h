// server/impl.h — Server::Impl, the server's state and handlers, shared by the files that define
//   them: server.cpp (set-up, auth, routes, small endpoints, run), generate.cpp (the generation
//   endpoints and their blocking / streaming runners), compat.cpp (Anthropic and Responses routes).
//   Private to src/server: nothing outside includes it.
// Owns: the declaration of Server::Impl and its per-request structs (Gen, StreamState).
// Must not: be included outside src/server; hold logic (definitions live in the .cpp files).
// Threading: see server.h — HTTP worker threads run the handlers; the engine thread is the engine's.
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "chat/chat.h"
#include "chat/output_parser.h"
#include "server/api.h"
#include "server/dialect.h"
#include "server/native.h"
#include "server/server.h"

namespace kiln::server {

using Clock = std::chrono::steady_clock;
using WriteFn = std::function<bool(const std::string&)>;
class ResponseStore;

// One server-sent event: `data: <json>` and a blank line (generate.cpp).
std::string sse(const json& j);

struct Server::Impl {
  ServerOptions opt;
  std::unique_ptr<engine::Engine> eng;
  std::unique_ptr<chat::ChatTemplate> tmpl;
  std::string model_id;
  httplib::Server http;
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> http_requests{0}, http_errors{0};
  std::atomic<uint64_t> task_ids{0};
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop_requested = false;
  std::shared_ptr<ResponseStore> response_store;  // /v1/responses kept for previous_response_id (bounded)

  // ----------------------------------------------------------------------------------------------
  // Responses

  void send_json(httplib::Response& res, const json& j, int status = 200);
  void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.to_json(), e.status); }
  // An error in the shape of the API a request path belongs to (Anthropic's under /v1/messages).
  void send_error_for(const httplib::Request& req, httplib::Response& res, const ApiError& e);
  // An error in the dialect's shape (OpenAI's when d is null).
  void send_error(httplib::Response& res, const ApiError& e, const ChatDialect* d) {
    send_json(res, d ? d->error_json(e) : e.to_json(), e.status);
  }

  static ApiError error_of(int status, std::string type, std::string message);

  // ----------------------------------------------------------------------------------------------
  // Auth and readiness (pre-routing)

  bool is_public(const httplib::Request& req) const;

  bool authorized(const httplib::Request& req) const;

  // ----------------------------------------------------------------------------------------------
  // Body parsing

  // The body as a JSON object; false once a 400 (in the path's API shape) is answered.
  bool parse_body(const httplib::Request& req, httplib::Response& res, json& body);

  const tokenizer::Tokenizer& tok() const { return eng->tokenizer(); }
  const engine::ModelInfo& info() const { return eng->info(); }

  std::vector<int32_t> tokenize_prompt(const std::string& text) const;

  std::optional<ApiError> check_context(size_t n_prompt) const;

  // The body's chat request (validated) rendered by the template.
  std::optional<ApiError> render_chat(const json& body, chat::ChatRequest& creq, chat::Prompt& prompt);
  struct Gen;
  // A prompt with images (server/images.cpp): fetch, decode and preprocess each image, tokenize the
  // text around the media markers into g.prompt and fill g.gp.req.images. 400s name the image.
  std::optional<ApiError> image_prompt(const chat::Prompt& prompt, Gen& g);

  // ----------------------------------------------------------------------------------------------
  // Generation (shared by chat and completions)

  struct Gen {
    bool chat = true;
    std::string id;
    int64_t created = 0;
    std::vector<int32_t> prompt;
    GenParams gp;
    std::optional<chat::ParserConfig> parser;  // chat only
    std::string echo_text;                     // completions with echo
    bool native = false;                       // llama-server's /completion (chat false too)
    NativeParams np;                           // native only
    std::string prompt_text;                   // native only: the prompt as text ("prompt")
    int id_slot = -1;                          // native only: the slot that ran it (-1: unknown)
    uint64_t task = 0;
    Clock::time_point t0;
    int client_fd = -1;  // non-streamed requests: the socket polled for a disconnect (find_client_socket)
    std::shared_ptr<ChatDialect> dialect;  // chat answered as Anthropic Messages / OpenAI Responses (null: OpenAI chat)
  };

  // A /v1/chat/completions body → g (sampling, template, tool_choice grammar, tokens, context check);
  // the ChatRequest it parsed goes to *creq when given. Nothing is answered here.
  std::optional<ApiError> prepare_chat(const json& body, const httplib::Request& req, Gen& g, chat::ChatRequest* creq = nullptr);
  // Answers a chat generation in g->dialect's shapes (the Anthropic / Responses endpoints).
  void start_dialect(const json& chat_body, const httplib::Request& req, httplib::Response& res, std::shared_ptr<ChatDialect> d,
                     const std::function<void(Gen&)>& adjust = {});

  void log_timings(const Gen& g, const engine::Timings& t, const char* finish);
  // One non-streamed choice of an OpenAI chat / completions answer (message or text, logprobs,
  // finish_reason).
  json choice_json(const Gen& g, size_t index, const std::string& text, const std::vector<engine::TokenOut>& toks,
                   engine::FinishReason finish) const;
  // n > 1 (OpenAI chat / completions): the n choices' engine requests, the first submitted alone
  // and the others once its prompt is processed (they reuse it through the prefix cache); choice i
  // samples with seed + i when a seed is given. Choice 0's events read while waiting go to `early`.
  // Blocking and streaming answers (choices.cpp).
  std::vector<engine::RequestHandle> submit_choices(const Gen& g, std::deque<engine::Event>& early);
  void run_blocking_n(Gen& g, httplib::Response& res);
  void run_streaming_n(std::shared_ptr<Gen> g, httplib::Response& res);

  static const char* finish_name(engine::FinishReason r);

  // A chat choice's "logprobs": {"content": [entry per token]}, or null without logprobs.
  json chat_logprobs(const Gen& g, const std::vector<engine::TokenOut>& toks) const;

  // A completion choice's "logprobs" (tokens, token_logprobs, top_logprobs, text_offset), or null.
  json completion_logprobs(const Gen& g, const std::vector<engine::TokenOut>& toks, size_t text_offset0) const;

  // The fields every response and stream chunk starts with.
  json response_head(const Gen& g, bool chunk) const;

  // The slot running request `h` (-1 once it has left it); a single slot is always 0.
  int slot_of(const engine::RequestHandle& h) const;

  void run_blocking(Gen& g, httplib::Response& res);

  struct StreamState {
    engine::RequestHandle h;
    std::optional<chat::OutputParser> parser;
    bool started = false;
    bool finished = false;
    Clock::time_point last_write;
    int id_slot = -1;        // native: the slot running it
    int64_t n_decoded = 0;   // native: tokens generated so far
  };

  void run_streaming(std::shared_ptr<Gen> g, httplib::Response& res);

  bool on_stream_event(const Gen& g, StreamState& st, engine::Event& ev, httplib::DataSink& sink, const WriteFn& write);

  // /completion's stream: chunks {content, stop:false, …}, then the summary with stop:true; no [DONE].
  bool on_native_event(const Gen& g, StreamState& st, engine::Event& ev, httplib::DataSink& sink, const WriteFn& write);

  // ----------------------------------------------------------------------------------------------
  // Endpoints

  void h_chat(const httplib::Request& req, httplib::Response& res);

  void h_completions(const httplib::Request& req, httplib::Response& res);

  // llama-server's native POST /completion (native.h): the /v1/completions generation, other JSON.
  void h_completion(const httplib::Request& req, httplib::Response& res);

  // llama-server's POST /infill (infill.h): the FIM prompt run as a /completion request.
  void h_infill(const httplib::Request& req, httplib::Response& res);

  // A llama-server native request's Gen (/completion, /infill): its sampling fields parsed from
  // body; nullptr after answering the error.
  std::shared_ptr<Gen> native_gen(const json& body, httplib::Response& res);
  void start(std::shared_ptr<Gen> g, httplib::Response& res);

  // Anthropic Messages API (server/anthropic.h) and OpenAI Responses API (server/responses.h).
  void h_messages(const httplib::Request& req, httplib::Response& res);
  void h_count_tokens(const httplib::Request& req, httplib::Response& res);
  void h_responses(const httplib::Request& req, httplib::Response& res);
  void h_response_get(const httplib::Request& req, httplib::Response& res);
  void h_response_delete(const httplib::Request& req, httplib::Response& res);

  void h_tokenize(const httplib::Request& req, httplib::Response& res);

  // Embeddings and slot actions (embed_slots.cpp).
  void h_embeddings(const httplib::Request& req, httplib::Response& res);
  void h_embedding(const httplib::Request& req, httplib::Response& res);
  engine::Pooling pooling() const;
  void embeddings(const httplib::Request& req, httplib::Response& res, bool oai);
  void h_slot_action(const httplib::Request& req, httplib::Response& res);
  static bool valid_slot_filename(const std::string& f);

  void h_detokenize(const httplib::Request& req, httplib::Response& res);

  void h_apply_template(const httplib::Request& req, httplib::Response& res);

  json model_meta() const;

  void h_models(const httplib::Request&, httplib::Response& res);

  void h_props(const httplib::Request&, httplib::Response& res);

  void h_slots(const httplib::Request&, httplib::Response& res);

  void h_metrics(const httplib::Request&, httplib::Response& res);

  void h_health(const httplib::Request&, httplib::Response& res);

  void h_root(const httplib::Request& req, httplib::Response& res);

  // ----------------------------------------------------------------------------------------------
  // Set-up

  using H = void (Impl::*)(const httplib::Request&, httplib::Response&);
  httplib::Server::Handler wrap(H h);

  void setup_routes();

  Status init_template();
};

}  // namespace kiln::server
