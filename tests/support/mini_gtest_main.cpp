// main() of the test executables when GoogleTest is not available (see gtest_or_mini.hpp).
#include "tests/support/gtest_or_mini.hpp"

int main() { return mini_gtest::run_all(); }
