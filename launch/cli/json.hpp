// A small ordered JSON writer for the --json summaries (keys keep the order they are set in).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ringattn {

class Json {
 public:
  Json() : kind_(Kind::null) {}
  Json(bool b) : kind_(Kind::boolean), b_(b) {}
  Json(int v) : kind_(Kind::integer), i_(v) {}
  Json(int64_t v) : kind_(Kind::integer), i_(v) {}
  Json(uint64_t v) : kind_(Kind::integer), i_(static_cast<int64_t>(v)) {}
  Json(double v) : kind_(Kind::number), d_(v) {}
  Json(const char* s) : kind_(Kind::string), s_(s) {}
  Json(std::string s) : kind_(Kind::string), s_(std::move(s)) {}

  static Json object() {
    Json j;
    j.kind_ = Kind::object;
    return j;
  }
  static Json array() {
    Json j;
    j.kind_ = Kind::array;
    return j;
  }

  // Object member (inserted in order, replaced if present).
  Json& operator[](const std::string& key) {
    for (auto& [k, v] : members_)
      if (k == key) return v;
    members_.emplace_back(key, Json());
    return members_.back().second;
  }
  void push_back(Json v) { items_.push_back(std::move(v)); }
  bool is_null() const { return kind_ == Kind::null; }
  bool contains(const std::string& key) const {
    for (const auto& [k, v] : members_)
      if (k == key) return true;
    return false;
  }

  std::string dump(int indent = 2) const {
    std::string out;
    write(out, indent, 0);
    return out;
  }

 private:
  enum class Kind { null, boolean, integer, number, string, object, array };

  static void escape(std::string& out, const std::string& s) {
    out += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out += static_cast<char>(c);
          }
      }
    }
    out += '"';
  }

  void write(std::string& out, int indent, int depth) const {
    switch (kind_) {
      case Kind::null: out += "null"; break;
      case Kind::boolean: out += b_ ? "true" : "false"; break;
      case Kind::integer: out += std::to_string(i_); break;
      case Kind::number: {
        if (!std::isfinite(d_)) {  // JSON has no inf/nan
          out += "null";
          break;
        }
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.9g", d_);
        out += buf;
        break;
      }
      case Kind::string: escape(out, s_); break;
      case Kind::object: write_items(out, indent, depth, '{', '}', members_.size(), [&](size_t i) {
          escape(out, members_[i].first);
          out += ": ";
          members_[i].second.write(out, indent, depth + 1);
        });
        break;
      case Kind::array: write_items(out, indent, depth, '[', ']', items_.size(), [&](size_t i) {
          items_[i].write(out, indent, depth + 1);
        });
        break;
    }
  }

  // An object's members or an array's items, one per line, indented a level deeper.
  template <class WriteItem>
  static void write_items(std::string& out, int indent, int depth, char open, char close, size_t count,
                          WriteItem&& write_item) {
    out += open;
    if (count == 0) {
      out += close;
      return;
    }
    out += '\n';
    for (size_t i = 0; i < count; ++i) {
      out.append(static_cast<size_t>(indent * (depth + 1)), ' ');
      write_item(i);
      out += i + 1 < count ? ",\n" : "\n";
    }
    out.append(static_cast<size_t>(indent * depth), ' ');
    out += close;
  }

  Kind kind_;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0.0;
  std::string s_;
  std::vector<std::pair<std::string, Json>> members_;
  std::vector<Json> items_;
};

}  // namespace ringattn
