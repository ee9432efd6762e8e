#include <string>

#include "harness.h"
#include "megalith/dtype.h"
#include "megalith/error.h"

TEST(messages_carry_location) {
  try {
    MEGALITH_FAIL(megalith::invalid_argument, "bad size ", 3);
  } catch (const std::invalid_argument& e) {  // catchable as the std type
    std::string what = e.what();
    CHECK(what.find("bad size 3") != std::string::npos);
    CHECK(what.find("test_errors.cpp:") != std::string::npos);
    return;
  }
  CHECK(false);
}

TEST(out_of_memory_is_bad_alloc) {
  try {
    throw megalith::out_of_memory("cannot allocate 4096 bytes of pinned host memory");
  } catch (const std::bad_alloc& e) {
    CHECK(std::string(e.what()).find("4096 bytes") != std::string::npos);
  }
}

TEST(dtype_names) {
  using megalith::DType;
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::u8, DType::i32, DType::i64}) {
    CHECK(megalith::dtype_from_name(megalith::dtype_name(t)) == t);
  }
  CHECK(megalith::dtype_size(DType::bf16) == 2);
  CHECK(megalith::dtype_size(DType::i64) == 8);
  CHECK_THROWS(megalith::dtype_from_name("complex64"), megalith::invalid_argument);
}

MEGALITH_TEST_MAIN()
