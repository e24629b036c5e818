// How sizes and shapes read in every message and summary: one spelling for the whole program.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ringattn {

// Binary units, as the summaries have always used: "512 B", "1.5 KiB", "12.3 MiB", "4.0 GiB".
std::string human_bytes(double bytes);

// A shape as Python writes a tuple: "(2, 1024, 8, 64)", "(7,)", "()". (The .npy header uses it too.)
std::string format_shape(const std::vector<int64_t>& shape);

}  // namespace ringattn
