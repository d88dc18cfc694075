// The text form of setup messages and store entries: "name=value" lines. Reading a field that is
// missing or malformed throws `Error` (CommError, or FrameError for a frame's payload) with one
// line naming the message (`what`) and the field.
#pragma once

#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

namespace dicomm {

using TextFields = std::map<std::string, std::string>;

// Lines without '=' are ignored; a repeated name keeps its last value.
inline TextFields parseTextFields(const std::string& text) {
  TextFields fields;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return fields;
}

template <typename Error>
const std::string& requireField(const TextFields& fields, const std::string& name, const std::string& what) {
  auto found = fields.find(name);
  if (found == fields.end()) throw Error(what + " lacks field '" + name + "'");
  return found->second;
}

template <typename Error>
long long requireInteger(const TextFields& fields, const std::string& name, const std::string& what) {
  const std::string& text = requireField<Error>(fields, name, what);
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return value;
  } catch (const std::exception&) {
    throw Error(what + " field '" + name + "'='" + text + "' is not an integer");
  }
}

}  // namespace dicomm
