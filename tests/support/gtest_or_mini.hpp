// GoogleTest when the build has it; otherwise a tiny stand-in with the same macros, so that the
// GPU check builds its tests on a machine without GoogleTest (launch/gpu-check.sh). The
// stand-in covers what tests/kernels/cuda uses: TEST, EXPECT_/ASSERT_ TRUE, FALSE, EQ, NE, LE, LT,
// GE, GT, GTEST_SKIP, messages streamed with <<, tests registered at run time (register_test, for
// tables of cases), and a main() that runs every test and exits non-zero when one fails.
#pragma once

#include <functional>
#include <string>
#include <utility>

#if defined(RINGATTN_HAVE_GTEST)
#include <gtest/gtest.h>

namespace ringattn::testing {

// Registers SUITE.NAME, which runs `body` (before main() runs the tests: from a static initializer).
inline void register_test(const std::string& suite, const std::string& name, const char* file, int line,
                          std::function<void()> body) {
  class Body : public ::testing::Test {
   public:
    explicit Body(std::function<void()> f) : f_(std::move(f)) {}
    void TestBody() override { f_(); }

   private:
    std::function<void()> f_;
  };
  ::testing::RegisterTest(suite.c_str(), name.c_str(), nullptr, nullptr, file, line,
                          [body = std::move(body)]() -> ::testing::Test* { return new Body(body); });
}

}  // namespace ringattn::testing
#else

#include <cstdio>
#include <exception>
#include <sstream>
#include <vector>

namespace mini_gtest {

struct TestCase {
  std::string name;
  std::function<void()> body;
};

inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct State {
  bool failed = false;
  bool skipped = false;
};

inline State& state() {
  static State s;
  return s;
}

struct Registrar {
  Registrar(const char* suite, const char* name, void (*body)()) {
    registry().push_back({std::string(suite) + "." + name, body});
  }
};

class Message {
 public:
  template <class T>
  Message& operator<<(const T& x) {
    text_ << x;
    return *this;
  }
  std::string str() const { return text_.str(); }

 private:
  std::ostringstream text_;
};

// `helper = Message() << ...` reports once the message is complete (operator= binds last).
class FailureHelper {
 public:
  FailureHelper(const char* file, int line, std::string what) : file_(file), line_(line), what_(std::move(what)) {}
  void operator=(const Message& m) const {
    state().failed = true;
    std::printf("%s:%d: Failure\n%s\n%s\n", file_, line_, what_.c_str(), m.str().c_str());
  }

 private:
  const char* file_;
  int line_;
  std::string what_;
};

class SkipHelper {
 public:
  void operator=(const Message& m) const {
    state().skipped = true;
    std::printf("  skipped: %s\n", m.str().c_str());
  }
};

template <class A, class B>
std::string comparison(const char* op, const char* ea, const char* eb, const A& a, const B& b) {
  std::ostringstream s;
  s << "Expected: (" << ea << ") " << op << " (" << eb << "), actual: " << a << " vs " << b;
  return s.str();
}

inline int run_all() {
  int failed = 0, skipped = 0;
  for (const TestCase& t : registry()) {
    state() = State{};
    std::printf("[ RUN      ] %s\n", t.name.c_str());
    try {
      t.body();
    } catch (const std::exception& e) {
      state().failed = true;
      std::printf("unexpected exception: %s\n", e.what());
    }
    if (state().failed) ++failed;
    if (state().skipped && !state().failed) ++skipped;
    std::printf("%s %s\n",
                state().failed    ? "[  FAILED  ]"
                : state().skipped ? "[  SKIPPED ]"
                                  : "[       OK ]",
                t.name.c_str());
  }
  std::printf("[==========] %zu tests, %d failed, %d skipped\n", registry().size(), failed, skipped);
  std::printf("%s\n", failed ? "[  FAILED  ]" : "[  PASSED  ]");
  return failed ? 1 : 0;
}

}  // namespace mini_gtest

#define MINI_GTEST_CAT2(a, b) a##b
#define MINI_GTEST_CAT(a, b) MINI_GTEST_CAT2(a, b)
#define TEST(suite, name)                                                          \
  static void MINI_GTEST_CAT(suite##_##name, _body)();                             \
  static const ::mini_gtest::Registrar MINI_GTEST_CAT(suite##_##name, _registrar)( \
      #suite, #name, &MINI_GTEST_CAT(suite##_##name, _body));                      \
  static void MINI_GTEST_CAT(suite##_##name, _body)()

// (switch: as GoogleTest, so that an unbraced `if (x) EXPECT_...; else` binds as written.)
#define MINI_GTEST_CHECK(cond, text, on_fail) \
  switch (0)                                  \
  case 0:                                     \
  default:                                    \
    if (cond) {                               \
    } else                                    \
      on_fail ::mini_gtest::FailureHelper(__FILE__, __LINE__, text) = ::mini_gtest::Message()

#define MINI_GTEST_CMP(op, a, b, on_fail) \
  MINI_GTEST_CHECK((a)op(b), ::mini_gtest::comparison(#op, #a, #b, (a), (b)), on_fail)

#define EXPECT_TRUE(c) MINI_GTEST_CHECK(static_cast<bool>(c), "Expected true: " #c, )
#define EXPECT_FALSE(c) MINI_GTEST_CHECK(!static_cast<bool>(c), "Expected false: " #c, )
#define ASSERT_TRUE(c) MINI_GTEST_CHECK(static_cast<bool>(c), "Expected true: " #c, return )
#define ASSERT_FALSE(c) MINI_GTEST_CHECK(!static_cast<bool>(c), "Expected false: " #c, return )
#define EXPECT_EQ(a, b) MINI_GTEST_CMP(==, a, b, )
#define EXPECT_NE(a, b) MINI_GTEST_CMP(!=, a, b, )
#define EXPECT_LE(a, b) MINI_GTEST_CMP(<=, a, b, )
#define EXPECT_LT(a, b) MINI_GTEST_CMP(<, a, b, )
#define EXPECT_GE(a, b) MINI_GTEST_CMP(>=, a, b, )
#define EXPECT_GT(a, b) MINI_GTEST_CMP(>, a, b, )
#define ASSERT_EQ(a, b) MINI_GTEST_CMP(==, a, b, return )
#define ASSERT_NE(a, b) MINI_GTEST_CMP(!=, a, b, return )
#define ASSERT_LE(a, b) MINI_GTEST_CMP(<=, a, b, return )
#define ASSERT_LT(a, b) MINI_GTEST_CMP(<, a, b, return )
#define ASSERT_GE(a, b) MINI_GTEST_CMP(>=, a, b, return )
#define ASSERT_GT(a, b) MINI_GTEST_CMP(>, a, b, return )
#define GTEST_SKIP() return ::mini_gtest::SkipHelper() = ::mini_gtest::Message()

namespace ringattn::testing {

inline void register_test(const std::string& suite, const std::string& name, const char*, int,
                          std::function<void()> body) {
  ::mini_gtest::registry().push_back({suite + "." + name, std::move(body)});
}

}  // namespace ringattn::testing

#endif  // RINGATTN_HAVE_GTEST
