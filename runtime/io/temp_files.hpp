// The temporary files this process created and has neither renamed into place nor removed, so
// that a fatal signal can remove them before the process dies (launch/main.cpp). Outputs are
// written under a temporary name and renamed when complete (npy.hpp): a signal never leaves a
// file at the final path, and with this registry it leaves no temporary file either.
//
// add() and forget() are called by the code that creates and renames the files; remove_all() is
// async-signal-safe (atomics, unlink) and may run in a signal handler on any thread, at any time.
// Fixed capacity: a path that does not fit (more than kSlots files at once, or a path longer than
// kPathBytes) is simply not registered, and a signal leaves it behind as it would without this.
#pragma once

#include <cstddef>
#include <string>

namespace ringattn::temp_files {

inline constexpr size_t kSlots = 64;
inline constexpr size_t kPathBytes = 4096;

void add(const std::string& path);
void forget(const std::string& path);
// Unlinks every registered file; returns how many were registered.
int remove_all() noexcept;

}  // namespace ringattn::temp_files
