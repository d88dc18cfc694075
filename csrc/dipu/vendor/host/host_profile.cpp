#include "host_profile.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace dipu::host {
namespace {

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  size_t end = text.find_last_not_of(" \t\r");
  std::string value = text.substr(begin, end - begin + 1);
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front()) {
    value = value.substr(1, value.size() - 2);
  }
  return value;
}

// The profile format is a flat YAML mapping: `key: value` lines, `#` comments, and values that are
// scalars or flow lists `[a, b]`.
std::map<std::string, std::string> read_flat_yaml(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open emulation profile " + path);
  std::map<std::string, std::string> fields;
  std::string line;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    size_t comment = line.find('#');
    if (comment != std::string::npos) line = line.substr(0, comment);
    if (trim(line).empty()) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos || std::isspace(static_cast<unsigned char>(line[0]))) {
      throw std::runtime_error(path + ":" + std::to_string(line_number) + ": expected `key: value`");
    }
    fields[trim(line.substr(0, colon))] = trim(line.substr(colon + 1));
  }
  return fields;
}

uint64_t parse_bytes(const std::string& path, const std::string& key, const std::string& text) {
  static const std::map<std::string, uint64_t> units = {
      {"", 1}, {"B", 1}, {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40}};
  size_t consumed = 0;
  double number = 0;
  try {
    number = std::stod(text, &consumed);
  } catch (const std::exception&) {
    consumed = 0;
  }
  auto unit = units.find(trim(text.substr(consumed)));
  if (consumed == 0 || unit == units.end() || number <= 0) {
    throw std::runtime_error(path + ": field " + key + ": expected a size like 512MiB or 16GiB, got '" + text + "'");
  }
  return static_cast<uint64_t>(number * static_cast<double>(unit->second));
}

double parse_number(const std::string& path, const std::string& key, const std::string& text) {
  try {
    size_t consumed = 0;
    double value = std::stod(text, &consumed);
    if (consumed == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw std::runtime_error(path + ": field " + key + ": expected a number, got '" + text + "'");
}

bool parse_bool(const std::string& path, const std::string& key, const std::string& text) {
  if (text == "true" || text == "yes") return true;
  if (text == "false" || text == "no") return false;
  throw std::runtime_error(path + ": field " + key + ": expected true or false, got '" + text + "'");
}

std::set<std::string> parse_list(const std::string& path, const std::string& key, const std::string& text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') {
    throw std::runtime_error(path + ": field " + key + ": expected a list like [diopiMm, diopiBmm]");
  }
  std::set<std::string> items;
  std::stringstream stream(text.substr(1, text.size() - 2));
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!trim(item).empty()) items.insert(trim(item));
  }
  return items;
}

bool latency_without_bandwidth(const Profile& profile) {
  return profile.host_link_latency_us > 0 && profile.host_link_gbps == 0;
}

}  // namespace

Profile parse_profile_file(const std::string& path) {
  Profile profile;
  for (const auto& [key, value] : read_flat_yaml(path)) {
    if (key == "name") {
      profile.name = value;
    } else if (key == "description") {
      profile.description = value;
    } else if (key == "device_count") {
      profile.device_count = static_cast<int32_t>(parse_number(path, key, value));
      if (profile.device_count < 1) throw std::runtime_error(path + ": field device_count: must be at least 1");
    } else if (key == "memory_capacity") {
      profile.memory_capacity = parse_bytes(path, key, value);
    } else if (key == "relative_speed") {
      profile.relative_speed = parse_number(path, key, value);
      if (profile.relative_speed <= 0 || profile.relative_speed > 1) {
        throw std::runtime_error(path + ": field relative_speed: must be in (0, 1]");
      }
    } else if (key == "host_accessible") {
      profile.host_accessible = parse_bool(path, key, value);
    } else if (key == "round_output_ops") {
      profile.round_output_ops = parse_list(path, key, value);
    } else if (key == "round_output_mantissa_bits") {
      profile.round_output_mantissa_bits = static_cast<int32_t>(parse_number(path, key, value));
      if (profile.round_output_mantissa_bits < 1 || profile.round_output_mantissa_bits > 52) {
        throw std::runtime_error(path + ": field round_output_mantissa_bits: must be in [1, 52]");
      }
    } else if (key == "host_link_gbps") {
      profile.host_link_gbps = parse_number(path, key, value);
      if (profile.host_link_gbps <= 0) throw std::runtime_error(path + ": field host_link_gbps: must be above 0");
    } else if (key == "host_link_latency_us") {
      profile.host_link_latency_us = parse_number(path, key, value);
      if (profile.host_link_latency_us < 0) {
        throw std::runtime_error(path + ": field host_link_latency_us: must not be negative");
      }
    } else {
      throw std::runtime_error(path + ": unknown field '" + key + "'");
    }
  }
  if (latency_without_bandwidth(profile)) {
    throw std::runtime_error(path + ": field host_link_latency_us: needs host_link_gbps (the link's bandwidth)");
  }
  return profile;
}

Profile load_profile_from_environment(const std::string& builtin_profile_dir) {
  const char* requested = std::getenv("DIPU_HOST_PROFILE");
  std::string name = (requested && *requested) ? requested : "default";
  bool is_path = name.find('/') != std::string::npos || name.find(".yaml") != std::string::npos;
  std::string path = is_path ? name : builtin_profile_dir + "/" + name + ".yaml";
  if (!is_path && !std::ifstream(path)) {
    throw std::runtime_error("DIPU_HOST_PROFILE: no built-in profile named '" + name + "' (looked in " +
                             builtin_profile_dir + ")");
  }
  return parse_profile_file(path);
}

}  // namespace dipu::host
