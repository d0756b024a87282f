// core/log.h — leveled logging to stderr (spdlog underneath), one line per event.
// Owns: the process-wide log level (KILN_LOG_LEVEL env or set_log_level).
// Threading: thread-safe.
#pragma once
#include <spdlog/spdlog.h>

#include <string_view>

namespace kiln {
// "debug", "info", "warn", "error", "off". Unknown names leave the level unchanged.
void set_log_level(std::string_view level);
void init_logging();  // reads KILN_LOG_LEVEL; idempotent
}  // namespace kiln

#define KILN_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define KILN_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define KILN_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define KILN_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
