// chat/jinja/registry.h — the names kiln's Jinja engine knows (internal): one table per kind
//       (filters, tests, str / list / tuple / dict / cycler methods, globals) mapping a name to
//       the function that implements it.
// Owns: the table types and lookups. The parser's name checks, the interpreter's dispatch,
//       `is filter` / `is test`, map() / select() and the unit tests all read these tables, so
//       a name is accepted at parse time exactly when it can be executed.
// Must not: hold state (the tables are constant) or evaluate anything.
// Threading: the tables are immutable; read them from any thread.
#pragma once
#include <span>
#include <string>
#include <string_view>

#include "chat/jinja/value.h"

namespace kiln::chat::jinja {

// Every function receives the name it was called by (several names share one function, and
// errors name the construct as the template spelled it).
using FilterFn = Value (*)(Interp& in, const std::string& name, const Value& v, CallArgs& a);
using TestFn = bool (*)(Interp& in, const std::string& name, const Value& v, CallArgs& a);
using MethodFn = Value (*)(Interp& in, const std::string& name, const Value& self, CallArgs& a);
using GlobalFn = Value (*)(Interp& in, CallArgs& a);

struct FilterDef {
  std::string_view name;
  FilterFn fn;
};
struct TestDef {
  std::string_view name;
  TestFn fn;
};
struct MethodDef {
  std::string_view name;
  MethodFn fn;
  bool mutates = false;  // list/dict mutator: a SecurityError under Options::immutable_sandbox
};
struct GlobalDef {
  std::string_view name;
  GlobalFn fn;
};

std::span<const FilterDef> filter_table();        // filters.cpp
std::span<const TestDef> test_table();            // jinja_tests.cpp
std::span<const MethodDef> str_method_table();    // methods.cpp
std::span<const MethodDef> list_method_table();   // methods.cpp (lists, not tuples or generators)
std::span<const MethodDef> tuple_method_table();  // methods.cpp
std::span<const MethodDef> dict_method_table();   // methods.cpp
std::span<const GlobalDef> global_table();        // globals.cpp
std::span<const MethodDef> cycler_method_table(); // globals.cpp (cycler(…).next() / .reset())

// The Python classes of jinja2's helper objects (Namespace values whose Dict::cls is set): their
// attributes are read-only, their methods (Cycler's only) are in the table above.
inline constexpr std::string_view kCyclerClass = "jinja2.utils.Cycler";
inline constexpr std::string_view kJoinerClass = "jinja2.utils.Joiner";
inline constexpr std::string_view kTemplateRefClass = "jinja2.runtime.TemplateReference";  // `self`
inline constexpr std::string_view kBlockRefClass = "jinja2.runtime.BlockReference";        // `self.name`

// The entry named `name` in `table`, nullptr when there is none.
template <class Def>
const Def* find_def(std::span<const Def> table, std::string_view name) {
  for (const Def& d : table)
    if (d.name == name) return &d;
  return nullptr;
}
inline const FilterDef* find_filter(std::string_view name) { return find_def(filter_table(), name); }
inline const TestDef* find_test(std::string_view name) { return find_def(test_table(), name); }

}  // namespace kiln::chat::jinja
