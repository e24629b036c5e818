#include "runtime/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "util/dtype.hpp"
#include "runtime/errors.hpp"
#include "runtime/io/json_reader.hpp"
#include "runtime/io/npy_file.hpp"

namespace ringattn {

using namespace npy_internal;

namespace {

// The format's own limit on the header (safetensors refuses larger ones too).
constexpr int64_t kMaxHeaderBytes = 100 << 20;
constexpr int64_t kBounceBytes = 1 << 20;

int64_t dtype_size(std::string_view dtype) {
  static const std::pair<std::string_view, int64_t> sizes[] = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2}, {"F16", 2},
      {"BF16", 2}, {"U32", 4}, {"I32", 4}, {"F32", 4},    {"U64", 8},     {"I64", 8}, {"F64", 8}};
  for (const auto& [name, size] : sizes)
    if (name == dtype) return size;
  return 0;
}

bool is_float_dtype(std::string_view dtype) { return dtype == "F32" || dtype == "F16" || dtype == "BF16"; }

// A JSON number that is an exact non-negative integer (below 2^53, where doubles are exact).
bool as_count(const JsonValue& v, int64_t* out) {
  if (!v.is_number()) return false;
  const double d = v.number();
  if (!(d >= 0.0) || d > 9007199254740992.0 || std::floor(d) != d) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

int64_t SafetensorsTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsTensor* SafetensorsInfo::find(const std::string& name) const {
  for (const SafetensorsTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsInfo parse_safetensors_header(std::string_view header, int64_t file_size, const std::string& path,
                                         const std::string& label) {
  const std::string where = where_of(label, path);
  const JsonValue root = parse_json(std::string(header), label, path);
  if (!root.is_object()) throw usage_error(where + "the safetensors header is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(header.size());
  const int64_t data_size = file_size - data_start;
  SafetensorsInfo info;
  info.path = path, info.label = label;
  for (const auto& [name, value] : root.members()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw usage_error(where + "__metadata__ must be an object of strings");
      for (const auto& [key, text] : value.members()) {
        if (!text.is_string()) throw usage_error(where + "__metadata__ \"" + key + "\" is not a string");
        info.metadata.emplace_back(key, text.text());
      }
      continue;
    }
    const std::string what = where + "tensor \"" + name + "\": ";
    if (info.find(name)) throw usage_error(what + "appears twice in the header");
    if (!value.is_object()) throw usage_error(what + "its entry is not an object");
    SafetensorsTensor t;
    t.name = name;
    const JsonValue* dtype = value.find("dtype");
    const JsonValue* shape = value.find("shape");
    const JsonValue* offsets = value.find("data_offsets");
    if (!dtype || !dtype->is_string() || dtype_size(dtype->text()) == 0)
      throw usage_error(what + "missing or unknown dtype");
    t.dtype = dtype->text();
    if (!shape || !shape->is_array()) throw usage_error(what + "missing shape");
    int64_t elements = 1;
    for (const JsonValue& d : shape->items()) {
      int64_t n = 0;
      if (!as_count(d, &n)) throw usage_error(what + "a shape entry is not a non-negative integer");
      if (__builtin_mul_overflow(elements, n, &elements)) throw usage_error(what + "shape too large");
      t.shape.push_back(n);
    }
    int64_t begin = 0, end = 0, expected = 0;
    if (!offsets || !offsets->is_array() || offsets->items().size() != 2 || !as_count(offsets->items()[0], &begin) ||
        !as_count(offsets->items()[1], &end))
      throw usage_error(what + "data_offsets must be [begin, end], two non-negative integers");
    if (end < begin) throw usage_error(what + "data_offsets end before they begin");
    if (end > data_size)
      throw usage_error(what + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                       ") run past the end of the data (" + std::to_string(data_size) +
                       " bytes; is the file truncated?)");
    if (__builtin_mul_overflow(elements, dtype_size(t.dtype), &expected) || expected != end - begin)
      throw usage_error(what + "holds " + std::to_string(end - begin) + " bytes, but shape " +
                       format_shape(t.shape) + " of " + t.dtype + " needs " + std::to_string(expected));
    t.offset = data_start + begin;
    t.bytes = end - begin;
    info.tensors.push_back(std::move(t));
  }
  std::sort(info.tensors.begin(), info.tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
  });
  for (size_t i = 1; i < info.tensors.size(); ++i) {
    const SafetensorsTensor &a = info.tensors[i - 1], &b = info.tensors[i];
    if (b.offset < a.offset + a.bytes)
      throw usage_error(where + "tensors \"" + a.name + "\" and \"" + b.name + "\" overlap in the data");
  }
  return info;
}

SafetensorsInfo inspect_safetensors(const std::string& path, const std::string& label) {
  const std::string where = where_of(label, path);
  int64_t size = 0;
  FileHandle file(open_input(path, &size, where));
  if (size < 8) throw usage_error(where + "too short for a safetensors file (" + std::to_string(size) + " bytes)");
  unsigned char prefix[8];
  pread_all(file.fd, prefix, 8, 0, where);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n > uint64_t(kMaxHeaderBytes) || int64_t(n) > size - 8)
    throw usage_error(where + "header length " + std::to_string(n) + " does not fit the file (" +
                     std::to_string(size) + " bytes): not a safetensors file, or truncated");
  std::string header(static_cast<size_t>(n), '\0');
  pread_all(file.fd, header.data(), int64_t(n), 8, where);
  return parse_safetensors_header(header, size, path, label);
}

const SafetensorsTensor& require_float_tensor(const SafetensorsInfo& file, const std::string& name,
                                              const std::vector<int64_t>& shape, const std::string& why) {
  const std::string what = where_of(file.label, file.path) + "tensor \"" + name + "\"";
  const SafetensorsTensor* t = file.find(name);
  if (!t) throw usage_error(what + " is missing");
  if (!is_float_dtype(t->dtype)) throw usage_error(what + ": dtype " + t->dtype + ", expected F32, F16 or BF16");
  if (t->shape != shape)
    throw usage_error(what + ": shape " + format_shape(t->shape) + ", expected " + format_shape(shape) + why);
  return *t;
}

void read_safetensors_rows(const SafetensorsInfo& file, const SafetensorsTensor& tensor, const RowSelection& rows,
                           float* out) {
  const std::string where = where_of(file.label, file.path) + "tensor \"" + tensor.name + "\": ";
  const int64_t word = dtype_size(tensor.dtype);
  if (!is_float_dtype(tensor.dtype)) throw usage_error(where + "dtype " + tensor.dtype + " is not a float type");
  int64_t size = 0;
  FileHandle fd(open_input(file.path, &size, where));
  if (size < tensor.offset + tensor.bytes) throw usage_error(where + "the file shrank since its header was read");
  std::vector<char> bounce;
  for_each_run(rows, tensor.elements(), where, [&](int64_t file_element, int64_t buffer_element, int64_t n) {
    float* dst = out + buffer_element;
    const int64_t at = tensor.offset + file_element * word;
    if (word == 4) {  // F32 (little-endian, as every host we build for)
      pread_all(fd.fd, dst, n * 4, at, where);
      return;
    }
    const int64_t chunk = kBounceBytes / word;
    for (int64_t done = 0; done < n; done += chunk) {
      const int64_t m = std::min(chunk, n - done);
      bounce.resize(static_cast<size_t>(m * word));
      pread_all(fd.fd, bounce.data(), m * word, at + done * word, where);
      for (int64_t i = 0; i < m; ++i) {
        uint16_t h;
        std::memcpy(&h, bounce.data() + 2 * i, 2);
        dst[done + i] = tensor.dtype == "F16" ? fp16_to_float(h) : bf16_to_float(h);
      }
    }
  });
}

std::string safetensors_header_bytes(const std::vector<SafetensorsEntry>& tensors,
                                     const std::vector<std::pair<std::string, std::string>>& metadata,
                                     std::vector<int64_t>* offsets) {
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i)
      json += (i ? ",\"" : "\"") + json_escape(metadata[i].first) + "\":\"" + json_escape(metadata[i].second) + "\"";
    json += "}";
  }
  int64_t at = 0;
  std::vector<int64_t> begins;
  for (const SafetensorsEntry& t : tensors) {
    int64_t n = 4;
    std::string shape;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d), n *= d;
    json += std::string(json.size() > 1 ? "," : "") + "\"" + json_escape(t.name) + "\":{\"dtype\":\"F32\",\"shape\":[" +
            shape + "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + n) + "]}";
    begins.push_back(at);
    at += n;
  }
  json += "}";
  while (json.size() % 8 != 0) json += ' ';
  std::string bytes(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  if (offsets) {
    offsets->clear();
    for (int64_t b : begins) offsets->push_back(8 + int64_t(n) + b);
  }
  return bytes + json;
}

}  // namespace ringattn
