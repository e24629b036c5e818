// What ringattn throws (included by <ringattn/ringattn.hpp>). Two kinds reach a caller:
//
//   ArgumentError  a bad argument: nothing was computed and the context is still usable.
//   Fault          a peer died or stayed silent past the timeout, a device, transport or I/O
//                  error: end the job (the context is no longer usable).
//
// An ArgumentError names its arguments in the library's words, the C++ names of docs/reference.md
// ("kv_heads 3 must divide heads 8"). Its message is kept as a template with each argument name in
// braces ("{kv_heads} 3 must divide {heads} 8"), so that an interface that calls the arguments
// otherwise shows them in its own words: the command line its flags ("--kv-heads 3 must divide
// --heads 8"), Python its keywords and tensor shapes ("k.shape[2] 3 must divide q.shape[2] 8").
#pragma once

#include <algorithm>
#include <cctype>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ringattn {

class ArgumentError : public std::invalid_argument {
 public:
  // value: an argument holds a value the call cannot use; type: it has the wrong type or kind
  // (Python raises TypeError for these, ValueError for the others).
  enum class Kind { value, type };

  // `message` writes argument names in braces; `argument` is the one at fault, without braces.
  ArgumentError(std::string argument, std::string message, Kind kind = Kind::value)
      : std::invalid_argument(render_template(message, [](std::string_view name) { return std::string(name); })),
        argument_(std::move(argument)),
        template_(std::move(message)),
        kind_(kind) {}

  const std::string& argument() const { return argument_; }
  Kind kind() const { return kind_; }
  const std::string& message_template() const { return template_; }
  // The message with every {name} written as name_of(name); what() is render with the names as
  // they are.
  std::string render(const std::function<std::string(std::string_view)>& name_of) const {
    return render_template(template_, name_of);
  }

  // Writes each {name} of `text` as name_of(name); a brace that does not enclose a name (letters,
  // digits, '_' and '.', starting with a letter or '_') is text and stays as it is.
  static std::string render_template(std::string_view text,
                                     const std::function<std::string(std::string_view)>& name_of) {
    auto is_name = [](std::string_view s) {
      if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
      for (char c : s)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
      return true;
    };
    std::string out;
    out.reserve(text.size());
    size_t i = 0;
    while (i < text.size()) {
      const size_t open = text.find('{', i);
      const size_t close = open == text.npos ? open : text.find('}', open);
      if (close == text.npos) break;
      out.append(text.substr(i, open - i));
      const std::string_view name = text.substr(open + 1, close - open - 1);
      if (is_name(name)) {
        out.append(name_of(name));
        i = close + 1;
      } else {
        out.push_back('{');
        i = open + 1;
      }
    }
    out.append(text.substr(std::min(i, text.size())));
    return out;
  }

 private:
  std::string argument_;
  std::string template_;
  Kind kind_;
};

// A fault at run time that is not the caller's input (docs/reference.md "Exit codes": 4).
class Fault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ringattn
