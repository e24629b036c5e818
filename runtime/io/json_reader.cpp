#include "runtime/io/json_reader.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/errors.hpp"

namespace ringattn {

const JsonValue* JsonValue::find(const std::string& key) const {
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

double JsonValue::number_or(const std::string& key, double fallback) const {
  const JsonValue* v = find(key);
  return v && v->is_number() ? v->number() : fallback;
}

std::string JsonValue::string_or(const std::string& key, const std::string& fallback) const {
  const JsonValue* v = find(key);
  return v && v->is_string() ? v->text() : fallback;
}

bool JsonValue::bool_or(const std::string& key, bool fallback) const {
  const JsonValue* v = find(key);
  return v && v->is_bool() ? v->boolean() : fallback;
}

// Recursive descent over RFC 8259 (numbers as doubles; \u escapes of the basic plane as UTF-8).
class JsonParser {
 public:
  JsonParser(const std::string& text, std::string where) : s_(text), where_(std::move(where)) {}

  JsonValue document() {
    JsonValue v = value(0);
    skip_space();
    if (at_ < s_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    int line = 1;
    for (size_t i = 0; i < at_ && i < s_.size(); ++i) line += s_[i] == '\n';
    throw usage_error(where_ + ": invalid JSON at line " + std::to_string(line) + ": " + what);
  }
  void skip_space() {
    while (at_ < s_.size() && std::strchr(" \t\r\n", s_[at_])) ++at_;
  }
  bool take(char c) {
    skip_space();
    if (at_ < s_.size() && s_[at_] == c) return ++at_, true;
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  bool take_word(const char* w) {
    const size_t n = std::strlen(w);
    if (s_.compare(at_, n, w) != 0) return false;
    at_ += n;
    return true;
  }

  JsonValue value(int depth) {
    if (depth > 64) fail("nested too deeply");
    skip_space();
    if (at_ >= s_.size()) fail("unexpected end");
    JsonValue v;
    const char c = s_[at_];
    if (c == '{') {
      ++at_;
      v.kind_ = JsonValue::Kind::object;
      if (take('}')) return v;
      do {
        skip_space();
        if (at_ >= s_.size() || s_[at_] != '"') fail("expected a member name");
        std::string key = string();
        expect(':');
        v.members_.emplace_back(std::move(key), value(depth + 1));
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++at_;
      v.kind_ = JsonValue::Kind::array;
      if (take(']')) return v;
      do v.items_.push_back(value(depth + 1));
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind_ = JsonValue::Kind::string;
      v.text_ = string();
    } else if (take_word("true") || take_word("false")) {
      v.kind_ = JsonValue::Kind::boolean;
      v.boolean_ = s_[at_ - 1] == 'e' && s_[at_ - 2] == 'u';
    } else if (take_word("null")) {
      v.kind_ = JsonValue::Kind::null;
    } else {
      const char* begin = s_.c_str() + at_;
      char* end = nullptr;
      errno = 0;
      v.number_ = std::strtod(begin, &end);
      if (end == begin || errno == ERANGE) fail("expected a value");
      at_ += static_cast<size_t>(end - begin);
      v.kind_ = JsonValue::Kind::number;
    }
    return v;
  }

  std::string string() {
    ++at_;  // the opening quote
    std::string out;
    while (true) {
      if (at_ >= s_.size()) fail("unterminated string");
      const char c = s_[at_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= s_.size()) fail("unterminated string");
      const char e = s_[at_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (at_ + 4 > s_.size()) fail("bad \\u escape");
          const unsigned cp = static_cast<unsigned>(std::strtoul(s_.substr(at_, 4).c_str(), nullptr, 16));
          at_ += 4;
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xc0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          } else {
            out += static_cast<char>(0xe0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          }
          break;
        }
        default: out += e;  // \" \\ \/
      }
    }
  }

  const std::string& s_;
  std::string where_;
  size_t at_ = 0;
};

JsonValue parse_json(const std::string& text, const std::string& label, const std::string& path) {
  return JsonParser(text, label + " " + path).document();
}

JsonValue read_json_file(const std::string& path, const std::string& label) {
  std::ifstream in(path);
  if (!in) throw usage_error(label + " " + path + ": cannot open (" + std::strerror(errno) + ")");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json(ss.str(), label, path);
}

}  // namespace ringattn
