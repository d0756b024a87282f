// chat/jinja/jinja.cpp — public API glue: parse/render with errors as kiln::Result.
#include "chat/jinja/jinja.h"

#include <ctime>
#include <exception>

#include "chat/jinja/ast.h"

namespace kiln::chat::jinja {

namespace {
kiln::Error to_error(const JinjaError& e) {
  return kiln::Error{"template line " + std::to_string(e.line) + ": " + e.construct + ": " + e.message};
}
}  // namespace

kiln::Result<Template> Template::parse(std::string_view source, const Options& opt) {
  auto prog = std::make_shared<detail::Program>();
  prog->opt = opt;
  try {
    parse_program(source, *prog);
  } catch (const JinjaError& e) {
    return to_error(e);
  } catch (const std::exception& e) {
    return kiln::Error{std::string("template: internal error while parsing: ") + e.what()};
  }
  Template t;
  t.prog_ = std::move(prog);
  return t;
}

kiln::Result<std::string> Template::render(const nlohmann::ordered_json& context) const {
  KILN_CHECK(prog_ != nullptr, "Template::render on a default-constructed Template");
  try {
    return render_program(*prog_, context);
  } catch (const JinjaError& e) {
    return to_error(e);
  } catch (const std::bad_alloc&) {
    return kiln::Error{"template: out of memory while rendering"};
  } catch (const std::exception& e) {
    return kiln::Error{std::string("template: internal error while rendering: ") + e.what()};
  }
}

kiln::Result<std::function<std::string(const std::string&)>> fixed_strftime(std::string_view when) {
  std::tm tm{};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  std::string w(when);
  int n = std::sscanf(w.c_str(), "%4d-%2d-%2d%*[T ]%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &s);
  if (n < 3 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || s < 0 || s > 60)
    return kiln::err("--now '{}': expected YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS]", when);
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  tm.tm_isdst = -1;
  std::tm norm = tm;
  timegm(&norm);  // fills tm_wday / tm_yday
  tm.tm_wday = norm.tm_wday;
  tm.tm_yday = norm.tm_yday;
  return std::function<std::string(const std::string&)>([tm](const std::string& fmt) {
    char buf[1024];
    size_t len = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return std::string(buf, len);
  });
}

}  // namespace kiln::chat::jinja
