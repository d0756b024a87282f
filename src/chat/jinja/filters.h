// chat/jinja/filters.h — the filter implementations that filters.cpp lists in the registry's
//       filter table but text_filters.cpp defines (internal).
// Owns: nothing but these declarations (signature: registry.h's FilterFn).
// Must not: be included outside filters.cpp / text_filters.cpp.
// Threading: the filters run inside one render call (Interp).
#pragma once
#include "chat/jinja/interp.h"

namespace kiln::chat::jinja::text_filters {

Value tojson(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value string(Interp& in, const std::string& name, const Value& v, CallArgs& a);      // string, safe
Value escape(Interp& in, const std::string& name, const Value& v, CallArgs& a);      // escape, e, forceescape
Value trim(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value change_case(Interp& in, const std::string& name, const Value& v, CallArgs& a);  // upper lower capitalize title
Value replace(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value indent(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value center(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value wordcount(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value format(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value truncate(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value filesizeformat(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value urlencode(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value xmlattr(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value pprint(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value striptags(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value wordwrap(Interp& in, const std::string& name, const Value& v, CallArgs& a);
Value urlize(Interp& in, const std::string& name, const Value& v, CallArgs& a);

}  // namespace kiln::chat::jinja::text_filters
