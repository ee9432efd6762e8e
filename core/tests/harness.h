#pragma once
// A minimal test harness for the C++ tests (no third-party framework: the
// build must work offline). TEST(name) registers a case; CHECK* record
// failures with file:line and keep going; main() runs all and returns 1 on any
// failure, or kSkipped (77, ctest's SKIP_RETURN_CODE) when every case skipped.

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace megalith_test {

constexpr int kSkipped = 77;

struct Case {
  const char* name;
  std::function<void()> body;
};

inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

inline int& failures() {
  static int n = 0;
  return n;
}

struct SkipCase {
  std::string why;
};

struct Register {
  Register(const char* name, std::function<void()> body) {
    registry().push_back({name, std::move(body)});
  }
};

inline int run_all() {
  int skipped = 0, ran = 0;
  for (auto& c : registry()) {
    int before = failures();
    try {
      c.body();
      ++ran;
      std::printf("[%s] %s\n", failures() == before ? "  OK  " : " FAIL ", c.name);
    } catch (const SkipCase& s) {
      ++skipped;
      std::printf("[ SKIP ] %s: %s\n", c.name, s.why.c_str());
    } catch (const std::exception& e) {
      ++failures();
      std::printf("[ FAIL ] %s: uncaught exception: %s\n", c.name, e.what());
    }
  }
  std::printf("%d passed, %d failed, %d skipped\n", ran - failures(), failures(), skipped);
  if (failures()) return 1;
  if (ran == 0 && skipped > 0) return kSkipped;
  return 0;
}

}  // namespace megalith_test

#define MEGALITH_TEST_CONCAT2(a, b) a##b
#define MEGALITH_TEST_CONCAT(a, b) MEGALITH_TEST_CONCAT2(a, b)
#define TEST(name)                                                                  \
  static void name();                                                               \
  static ::megalith_test::Register MEGALITH_TEST_CONCAT(register_, name)(#name, name); \
  static void name()

#define SKIP(why) throw ::megalith_test::SkipCase{why}

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      ++::megalith_test::failures();                                                  \
      std::printf("  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);          \
    }                                                                                 \
  } while (0)

#define CHECK_NEAR(a, b, rel)                                                         \
  do {                                                                                \
    double _a = (a), _b = (b);                                                        \
    if (!(std::fabs(_a - _b) <= (rel) * std::fmax(std::fabs(_b), 1e-30))) {           \
      ++::megalith_test::failures();                                                  \
      std::printf("  %s:%d: %s = %.9g, %s = %.9g (rel tol %g)\n", __FILE__, __LINE__, \
                  #a, _a, #b, _b, (double)(rel));                                     \
    }                                                                                 \
  } while (0)

#define CHECK_THROWS(expr, exception_type)                                            \
  do {                                                                                \
    bool _thrown = false;                                                             \
    try {                                                                             \
      expr;                                                                           \
    } catch (const exception_type&) {                                                 \
      _thrown = true;                                                                 \
    }                                                                                 \
    if (!_thrown) {                                                                   \
      ++::megalith_test::failures();                                                  \
      std::printf("  %s:%d: %s did not throw %s\n", __FILE__, __LINE__, #expr,        \
                  #exception_type);                                                   \
    }                                                                                 \
  } while (0)

#define MEGALITH_TEST_MAIN() \
  int main() { return ::megalith_test::run_all(); }
