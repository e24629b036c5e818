// Reading small JSON documents: the files the launch commands take (benchmark results of `ringattn plan
// --calibrate`, `--cluster`), HF config.json and PEFT adapter_config.json, safetensors headers. The writer
// is launch/cli/json.hpp.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ringattn {

class JsonValue {
 public:
  enum class Kind { null, boolean, number, string, array, object };

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::object; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_number() const { return kind_ == Kind::number; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_bool() const { return kind_ == Kind::boolean; }

  double number() const { return number_; }
  bool boolean() const { return boolean_; }
  const std::string& text() const { return text_; }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }

  // The member named `key` of an object; nullptr when absent (or not an object).
  const JsonValue* find(const std::string& key) const;
  double number_or(const std::string& key, double fallback) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;
  bool bool_or(const std::string& key, bool fallback) const;

 private:
  friend class JsonParser;
  Kind kind_ = Kind::null;
  bool boolean_ = false;
  double number_ = 0.0;
  std::string text_;
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

// Parses a whole document; throws ArgumentError "<label> <path>: invalid JSON at line N: ...".
JsonValue parse_json(const std::string& text, const std::string& label, const std::string& path);
// Reads and parses a file; throws ArgumentError naming `label` and the file.
JsonValue read_json_file(const std::string& path, const std::string& label);

}  // namespace ringattn
