#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace kiln {
void set_log_level(std::string_view level) {
  auto l = spdlog::level::from_str(std::string(level));
  if (l != spdlog::level::off || level == "off") spdlog::set_level(l);
}

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("kiln");
    logger->set_pattern("%^%L%$ %H:%M:%S.%e %v");
    spdlog::set_default_logger(logger);
    if (const char* e = std::getenv("KILN_LOG_LEVEL")) set_log_level(e);
  });
}
}  // namespace kiln
