// DynamicLibrary (common/dynamic_library.h): how herd opens cuBLASLt and
// NCCL at run time. A missing library is an answer with the candidates
// tried, not a crash; a present one gives its functions.
#include "common/dynamic_library.h"

#include <gtest/gtest.h>

namespace herd {
namespace {

TEST(DynamicLibrary, MissingLibrarySaysWhatWasTried) {
  DynamicLibrary lib("the test library", {"libherd_not_here.so.9", "/nonexistent/libherd_not_here.so.9"});
  std::string why;
  EXPECT_FALSE(lib.Available(&why));
  EXPECT_NE(why.find("the test library could not be loaded"), std::string::npos) << why;
  EXPECT_NE(why.find("/nonexistent/libherd_not_here.so.9"), std::string::npos) << why;
  EXPECT_EQ(lib.Symbol("anything"), nullptr);
}

TEST(DynamicLibrary, PresentLibraryGivesItsFunctions) {
  DynamicLibrary lib("libm", {"libherd_not_here.so.9", "libm.so.6"});
  ASSERT_TRUE(lib.Available());
  auto cosine = lib.Function<double (*)(double)>("cos");
  EXPECT_EQ(cosine(0.0), 1.0);
  EXPECT_EQ(lib.Symbol("herd_no_such_symbol"), nullptr);
  EXPECT_NE(lib.error().find("herd_no_such_symbol"), std::string::npos);
}

}  // namespace
}  // namespace herd
